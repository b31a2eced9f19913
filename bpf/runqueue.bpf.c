/* Run-queue wait per service: the time a watched task spends runnable but not
 * running, from its wake-up (sched_wakeup, sched_wakeup_new) or involuntary
 * switch-out (sched_switch with a runnable prev_state) to being switched in. */

BPF_TABLE("lru_hash", u32, u64, runqueue_since, 16384);   /* tid -> enqueued at, ns */

static __always_inline int runqueue_enqueue(u32 tid)
{
    if (!service_of_task(tid))
        return 0;
    u64 now = bpf_ktime_get_ns();
    runqueue_since.update(&tid, &now);
    return 0;
}

int on_sched_wakeup(struct tracepoint__sched__sched_wakeup *args)
{
    return runqueue_enqueue(args->pid);
}

int on_sched_wakeup_new(struct tracepoint__sched__sched_wakeup_new *args)
{
    return runqueue_enqueue(args->pid);
}

static __always_inline void runqueue_switch(u32 prev, long prev_state, u32 next)
{
    /* TASK_REPORT bits (0xff) clear: still runnable, i.e. preempted or yielded. */
    if ((prev_state & 0xff) == 0)
        runqueue_enqueue(prev);
    if (!maybe_watched(next))
        return;
    u64 *since = runqueue_since.lookup(&next);
    if (!since)
        return;
    u64 waited = bpf_ktime_get_ns() - *since;
    runqueue_since.delete(&next);
    u32 *service = service_of_task(next);
    if (service)
        hist_add(*service, SIG_RUNQUEUE_WAIT, 0, waited);
}

#ifndef FAMILY_OFFCPU
/* With the offcpu family, its sched_switch program calls runqueue_switch (bpf/offcpu.bpf.c). */
int on_sched_switch(struct tracepoint__sched__sched_switch *args)
{
    runqueue_switch(args->prev_pid, args->prev_state, args->next_pid);
    return 0;
}
#endif
