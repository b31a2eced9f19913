/* HTTP/1.x per service, without touching the server's code. Connections are
 * tracked per (process, fd) from accept()/accept4() by a watched task, so a
 * request read in one thread and answered in another still counts. A request
 * starts at the first read that returns data (on a new connection, only if it
 * starts like a request line); its response is every write after that, until
 * the next request's read, end of file or close(). Per response:
 *   http_status/<class>  its status line's class ("HTTP/1.1 404" -> 4xx), read
 *                        from its first write, which must be one (a 1xx interim
 *                        response is skipped; a connection that answers with
 *                        anything else is forgotten);
 *   http_first_byte      request to the first write of body bytes: a write that
 *                        holds only the header block (ends in CRLF CRLF) waits
 *                        for the next, as a streaming server sends its headers
 *                        before its first token; a response with no body gets
 *                        its header write;
 *   http_write_gap       each gap between two body writes (chunks, SSE events,
 *                        tokens); a write of the chunked terminator alone
 *                        ("0\r\n\r\n", by write() or a one-iovec writev()) ends
 *                        the body and is no chunk;
 *   http_request         request to the response's last write (the whole
 *                        response), recorded when the response is over;
 *   http_refused/<code>  the same time again for a response that sent the client
 *                        away, 429 or 503 (HTTP_TOO_MANY_REQUESTS,
 *                        HTTP_SERVICE_UNAVAILABLE): a limit_req, a queue timeout.
 * Per request, as it is read: http_arrived counts it (answered or not yet, so a
 * stalled server's arrivals are counted as they come, not when it answers).
 * That count and the status classes' are kept in per-CPU arrays by service id
 * (the first 1023 ids), whose lookups the JIT inlines: no hash and no atomic on
 * the hot path; user space sums the CPUs' slots.
 * Every program runs at a syscall's exit and reads what the call was given from
 * the task's registers (current_call_args), so a read or a write is one program
 * run and one lookup of its connection: no program on the syscall's entry and no
 * per-task map between the two. Times are taken at those exits: a write counts
 * once the kernel has its bytes. Only a response's first write reads its bytes
 * (12 at the start, 4 at the end), and a 5-byte write or a one-iovec writev() 5
 * more. */

#define HTTP_STATUS_LINE 12              /* "HTTP/1.1 200" */
#define HTTP_HEADER_END 0x0a0d0a0d       /* "\r\n\r\n" read as a little-endian u32 */
#define HTTP_LAST_CHUNK 0x0a0d0a0d30ULL  /* "0\r\n\r\n" read as a little-endian u64, 5 bytes */
#define HTTP_MAX_IOV 1024                /* UIO_MAXIOV */

struct http_conn_key {
    u32 tgid;
    u32 fd;
};

struct http_conn {
    u64 request_at;      /* ns the request's first bytes were read, 0 between requests */
    u64 header_at;       /* ns of a write that held only the header block */
    u64 first_byte_at;   /* ns of the response's first body write */
    u64 last_write_at;   /* ns of its latest write; 0 until it has one */
    u32 service;
    u8 checked;          /* the first bytes looked like a request line */
    u8 spoke;            /* it has answered with an HTTP/1.x status line: no TLS connection */
    u16 refused;         /* the response's status if it is a refusal (429, 503), else 0 */
};

BPF_TABLE("lru_hash", struct http_conn_key, struct http_conn, http_conns, 65536);
/* Counters by service id in per-CPU arrays, no hash and no atomic (see above). */
BPF_PERCPU_ARRAY(http_arrived, u64, HTTP_SERVICE_IDS);                       /* requests read */
BPF_PERCPU_ARRAY(http_statuses, u64, HTTP_SERVICE_IDS * HTTP_CLASS_SLOTS);   /* responses by status class */

static __always_inline void http_arrived_add(u32 service)
{
    u64 *n = http_arrived.lookup(&service);
    if (n)
        (*n)++;
}

static __always_inline void http_status_add(u32 service, u32 status)
{
    u32 slot = service * HTTP_CLASS_SLOTS + status / 100;
    u64 *n = http_statuses.lookup(&slot);
    if (n)
        (*n)++;
}

/* How a write syscall hands over its bytes. */
#define HTTP_BUF 0       /* write, sendto: buf, len */
#define HTTP_IOV 1       /* writev: iovec array, count */
#define HTTP_MSG 2       /* sendmsg: struct user_msghdr */
#define HTTP_FILE 3      /* sendfile: body bytes from a file */

static __always_inline int http_accepted(long fd)
{
    if (fd < 0)
        return 0;
    u32 *service = service_of_task(current_tid());
    if (!service)
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    struct http_conn c = {.service = *service};
    http_conns.update(&k, &c);
    return 0;
}

/* The response on c is over (the next request came, end of file, close):
 * record what only its end knows and wait for the next request. */
static __always_inline void http_response_over(struct http_conn *c)
{
    if (c->request_at && c->last_write_at) {
        if (!c->first_byte_at && c->header_at)
            hist_add(c->service, SIG_HTTP_FIRST_BYTE, 0, c->header_at - c->request_at);
        hist_add(c->service, SIG_HTTP_REQUEST, 0, c->last_write_at - c->request_at);
        if (c->refused)
            hist_add(c->service, SIG_HTTP_REFUSED, c->refused, c->last_write_at - c->request_at);
    }
    c->request_at = 0;
    c->header_at = 0;
    c->first_byte_at = 0;
    c->last_write_at = 0;
    c->refused = 0;
}

/* The state of the current process's connection on fd, or 0 when it is no
 * HTTP/1.x connection a watched task accepted. */
static __always_inline struct http_conn *http_conn_of(u64 fd)
{
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    return http_conns.lookup(&k);
}

/* A read of `ret` bytes returned on fd, whose state is c (http_conn_of); buf is
 * where they went (0 for readv, recvmsg: their first byte is not checked). */
static __always_inline int http_read_done(struct http_conn *c, long ret, u64 fd, u64 buf)
{
    if (ret < 0 || !c)
        return 0;
    if (ret == 0 || c->last_write_at) {          /* end of file, or the next request */
        http_response_over(c);
        if (ret == 0)
            return 0;
    } else if (c->request_at) {
        return 0;                                /* more of the same request */
    }
    /* A connection speaks HTTP/1.x if its first bytes are a method (GET, POST...):
     * an upper-case letter. TLS (0x16 handshake record) and other protocols are
     * dropped on their first read. */
    if (!c->checked && buf) {
        char first = 0;
        bpf_probe_read_user(&first, 1, (void *)buf);
        if (first < 'A' || first > 'Z') {
            struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
            http_conns.delete(&k);
            return 0;
        }
    }
    c->checked = 1;
    c->request_at = bpf_ktime_get_ns();
    http_arrived_add(c->service);
    return 0;
}

/* The first and the last segment of a write's bytes: {base, len} each. */
static __always_inline void http_segments(u32 how, u64 buf, u64 len, u64 first[2], u64 last[2])
{
    if (how == HTTP_BUF) {
        first[0] = last[0] = buf;
        first[1] = last[1] = len;
        return;
    }
    if (how == HTTP_MSG) {
        u64 iov[2] = {};
        msghdr_iov(buf, iov);
        buf = iov[0];
        len = iov[1];
    }
    if (len == 0 || len > HTTP_MAX_IOV)
        return;
    if (len <= 2) {                              /* the usual case: one read for both */
        u64 iov[4] = {};
        bpf_probe_read_user(iov, len == 1 ? 2 * sizeof(u64) : 4 * sizeof(u64), (void *)buf);
        first[0] = iov[0];
        first[1] = iov[1];
        last[0] = iov[len == 1 ? 0 : 2];
        last[1] = iov[len == 1 ? 1 : 3];
        return;
    }
    bpf_probe_read_user(first, 2 * sizeof(u64), (void *)buf);
    bpf_probe_read_user(last, 2 * sizeof(u64), (void *)(buf + (len - 1) * 2 * sizeof(u64)));
}

/* A response's first write: its status code (100 to 599), or 0 if it is no
 * HTTP/1.x status line; *headers_only when the write ends with the header block. */
static __always_inline u32 http_status(u32 how, u64 buf, u64 len, int *headers_only)
{
    u64 first[2] = {}, last[2] = {};
    http_segments(how, buf, len, first, last);
    char line[HTTP_STATUS_LINE] = {};
    if (first[1] < HTTP_STATUS_LINE || bpf_probe_read_user(line, sizeof(line), (void *)first[0]))
        return 0;
    if (line[0] != 'H' || line[1] != 'T' || line[2] != 'T' || line[3] != 'P' || line[4] != '/'
        || line[5] != '1' || line[6] != '.' || line[8] != ' ' || line[9] < '1' || line[9] > '5'
        || line[10] < '0' || line[10] > '9' || line[11] < '0' || line[11] > '9')
        return 0;
    u32 end = 0;
    if (last[1] >= 4)
        bpf_probe_read_user(&end, sizeof(end), (void *)(last[0] + last[1] - 4));
    *headers_only = end == HTTP_HEADER_END;
    return (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
}

/* Is this write the chunked terminator alone? Only a 5-byte write(), or a
 * writev() of one iovec (nginx's last flush), is read to see. */
static __always_inline int http_last_chunk(u32 how, u64 buf, u64 len)
{
    u64 seg[2] = {buf, len};
    if (how == HTTP_IOV && len == 1)
        bpf_probe_read_user(seg, sizeof(seg), (void *)buf);
    else if (how != HTTP_BUF)
        return 0;
    u64 chunk = 0;
    if (seg[1] != 5 || bpf_probe_read_user(&chunk, 5, (void *)seg[0]))
        return 0;
    return chunk == HTTP_LAST_CHUNK;
}

/* A write of `ret` bytes returned on fd, whose state is c (http_conn_of), handed
 * over as `how` says (buf, len). */
static __always_inline int http_write_done(struct http_conn *c, long ret, u64 fd, u32 how, u64 buf, u64 len)
{
    if (ret <= 0 || !c || c->request_at == 0)
        return 0;
    struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    u64 now = bpf_ktime_get_ns();
    if (!c->last_write_at && how != HTTP_FILE) {
        int headers_only = 0;
        u32 status = http_status(how, buf, len, &headers_only);
        if (status == 0) {                       /* not an HTTP/1.x server after all */
            http_conns.delete(&k);
            return 0;
        }
        c->spoke = 1;
        if (status < 200)                        /* 100 Continue and the like: the answer comes later */
            return 0;
        http_status_add(c->service, status);
        if (status == HTTP_TOO_MANY_REQUESTS || status == HTTP_SERVICE_UNAVAILABLE)
            c->refused = status;
        c->last_write_at = now;
        if (headers_only) {
            c->header_at = now;
            return 0;
        }
    } else if (http_last_chunk(how, buf, len)) {
        c->last_write_at = now;
        return 0;
    }
    if (!c->first_byte_at) {
        c->first_byte_at = now;
        hist_add(c->service, SIG_HTTP_FIRST_BYTE, 0, now - c->request_at);
    } else {
        hist_add(c->service, SIG_HTTP_WRITE_GAP, 0, now - c->last_write_at);
    }
    c->last_write_at = now;
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

/* The reads and writes (a.arg: fd; buffer, iovec array or msghdr; length,
 * iovec count or flags; recvfrom's flags). A connection that has answered with
 * an HTTP/1.x status line is no TLS one: the tls family's hook is skipped for it,
 * one lookup less on each of its reads and writes. */
#define HTTP_EXIT(call, http_hook)                                                \
ON_SYSCALL_EXIT(call, struct http_conn *c = http_conn_of(a.arg[0]);               \
                if (!c || !c->spoke) { TLS_ALSO(TLS_EXIT_##call(args->ret, a)); } http_hook)

HTTP_EXIT(read, http_read_done(c, args->ret, a.arg[0], a.arg[1]))
HTTP_EXIT(readv, http_read_done(c, args->ret, a.arg[0], 0))
HTTP_EXIT(recvfrom, http_read_done(c, args->ret, a.arg[0], a.arg[1]))
HTTP_EXIT(recvmsg, http_read_done(c, args->ret, a.arg[0], 0))
HTTP_EXIT(write, http_write_done(c, args->ret, a.arg[0], HTTP_BUF, a.arg[1], args->ret))
HTTP_EXIT(writev, http_write_done(c, args->ret, a.arg[0], HTTP_IOV, a.arg[1], a.arg[2]))
HTTP_EXIT(sendto, http_write_done(c, args->ret, a.arg[0], HTTP_BUF, a.arg[1], args->ret))
HTTP_EXIT(sendmsg, http_write_done(c, args->ret, a.arg[0], HTTP_MSG, a.arg[1], 0))
ON_SYSCALL_EXIT(sendfile64, http_write_done(http_conn_of(a.arg[0]), args->ret, a.arg[0], HTTP_FILE, 0, 0))

int on_close_enter(struct tracepoint__syscalls__sys_enter_close *args)
{
    TLS_ALSO(tls_closed(args->fd));
    if (!maybe_watched(current_tid()))
        return 0;
    struct http_conn *c = http_conn_of(args->fd);
    if (c) {
        struct http_conn_key k = {.tgid = current_tgid(), .fd = (u32)args->fd};
        http_response_over(c);
        http_conns.delete(&k);
    }
    return 0;
}
