/* Run-queue wait per service: the time a watched task spends runnable but not
 * running, from its wake-up (sched_wakeup, sched_wakeup_new) or involuntary
 * switch-out (sched_switch with a runnable prev_state) to being switched in. */

BPF_TABLE("lru_hash", u32, u64, runqueue_since, MAX_RUNQUEUE_SINCE);   /* tid -> enqueued at, ns */

static __always_inline int runqueue_enqueue(u32 tid)
{
    if (!service_of_task(tid))
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (!runqueue_since.insert(&tid, &now)) {
        lru_inserted(LRU_RUNQUEUE_SINCE);
        return 0;
    }
    u64 *since = runqueue_since.lookup(&tid);   /* a switch-in it missed left it there */
    if (since)
        *since = now;
    return 0;
}

#if SCHED_TASK_PID_OFF >= 0
int on_sched_wakeup(struct bpf_raw_tracepoint_args *ctx)       /* (p) */
{
    return runqueue_enqueue(task_tid(ctx->args[0]));
}

int on_sched_wakeup_new(struct bpf_raw_tracepoint_args *ctx)   /* (p) */
{
    return runqueue_enqueue(task_tid(ctx->args[0]));
}
#endif

/* sched_switch's hook (hooks.py). */
static __always_inline void runqueue_switch(struct sched_switch *s)
{
    /* Preempted, or no sleeping state bit (0xff) set, as the tracepoint reports
     * it: still runnable (preempted or yielded). */
    if (s->preempted || (s->prev_state & 0xff) == 0)
        runqueue_enqueue(s->prev);
    u32 next = s->next;
    if (!maybe_watched(next))
        return;
    u64 *since = runqueue_since.lookup(&next);
    if (!since)
        return;
    u64 waited = bpf_ktime_get_ns() - *since;
    if (!runqueue_since.delete(&next))
        lru_deleted(LRU_RUNQUEUE_SINCE);
    u32 *service = service_of_task(next);
    if (service)
        hist_add(*service, SIG_RUNQUEUE_WAIT, 0, waited);
}
