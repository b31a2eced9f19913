/* TLS per service from uprobes on libssl: handshake latency and count
 * (SSL_do_handshake, from its first call on an SSL object to the call that
 * returns 1, so non-blocking retries count once), and calls and bytes of
 * SSL_read/SSL_write and their _ex forms. User space attaches these to every
 * libssl its targets map (/proc/<pid>/maps); only watched tasks are counted. */

struct tls_call {
    u64 ssl;
    u64 out_len;         /* size_t * of the _ex forms, 0 for SSL_read/SSL_write */
    u32 direction;       /* TLS_READ or TLS_WRITE */
};

BPF_TABLE("lru_hash", u64, u64, tls_handshake_since, 16384);   /* SSL* -> first call, ns */
BPF_TABLE("lru_hash", u32, u64, tls_handshake_ssl, 16384);     /* tid -> SSL* in flight */
BPF_TABLE("lru_hash", u32, struct tls_call, tls_calls, 16384); /* tid -> read/write in flight */

int on_ssl_handshake(struct pt_regs *ctx)
{
    u32 tid = current_tid();
    if (!service_of_task(tid))
        return 0;
    u64 ssl = PT_REGS_PARM1(ctx);
    u64 now = bpf_ktime_get_ns();
    tls_handshake_since.lookup_or_try_init(&ssl, &now);
    tls_handshake_ssl.update(&tid, &ssl);
    return 0;
}

int on_ssl_handshake_return(struct pt_regs *ctx)
{
    u32 tid = current_tid();
    if (!maybe_watched(tid))
        return 0;
    u64 *ssl = tls_handshake_ssl.lookup(&tid);
    if (!ssl)
        return 0;
    u64 key = *ssl;
    tls_handshake_ssl.delete(&tid);
    if ((int)PT_REGS_RC(ctx) != 1)
        return 0;                   /* not done yet (WANT_READ/WRITE) or failed */
    u64 *since = tls_handshake_since.lookup(&key);
    u32 *service = service_of_task(tid);
    if (since && service)
        hist_add(*service, SIG_TLS_HANDSHAKE, 0, bpf_ktime_get_ns() - *since);
    tls_handshake_since.delete(&key);
    return 0;
}

static __always_inline int tls_enter(struct pt_regs *ctx, u32 direction, u64 out_len)
{
    u32 tid = current_tid();
    if (!service_of_task(tid))
        return 0;
    struct tls_call call = {.ssl = PT_REGS_PARM1(ctx), .out_len = out_len, .direction = direction};
    tls_calls.update(&tid, &call);
    return 0;
}

static __always_inline int tls_return(struct pt_regs *ctx)
{
    u32 tid = current_tid();
    if (!maybe_watched(tid))
        return 0;
    struct tls_call *call = tls_calls.lookup(&tid);
    if (!call)
        return 0;
    struct tls_call c = *call;
    tls_calls.delete(&tid);
    long rc = (int)PT_REGS_RC(ctx);
    u64 bytes = 0;
    if (c.out_len) {
        if (rc != 1)
            return 0;
        bpf_probe_read_user(&bytes, sizeof(bytes), (void *)c.out_len);
    } else {
        if (rc <= 0)
            return 0;
        bytes = rc;
    }
    u32 *service = service_of_task(tid);
    if (!service)
        return 0;
    count_add(*service, SIG_TLS_CALLS, c.direction, 1);
    count_add(*service, SIG_TLS_BYTES, c.direction, bytes);
    return 0;
}

int on_ssl_read(struct pt_regs *ctx)     { return tls_enter(ctx, TLS_READ, 0); }
int on_ssl_write(struct pt_regs *ctx)    { return tls_enter(ctx, TLS_WRITE, 0); }
int on_ssl_read_ex(struct pt_regs *ctx)  { return tls_enter(ctx, TLS_READ, PT_REGS_PARM4(ctx)); }
int on_ssl_write_ex(struct pt_regs *ctx) { return tls_enter(ctx, TLS_WRITE, PT_REGS_PARM4(ctx)); }
int on_ssl_call_return(struct pt_regs *ctx) { return tls_return(ctx); }
