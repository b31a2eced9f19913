/* Keeps the watched-task map current between user-space rescans: a task forked
 * (process or thread) by a watched task joins its service; an exiting task leaves. (Hint slots are
 * cleared by user space, which knows which tids still share them.)
 * User space (daemon/collectors/kernel/targeting.py) seeds the map with the threads of every
 * matched process and adds new matches each interval. */

int on_process_fork(struct tracepoint__sched__sched_process_fork *args)
{
    u32 *service = service_of_task(args->parent_pid);
    if (!service)
        return 0;
    u32 child = args->child_pid;
    u32 id = *service;
    if (watched.update(&child, &id))
        map_full_add(MAP_WATCHED);   /* full: the child goes unwatched */
    u32 slot = child & (HINT_SLOTS - 1), one = 1;
    watched_hint.update(&slot, &one);
    return 0;
}

int on_process_exit(struct tracepoint__sched__sched_process_exit *args)
{
    u32 tid = args->pid;
    if (maybe_watched(tid))
        watched.delete(&tid);
    return 0;
}
