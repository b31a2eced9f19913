/* HTTP/1.x request latency per service, without touching the server's code:
 * a request is the span from the first read that returns data on an accepted
 * connection (and starts like a request line) to the next write on it (the
 * response). Connections are tracked per (process, fd) from accept()/accept4()
 * by a watched task, so a request read in one thread and answered in another
 * still counts; close() forgets them. */

struct http_conn_key {
    u32 tgid;
    u32 fd;
};

struct http_conn {
    u64 request_at;      /* ns the request's first bytes were read, 0 between requests */
    u32 service;
    u32 checked;         /* the first bytes looked like a request line */
};

BPF_TABLE("lru_hash", struct http_conn_key, struct http_conn, http_conns, 65536);

struct http_read {
    u64 buf;             /* user buffer of read/recvfrom, 0 for readv/recvmsg */
    u32 fd;
    u32 pad;
};

BPF_TABLE("lru_hash", u32, struct http_read, http_reading, 16384);   /* tid -> read in flight */

static __always_inline int http_accepted(long fd)
{
    if (fd < 0)
        return 0;
    u32 *service = service_of_task(current_tid());
    if (!service)
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    struct http_conn c = {.request_at = 0, .service = *service, .checked = 0};
    http_conns.update(&k, &c);
    return 0;
}

static __always_inline int http_read_enter(u64 fd, u64 buf)
{
    if (!maybe_watched(current_tid()))
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    if (!http_conns.lookup(&k))
        return 0;
    u32 tid = current_tid();
    struct http_read r = {.buf = buf, .fd = (u32)fd};
    http_reading.update(&tid, &r);
    return 0;
}

static __always_inline int http_read_exit(long ret)
{
    u32 tid = current_tid();
    if (!maybe_watched(tid))
        return 0;
    struct http_read *r = http_reading.lookup(&tid);
    if (!r)
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = r->fd};
    u64 buf = r->buf;
    http_reading.delete(&tid);
    if (ret <= 0)
        return 0;
    struct http_conn *c = http_conns.lookup(&k);
    if (!c || c->request_at)
        return 0;
    /* A connection speaks HTTP/1.x if its first bytes are a method (GET, POST...):
     * an upper-case letter. TLS (0x16 handshake record) and other protocols are
     * dropped on their first read. */
    if (!c->checked && buf) {
        char first = 0;
        bpf_probe_read_user(&first, 1, (void *)buf);
        if (first < 'A' || first > 'Z') {
            http_conns.delete(&k);
            return 0;
        }
    }
    c->checked = 1;
    c->request_at = bpf_ktime_get_ns();
    return 0;
}

static __always_inline int http_write_enter(u64 fd)
{
    if (!maybe_watched(current_tid()))
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    struct http_conn *c = http_conns.lookup(&k);
    if (!c || c->request_at == 0)
        return 0;
    hist_add(c->service, SIG_HTTP_REQUEST, 0, bpf_ktime_get_ns() - c->request_at);
    c->request_at = 0;
    return 0;
}

/* The tls family reads the same syscalls (bpf/tls.bpf.c): one program per
 * tracepoint serves both. */
#ifdef FAMILY_TLS
#define TLS_ALSO(call) call
#else
#define TLS_ALSO(call)
#endif

int on_accept_exit(struct tracepoint__syscalls__sys_exit_accept *args)   { TLS_ALSO(tls_opened(args->ret, 1)); return http_accepted(args->ret); }
int on_accept4_exit(struct tracepoint__syscalls__sys_exit_accept4 *args) { TLS_ALSO(tls_opened(args->ret, 1)); return http_accepted(args->ret); }

int on_read_enter(struct tracepoint__syscalls__sys_enter_read *args) { TLS_ALSO(tls_io_enter(args->fd, (u64)args->buf, 0, TLS_READ)); return http_read_enter(args->fd, (u64)args->buf); }
int on_readv_enter(struct tracepoint__syscalls__sys_enter_readv *args) { TLS_ALSO(tls_io_enter(args->fd, (u64)args->vec, args->vlen, TLS_READ)); return http_read_enter(args->fd, 0); }
int on_recvfrom_enter(struct tracepoint__syscalls__sys_enter_recvfrom *args) { TLS_ALSO(tls_recv_enter(args->fd, (u64)args->ubuf, args->flags)); return http_read_enter(args->fd, (u64)args->ubuf); }
int on_recvmsg_enter(struct tracepoint__syscalls__sys_enter_recvmsg *args) { TLS_ALSO(tls_msg_enter(args->fd, (u64)args->msg, args->flags, TLS_READ)); return http_read_enter(args->fd, 0); }
int on_read_exit(struct tracepoint__syscalls__sys_exit_read *args)         { TLS_ALSO(tls_io_exit(args->ret)); return http_read_exit(args->ret); }
int on_readv_exit(struct tracepoint__syscalls__sys_exit_readv *args)       { TLS_ALSO(tls_io_exit(args->ret)); return http_read_exit(args->ret); }
int on_recvfrom_exit(struct tracepoint__syscalls__sys_exit_recvfrom *args) { TLS_ALSO(tls_io_exit(args->ret)); return http_read_exit(args->ret); }
int on_recvmsg_exit(struct tracepoint__syscalls__sys_exit_recvmsg *args)   { TLS_ALSO(tls_io_exit(args->ret)); return http_read_exit(args->ret); }

int on_write_enter(struct tracepoint__syscalls__sys_enter_write *args) { TLS_ALSO(tls_io_enter(args->fd, (u64)args->buf, 0, TLS_WRITE)); return http_write_enter(args->fd); }
int on_writev_enter(struct tracepoint__syscalls__sys_enter_writev *args) { TLS_ALSO(tls_io_enter(args->fd, (u64)args->vec, args->vlen, TLS_WRITE)); return http_write_enter(args->fd); }
int on_sendto_enter(struct tracepoint__syscalls__sys_enter_sendto *args) { TLS_ALSO(tls_io_enter(args->fd, (u64)args->buff, 0, TLS_WRITE)); return http_write_enter(args->fd); }
int on_sendmsg_enter(struct tracepoint__syscalls__sys_enter_sendmsg *args) { TLS_ALSO(tls_msg_enter(args->fd, (u64)args->msg, args->flags, TLS_WRITE)); return http_write_enter(args->fd); }
int on_sendfile_enter(struct tracepoint__syscalls__sys_enter_sendfile64 *args) { return http_write_enter(args->out_fd); }

int on_close_enter(struct tracepoint__syscalls__sys_enter_close *args)
{
    TLS_ALSO(tls_closed(args->fd));
    if (!maybe_watched(current_tid()))
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)args->fd};
    http_conns.delete(&k);
    return 0;
}
