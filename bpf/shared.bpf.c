/* The programs on the attach points several families read (hooks.py): each
 * calls its point's dispatcher, which the program builder generates from the
 * enabled families' hooks; a program is built only where some family hooks its
 * point (HOOK_<POINT>). sched_process_exec's is slotune's own
 * (bpf/targeting.bpf.c). */

#if defined(HOOK_SCHED_SWITCH) && SCHED_TASK_PID_OFF >= 0
int on_sched_switch(struct bpf_raw_tracepoint_args *ctx)
{
    struct sched_switch s = sched_switch_of(ctx);
    hook_sched_switch(&s);
    return 0;
}
#endif

#ifdef HOOK_SOCK_RECEIVED
SOCK_PROGRAMS
#endif
