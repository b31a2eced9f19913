/* Programs started per service: one count per successful execve() by a watched
 * task (sched:sched_process_exec fires once the new program is in place). A
 * child forked by a service is watched from its fork (bpf/targeting.bpf.c), so
 * a helper the service runs per request counts as the service's. */

int on_process_exec(struct tracepoint__sched__sched_process_exec *args)
{
    /* old_pid: the task's id before the exec. A thread that execs takes its
     * process's id, whose task has already left the watched map. */
    u32 *service = service_of_task(args->old_pid);
    if (service)
        count_add(*service, SIG_PROCESS_EXECS, 0, 1);
    return 0;
}
