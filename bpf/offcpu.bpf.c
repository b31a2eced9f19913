/* Blocking time per service and syscall class: the duration of every syscall a
 * watched task makes (raw_syscalls enter -> exit), classed by syscall number into
 * a few bounded labels (OFFCPU_* ids generated from the Python table). */

struct syscall_entered {
    u64 at;
    u32 class_id;
};

BPF_TABLE("lru_hash", u32, struct syscall_entered, syscall_since, 16384);   /* tid -> entry */

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

int on_sys_enter(struct tracepoint__raw_syscalls__sys_enter *args)
{
    u32 tid = current_tid();
    if (!service_of_task(tid))
        return 0;
    struct syscall_entered e = {.at = bpf_ktime_get_ns(), .class_id = syscall_class(args->id)};
    syscall_since.update(&tid, &e);
    return 0;
}

int on_sys_exit(struct tracepoint__raw_syscalls__sys_exit *args)
{
    u32 tid = current_tid();
    if (!maybe_watched(tid))
        return 0;
    struct syscall_entered *e = syscall_since.lookup(&tid);
    if (!e)
        return 0;
    u64 took = bpf_ktime_get_ns() - e->at;
    u32 class_id = e->class_id;
    syscall_since.delete(&tid);
    u32 *service = service_of_task(tid);
    if (service)
        hist_add(*service, SIG_OFFCPU, class_id, took);
    return 0;
}
