/* Keeps the watched-task map current between user-space rescans: a task forked
 * (process or thread) by a watched task joins its service; an exiting task leaves.
 * User space (daemon/targeting.py) seeds the map with the threads of every
 * matched process and adds new matches each interval. */

int on_process_fork(struct tracepoint__sched__sched_process_fork *args)
{
    u32 parent = args->parent_pid;
    u32 *service = watched.lookup(&parent);
    if (!service)
        return 0;
    u32 child = args->child_pid;
    u32 id = *service;
    watched.update(&child, &id);
    return 0;
}

int on_process_exit(struct tracepoint__sched__sched_process_exit *args)
{
    u32 tid = args->pid;
    watched.delete(&tid);
    return 0;
}
