/* Off-CPU time per service and syscall class, from the scheduler as BCC's
 * offcputime measures it: when a watched task leaves the CPU blocked
 * (sched_switch with a sleeping or stopped prev_state) inside a syscall, the
 * time and the syscall's class (OFFCPU_* ids generated from the Python table)
 * are kept; when it is switched back in, the time it was away (its wait plus
 * its run-queue wait after the wake-up) goes into that class's histogram. One
 * observation per time a syscall blocked; a syscall that returns without
 * blocking costs nothing, and no program runs on any syscall. The syscall in
 * progress is read from the task's saved user registers (bpf/common.h
 * current_syscall).
 * A task preempted on its way to sleep (its state already set) counts as
 * blocked too: sched_switch, attached raw, hands over the task's state as it
 * left, whether or not it was preempted (bpf/common.h sched_switch_of); else a
 * sleep whose timer fired while it was preempted would never be seen. */

struct offcpu_left {
    u64 at;              /* ns it was switched out */
    u32 service;
    u32 class_id;
};

BPF_TABLE("lru_hash", u32, struct offcpu_left, offcpu_since, MAX_OFFCPU_SINCE);   /* tid -> blocked since */

#define OFFCPU_BLOCKED 0x0f   /* TASK_INTERRUPTIBLE, _UNINTERRUPTIBLE, __TASK_STOPPED, __TASK_TRACED */

static __always_inline u32 syscall_class(long nr)
{
    switch (nr) {
#if defined(__x86_64__)
    case 44: case 45: case 46: case 47: case 299: case 307:        /* sendto recvfrom sendmsg recvmsg recvmmsg sendmmsg */
        return OFFCPU_NET;
    case 7: case 23: case 232: case 270: case 271: case 281: case 441:  /* poll select epoll_wait pselect6 ppoll epoll_pwait epoll_pwait2 */
        return OFFCPU_POLL;
    case 202: case 449:                                            /* futex futex_waitv */
        return OFFCPU_FUTEX;
    case 42: case 43: case 288:                                    /* connect accept accept4 */
        return OFFCPU_CONNECT;
    case 35: case 230:                                             /* nanosleep clock_nanosleep */
        return OFFCPU_SLEEP;
    case 0: case 1: case 17: case 18: case 19: case 20:            /* read write pread64 pwrite64 readv writev */
    case 295: case 296: case 327: case 328:                        /* preadv pwritev preadv2 pwritev2 */
    case 74: case 75: case 277:                                    /* fsync fdatasync sync_file_range */
        return OFFCPU_IO;
#elif defined(__aarch64__)
    case 206: case 207: case 211: case 212: case 243: case 269:
        return OFFCPU_NET;
    case 22: case 72: case 73: case 441:
        return OFFCPU_POLL;
    case 98: case 449:
        return OFFCPU_FUTEX;
    case 202: case 203: case 242:
        return OFFCPU_CONNECT;
    case 101: case 115:
        return OFFCPU_SLEEP;
    case 63: case 64: case 65: case 66: case 67: case 68:
    case 69: case 70: case 286: case 287:
    case 82: case 83: case 84:
        return OFFCPU_IO;
#endif
    default:
        return OFFCPU_OTHER;
    }
}

/* prev blocked: keep when and in what (a new key, counted; one a switch-in missed
 * left there is written over). */
static __always_inline void offcpu_blocked(u32 prev, struct offcpu_left *e)
{
    if (!offcpu_since.insert(&prev, e)) {
        lru_inserted(LRU_OFFCPU_SINCE);
        return;
    }
    struct offcpu_left *old = offcpu_since.lookup(&prev);
    if (old)
        *old = *e;
}

/* sched_switch's hook (hooks.py). */
static __always_inline void offcpu_switch(struct sched_switch *s)
{
    u32 prev = s->prev, next = s->next;
    u32 *service = service_of_task(prev);       /* prev is the current task */
    if (service && (s->prev_state & OFFCPU_BLOCKED)) {
        long nr = current_syscall(current_regs());
        if (nr >= 0) {
            struct offcpu_left e = {.at = bpf_ktime_get_ns(), .service = *service,
                                    .class_id = syscall_class(nr)};
            offcpu_blocked(prev, &e);
        }
    }
    if (!maybe_watched(next))
        return;
    struct offcpu_left *e = offcpu_since.lookup(&next);
    if (!e)
        return;
    struct offcpu_left left = *e;
    if (!offcpu_since.delete(&next))
        lru_deleted(LRU_OFFCPU_SINCE);
    hist_add(left.service, SIG_OFFCPU, left.class_id, bpf_ktime_get_ns() - left.at);
}
