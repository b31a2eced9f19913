/* Keeps the watched-task map current between user-space rescans: a task forked
 * (process or thread) by a watched task joins its service; an exiting task leaves. (Hint slots are
 * cleared by user space, which knows which tids still share them.)
 * User space (daemon/collectors/kernel/targeting.py) seeds the map with the threads of every
 * matched process and adds new matches each interval. A program exec'd by a task no service
 * owns is sent to user space at once (daemon/collectors/kernel/arrivals.py), which watches it
 * there and then if it is a service's: a service started after slotune counts from its start. */

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

/* Process ids of programs just exec'd by unwatched tasks (a full buffer drops them:
 * the next rescan finds those), from sched:sched_process_exec attached raw
 * (args: the task, its id before the exec, the binprm), which fires once the new
 * program is in place: no program runs on any syscall. Families hook the same
 * program (the exec family counts the execs of watched tasks). */
BPF_RINGBUF_OUTPUT(execs, 8);

int on_process_exec(struct bpf_raw_tracepoint_args *ctx)
{
    hook_process_exec((u32)ctx->args[1]);      /* the families' (hooks.py): exec's count */
    if (service_of_task(current_tid()))
        return 0;                  /* already its service's since its fork */
    u32 pid = current_tgid();
    execs.ringbuf_output(&pid, sizeof(pid), 0);
    return 0;
}
