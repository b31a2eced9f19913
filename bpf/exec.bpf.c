/* Programs started per service: one count per successful execve() by a watched
 * task (sched:sched_process_exec, whose program in bpf/targeting.bpf.c runs for
 * every exec and calls this, its hook there). A child forked by a service is
 * watched from its fork (bpf/targeting.bpf.c), so a helper the service runs per
 * request counts as the service's. */

static __always_inline void exec_count(u32 old_pid)
{
    /* old_pid: the task's id before the exec. A thread that execs takes its
     * process's id, whose task has already left the watched map. */
    u32 *service = service_of_task(old_pid);
    if (service)
        count_add(*service, SIG_PROCESS_EXECS, 0, 1);
}
