/* HTTP/1.x per service, without touching the server's code. Connections are
 * tracked per socket, seen at the socket layer (bpf/common.h SOCK_PROGRAMS), so a
 * request read in one thread and answered in another still counts. A TCP
 * connection becomes one when a watched task reads from it bytes that start
 * like a request line (a method: "GET ", "POST"...; a response's "HTTP/" never
 * does, so a service's own client connections are not taken for its server's);
 * its response is every write after that, until the next request's read, end
 * of file or the socket's end (tcp:tcp_destroy_sock). Per response:
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
 * A request for one of the service's untimed paths (its /metrics, read by slotune
 * and Prometheus, a health check: http_untimed, filled from the config) is
 * neither counted nor timed: its path is hashed (FNV-1a) from the request line
 * at its start, for services that have such paths only.
 * A service with routes (path prefixes, up to HTTP_ROUTES: http_routes, filled
 * from the config) has each of its requests classed as it is read, from the same
 * read of its request line: 1..N for the first of its routes that starts the path,
 * HTTP_OTHER_ROUTE for none. The class rides with the connection to the response,
 * and every series of the request is keyed by it too: its label id is the class
 * above the series' own label (HTTP_ROUTE_SHIFT), 0 for a service without routes,
 * whose keys are as they were. Which services' request lines are read at all is
 * one byte by service id (http_checks), so a request of a service with neither
 * untimed paths nor routes costs one inlined lookup for both.
 * That count and the status classes' are kept in per-CPU arrays by service id
 * (the first 1023 ids), whose lookups the JIT inlines: no hash and no atomic on
 * the hot path; user space sums the CPUs' slots. A service with routes counts
 * them by (service, route class) in the shared counts map instead (a hash lookup
 * and an atomic add each, beside the read of its request line).
 * A read or a write is one program run, for watched tasks only, and one lookup
 * of its socket; no program runs on any syscall, so no task on the host leaves
 * the kernel's fast syscall path (before Linux 6.4, programs on the socket
 * syscalls' exits do the same work: bpf/common.h). Times are taken as the
 * socket layer returns: a write counts once the kernel has its bytes. A write
 * without a user buffer (sendfile: one per socket send, so a large file is
 * several) is body bytes.
 * Only a response's first write reads its bytes (its status line and where its
 * header block ends: one read of a short first segment, see HTTP_HEAD_READ), and
 * a 5-byte write or a one-iovec writev() 5 more.
 * Connections are kept in an LRU map, so that connections whose end is never seen
 * cannot fill it for good; when full it evicts the least recently used, counted
 * (bpf/common.h lru_changes). While the server works on a request nothing touches
 * its connection, so the slowest requests would be evicted first: a request read
 * and not yet answered is also kept in http_in_flight (below) and brought back
 * from there, so a flood of connections evicts idle ones, not requests in flight. */

#define HTTP_STATUS_LINE 12              /* "HTTP/1.1 200" */
#define HTTP_HEADER_END 0x0a0d0a0d       /* "\r\n\r\n" read as a little-endian u32 */
#define HTTP_LAST_CHUNK 0x0a0d0a0d30ULL  /* "0\r\n\r\n" read as a little-endian u64, 5 bytes */

struct http_conn {
    u64 request_at;      /* ns the request's first bytes were read, 0 between requests */
    u64 header_at;       /* ns of a write that held only the header block */
    u64 first_byte_at;   /* ns of the response's first body write */
    u64 last_write_at;   /* ns of its latest write; 0 until it has one */
    u32 service;
    u32 refused;         /* the response's status if it is a refusal (429, 503), else 0 */
    u32 held;            /* its request's place in http_in_flight + 1 until answered, else 0 */
    u16 untimed;         /* 1 while its request is for one of the service's untimed paths */
    u16 route;           /* its request's route class; 0 where the service has no routes */
};

BPF_TABLE("lru_hash", u64, struct http_conn, http_conns, MAX_HTTP_CONNS);   /* socket -> its connection */
/* Counters by service id in per-CPU arrays, no hash and no atomic (see above). */
BPF_PERCPU_ARRAY(http_arrived, u64, HTTP_SERVICE_IDS);                       /* requests read */
BPF_PERCPU_ARRAY(http_statuses, u64, HTTP_SERVICE_IDS * HTTP_CLASS_SLOTS);   /* responses by status class */

/* What a service's request lines are read for, by service id (HTTP_CHECK_* bits, 0:
 * nothing, so that a request of any other service costs one inlined lookup). */
#define HTTP_CHECK_UNTIMED 1     /* it has untimed paths */
#define HTTP_CHECK_ROUTES 2      /* it has routes */
BPF_ARRAY(http_checks, u8, HTTP_SERVICE_IDS);
/* Untimed paths: (service, hash of the path). */
struct http_path {
    u32 service;
    u32 hash;            /* FNV-1a of the path's bytes, from its '/' to before ' ' or '?' */
};
BPF_HASH(http_untimed, struct http_path, u8, HTTP_UNTIMED_PATHS);
/* Routes, by service id (a hash without preallocation: memory for the services that have
 * routes only): up to HTTP_ROUTES path prefixes of up to 8 * HTTP_ROUTE_WORDS bytes each,
 * compared a word at a time under a mask, without a branch (a loop that stops at a prefix's
 * end or at its first difference costs the verifier a path per byte). */
struct http_route {
    u64 word[HTTP_ROUTE_WORDS];                  /* the prefix's bytes, zero-padded */
    u64 mask[HTTP_ROUTE_WORDS];                  /* 0xff for each of its bytes, else 0 */
};
struct http_route_set {
    struct http_route route[HTTP_ROUTES];
    u8 len[HTTP_ROUTES];                         /* each prefix's length; 0 past the last */
};
BPF_F_TABLE("hash", u32, struct http_route_set, http_routes, HTTP_SERVICE_IDS, BPF_F_NO_PREALLOC);
#define HTTP_LINE_READ 128       /* the request line's bytes read: method, path (< 100), a space */
#define HTTP_METHOD_END 8        /* the space after the longest method ("OPTIONS ") */
struct http_line {
    char bytes[HTTP_LINE_READ];
};
BPF_PERCPU_ARRAY(http_lines, struct http_line, 1);

static __always_inline u8 http_checks_of(u32 service)
{
    u8 *checks = http_checks.lookup(&service);
    return checks ? *checks : 0;
}

/* The start of the request line this read holds (io located), read into the per-CPU
 * buffer, and in *len how many bytes were read; 0 when it cannot be read. */
static __always_inline struct http_line *http_line(struct sock_io *io, u32 *len)
{
    u64 seg[2] = {};
    sock_first(io, seg);
    u64 n = seg[1] < (u64)io->ret ? seg[1] : (u64)io->ret;
    if (n > HTTP_LINE_READ - 1)
        n = HTTP_LINE_READ - 1;
    u32 zero = 0;
    struct http_line *l = http_lines.lookup(&zero);
    if (!l || n < 6 || bpf_probe_read_user(l->bytes, n & (HTTP_LINE_READ - 1), (void *)seg[0]))
        return 0;
    *len = n;
    return l;
}

/* Is the path of the request line l (len bytes read) one of the service's untimed paths? */
static __always_inline int http_untimed_path(u32 service, struct http_line *l, u32 len)
{
    struct http_path key = {.service = service, .hash = 2166136261u};
    int in_path = 0;
    for (u32 i = 0; i < HTTP_LINE_READ - 1; i++) {
        if (i >= len)
            return 0;                            /* no end of the path in what was read */
        char ch = l->bytes[i];
        if (!in_path) {
            in_path = ch == ' ';
            continue;
        }
        if (ch == ' ' || ch == '?')
            return http_untimed.lookup(&key) != 0;
        key.hash = (key.hash ^ (u8)ch) * 16777619u;
    }
    return 0;
}

/* The route class of the request line l (len bytes read): 1..N, the first of the
 * service's routes that starts its path, else HTTP_OTHER_ROUTE. */
static __always_inline u16 http_route(u32 service, struct http_line *l, u32 len)
{
    struct http_route_set *set = http_routes.lookup(&service);
    u32 path = 0;
    for (u32 i = 3; i < HTTP_METHOD_END; i++) {  /* the path starts after the method's space */
        if (l->bytes[i] == ' ') {
            path = i + 1;
            break;
        }
    }
    if (!set || !path)
        return HTTP_OTHER_ROUTE;
    u64 word[HTTP_ROUTE_WORDS];
    __builtin_memcpy(word, &l->bytes[path & (HTTP_METHOD_END * 2 - 1)], sizeof(word));
    for (u32 r = 0; r < HTTP_ROUTES && set->len[r]; r++) {   /* a length of 0: no more routes */
        u64 diff = 0;
        for (u32 w = 0; w < HTTP_ROUTE_WORDS; w++)
            diff |= (word[w] & set->route[r].mask[w]) ^ set->route[r].word[w];
        if (!diff && path + set->len[r] <= len)  /* and all of it read: the rest of the buffer is stale */
            return r + 1;
    }
    return HTTP_OTHER_ROUTE;
}

/* The request this read starts (io located), of a service whose request lines are read
 * (checks): whether it is for an untimed path, and if not its route class (in this order:
 * the other costs the verifier a pass over the path's loop per route class). */
static __always_inline void http_classify(struct http_conn *c, struct sock_io *io, u8 checks)
{
    u32 len = 0;
    struct http_line *l = http_line(io, &len);
    c->untimed = l && (checks & HTTP_CHECK_UNTIMED) && http_untimed_path(c->service, l, len);
    if (!c->untimed && (checks & HTTP_CHECK_ROUTES))
        c->route = l ? http_route(c->service, l, len) : HTTP_OTHER_ROUTE;
}

/* A series' label id: the request's route class (0 where its service has no routes)
 * above the series' own label (a status code; 0 if it has none). */
static __always_inline u16 http_label(u16 route, u32 own)
{
    return (u16)(route << HTTP_ROUTE_SHIFT | own);
}

/* A request read, and a response's status class: counted by service id in the per-CPU
 * arrays, or for a service with routes by (service, route class) in the shared counts. */
static __always_inline void http_arrived_add(u32 service, u16 route)
{
    if (route) {
        count_add(service, SIG_HTTP_ARRIVED, http_label(route, 0), 1);
        return;
    }
    u64 *n = http_arrived.lookup(&service);
    if (n)
        (*n)++;
}

static __always_inline void http_status_add(u32 service, u16 route, u32 status)
{
    if (route) {
        count_add(service, SIG_HTTP_STATUS, http_label(route, status / 100), 1);
        return;
    }
    u32 slot = service * HTTP_CLASS_SLOTS + status / 100;
    u64 *n = http_statuses.lookup(&slot);
    if (n)
        (*n)++;
}

/* Requests read and not yet answered, by socket: HTTP_SETS sets of HTTP_WAYS
 * places, a socket's set picked by a hash of it. An array, so its lookups are
 * inlined by the JIT (no hash map operation per request): a request read claims a
 * free place of its set with one compare-and-swap, its first answer frees it. A
 * read or a write on a socket whose connection the LRU map evicted finds its
 * request here and puts the connection back. A request whose set is full is
 * counted in map_full (MAP_HTTP_IN_FLIGHT): it is timed unless evicted. */
#define HTTP_WAYS 4
#define HTTP_SETS ((MAX_HTTP_IN_FLIGHT + HTTP_WAYS - 1) / HTTP_WAYS)
struct http_request {
    u64 sk;              /* its socket, 0 when the place is free */
    u64 request_at;
    u32 service;
    u16 route;
};
struct http_set {
    struct http_request way[HTTP_WAYS];
};
BPF_ARRAY(http_in_flight, struct http_set, HTTP_SETS);

static __always_inline struct http_set *http_set_of(u64 sk, u32 *set)
{
    u64 hash = (sk * 0x9E3779B97F4A7C15ULL) >> 32;   /* Fibonacci hashing: 32 well-mixed bits */
    *set = (u32)((hash * HTTP_SETS) >> 32);           /* scaled to 0..HTTP_SETS-1, no division */
    return http_in_flight.lookup(set);
}

/* The request c has just read on socket sk waits for its answer. */
static __always_inline void http_hold(u64 sk, struct http_conn *c)
{
    u32 set;
    struct http_set *s = http_set_of(sk, &set);
    if (!s)
        return;
    for (u32 i = 0; i < HTTP_WAYS; i++) {
        struct http_request *r = &s->way[i];
        if (__sync_val_compare_and_swap(&r->sk, 0, sk) == 0) {
            r->request_at = c->request_at;
            r->service = c->service;
            r->route = c->route;
            c->held = set * HTTP_WAYS + i + 1;
            return;
        }
    }
    map_full_add(MAP_HTTP_IN_FLIGHT);
}

/* c's request on socket sk was answered, or is over: its place is free. */
static __always_inline void http_release(u64 sk, struct http_conn *c)
{
    if (!c->held)
        return;
    u32 set = (c->held - 1) / HTTP_WAYS;
    struct http_set *s = http_in_flight.lookup(&set);
    if (s && s->way[(c->held - 1) & (HTTP_WAYS - 1)].sk == sk)
        s->way[(c->held - 1) & (HTTP_WAYS - 1)].sk = 0;
    c->held = 0;
}

/* The request waiting on socket sk, and in *held its place + 1; 0 if none. */
static __always_inline struct http_request *http_waiting(u64 sk, u32 *held)
{
    u32 set;
    struct http_set *s = http_set_of(sk, &set);
    if (!s)
        return 0;
    for (u32 i = 0; i < HTTP_WAYS; i++) {
        if (s->way[i].sk == sk) {
            *held = set * HTTP_WAYS + i + 1;
            return &s->way[i];
        }
    }
    return 0;
}

/* The connection of socket sk, put back from http_in_flight if the LRU map evicted
 * it while its request waited; 0 if it has none. */
static __always_inline struct http_conn *http_conn_of(u64 sk)
{
    struct http_conn *c = http_conns.lookup(&sk);
    u32 held;
    struct http_request *r;
    if (c || !(r = http_waiting(sk, &held)))
        return c;
    struct http_conn back = {.request_at = r->request_at, .service = r->service, .route = r->route,
                             .held = held};
    if (!http_conns.insert(&sk, &back))
        lru_inserted(LRU_HTTP_CONNS);
    return http_conns.lookup(&sk);
}

/* The connection of socket sk is gone (its socket ended, or it is no HTTP/1.x). */
static __always_inline void http_forget(u64 sk, struct http_conn *c)
{
    http_release(sk, c);
    if (!http_conns.delete(&sk))
        lru_deleted(LRU_HTTP_CONNS);
}

/* Does a read that starts with these 4 bytes (sock_head) start a request line? */
#define HTTP_WORD(a, b, c, d) ((u32)(a) | (u32)(b) << 8 | (u32)(c) << 16 | (u32)(d) << 24)
static __always_inline int http_method(u32 word)
{
    switch (word) {
    case HTTP_WORD('G', 'E', 'T', ' '): case HTTP_WORD('P', 'O', 'S', 'T'): case HTTP_WORD('H', 'E', 'A', 'D'):
    case HTTP_WORD('P', 'U', 'T', ' '): case HTTP_WORD('D', 'E', 'L', 'E'): case HTTP_WORD('P', 'A', 'T', 'C'):
    case HTTP_WORD('O', 'P', 'T', 'I'): case HTTP_WORD('C', 'O', 'N', 'N'): case HTTP_WORD('T', 'R', 'A', 'C'):
        return 1;
    }
    return 0;
}

/* The response on c (socket sk) is over (the next request came, end of file,
 * close): record what only its end knows and wait for the next request. */
static __always_inline void http_response_over(u64 sk, struct http_conn *c)
{
    http_release(sk, c);
    if (c->request_at && c->last_write_at && !c->untimed) {
        if (!c->first_byte_at && c->header_at)
            hist_add(c->service, SIG_HTTP_FIRST_BYTE, http_label(c->route, 0), c->header_at - c->request_at);
        hist_add(c->service, SIG_HTTP_REQUEST, http_label(c->route, 0), c->last_write_at - c->request_at);
        if (c->refused)
            hist_add(c->service, SIG_HTTP_REFUSED, http_label(c->route, c->refused), c->last_write_at - c->request_at);
    }
    c->request_at = 0;
    c->header_at = 0;
    c->first_byte_at = 0;
    c->last_write_at = 0;
    c->refused = 0;
    c->untimed = 0;
    c->route = 0;
}

/* A request starts on a socket no connection is kept for: if a watched task
 * read the start of a request line from a TCP socket, it is one from now on. */
static __always_inline void http_opened(struct sock_io *io)
{
    u32 n;
    if (!http_method((u32)sock_head(io, &n)) || !sock_is_tcp(io->sk))
        return;
    u32 *service = service_of_task(current_tid());
    if (!service)
        return;
    struct http_conn c = {.service = *service, .request_at = bpf_ktime_get_ns()};
    u8 checks = http_checks_of(c.service);
    if (checks)
        http_classify(&c, io, checks);
    if (!c.untimed) {
        http_arrived_add(c.service, c.route);
        http_hold(io->sk, &c);
    }
    if (!http_conns.insert(&io->sk, &c))
        lru_inserted(LRU_HTTP_CONNS);
    else
        http_release(io->sk, &c);                /* another CPU's read put it there first */
}

/* A read returned on the socket whose connection is c (0: none yet), in syscall nr. */
static __always_inline void http_read_done(struct http_conn *c, struct sock_io *io, long nr)
{
    if (io->flags & SOCK_MSG_PEEK)               /* failed reads never get here */
        return;
    if (!c) {
        if (io->ret > 0)
            http_opened(io);
        return;
    }
    if (io->ret == 0 || c->last_write_at) {      /* end of file, or the next request */
        http_response_over(io->sk, c);
        if (io->ret == 0)
            return;
    } else if (c->request_at) {
        return;                                  /* more of the same request */
    }
    c->request_at = bpf_ktime_get_ns();
    u8 checks = http_checks_of(c->service);
    if (checks) {
        sock_locate(io, nr);
        http_classify(c, io, checks);
        if (c->untimed)
            return;
    }
    http_arrived_add(c->service, c->route);
    http_hold(io->sk, c);
}

/* The first and the last segment of a write's bytes: {base, len} each. */
static __always_inline void http_segments(struct sock_io *io, u64 first[2], u64 last[2])
{
    if (io->how == SOCK_BUF) {
        first[0] = last[0] = io->buf;
        first[1] = last[1] = io->len;
        return;
    }
    u64 len = io->len;                           /* SOCK_IOV: 1 to SOCK_MAX_IOV iovecs */
    if (len <= 2) {                              /* the usual case: one read for both */
        u64 iov[4] = {};
        bpf_probe_read_user(iov, len == 1 ? 2 * sizeof(u64) : 4 * sizeof(u64), (void *)io->buf);
        first[0] = iov[0];
        first[1] = iov[1];
        last[0] = iov[len == 1 ? 0 : 2];
        last[1] = iov[len == 1 ? 1 : 3];
        return;
    }
    bpf_probe_read_user(first, 2 * sizeof(u64), (void *)io->buf);
    bpf_probe_read_user(last, 2 * sizeof(u64), (void *)(io->buf + (len - 1) * 2 * sizeof(u64)));
}

/* A response's first write is read for its status line and whether it ends with
 * the header block. A user read costs ~0.1-0.2 us here whatever its size
 * (bench.server_overhead --bpf-stats), more than its copy, so a first segment
 * shorter than HTTP_HEAD_READ (a header block, a small response) is read whole,
 * once, into a per-CPU buffer: its start is the status line, and its end says
 * the rest. A write whose first segment ends with the header block and that sent
 * more (nginx's writev of header and body) holds body bytes: its last segment is
 * not read. */
#define HTTP_HEAD_READ 1024
struct http_head {
    char bytes[HTTP_HEAD_READ + 4];      /* + 4: the end is read at a masked offset */
};
BPF_PERCPU_ARRAY(http_heads, struct http_head, 1);

/* The status line (HTTP_STATUS_LINE bytes) of a response's first write into line,
 * and in *headers_only whether the write ends with the header block; -1 when its
 * bytes could not be read. */
static __always_inline int http_head(struct sock_io *io, char line[HTTP_STATUS_LINE], int *headers_only)
{
    u64 first[2] = {}, last[2] = {};
    http_segments(io, first, last);
    if (first[1] < HTTP_STATUS_LINE)
        return -1;
    u32 end = 0;
    if (first[1] < HTTP_HEAD_READ) {
        u32 zero = 0;
        struct http_head *h = http_heads.lookup(&zero);
        u32 len = first[1] & (HTTP_HEAD_READ - 1);
        if (!h || bpf_probe_read_user(h->bytes, len, (void *)first[0]))
            return -1;
        __builtin_memcpy(line, h->bytes, HTTP_STATUS_LINE);
        u32 sent = (u64)io->ret < len ? (u32)io->ret : len;          /* of this segment */
        if (sent >= 4)
            __builtin_memcpy(&end, &h->bytes[(sent - 4) & (HTTP_HEAD_READ - 1)], sizeof(end));
        if ((u64)io->ret <= len || end == HTTP_HEADER_END) {         /* the write ends here, or body follows */
            *headers_only = (u64)io->ret <= len && end == HTTP_HEADER_END;
            return 0;
        }
        end = 0;
    } else if (bpf_probe_read_user(line, HTTP_STATUS_LINE, (void *)first[0])) {
        return -1;
    }
    if (last[1] >= 4)
        bpf_probe_read_user(&end, sizeof(end), (void *)(last[0] + last[1] - 4));
    *headers_only = end == HTTP_HEADER_END;
    return 0;
}

/* A response's first write: its status code (100 to 599), or 0 if it is no
 * HTTP/1.x status line; *headers_only when the write ends with the header block. */
static __always_inline u32 http_status(struct sock_io *io, int *headers_only)
{
    char line[HTTP_STATUS_LINE] = {};
    if (http_head(io, line, headers_only))
        return 0;
    if (line[0] != 'H' || line[1] != 'T' || line[2] != 'T' || line[3] != 'P' || line[4] != '/'
        || line[5] != '1' || line[6] != '.' || line[8] != ' ' || line[9] < '1' || line[9] > '5'
        || line[10] < '0' || line[10] > '9' || line[11] < '0' || line[11] > '9')
        return 0;
    return (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
}

/* Is this write the chunked terminator alone? Only a 5-byte write(), or a
 * writev() of one iovec (nginx's last flush), is read to see. */
static __always_inline int http_last_chunk(struct sock_io *io)
{
    u64 seg[2] = {};
    if (io->how == SOCK_BUF || (io->how == SOCK_IOV && io->len == 1))
        sock_first(io, seg);
    u64 chunk = 0;
    if (seg[1] != 5 || bpf_probe_read_user(&chunk, 5, (void *)seg[0]))
        return 0;
    return chunk == HTTP_LAST_CHUNK;
}

/* A write of some bytes returned on the socket whose connection is c, in syscall
 * nr. Only a response's first write and a 5-byte one (the chunked terminator?)
 * need to know where its bytes are. */
static __always_inline void http_write_done(struct http_conn *c, struct sock_io *io, long nr)
{
    if (c->request_at == 0)
        return;
    u64 now = bpf_ktime_get_ns();
    if (c->untimed) {                            /* only its end matters: the next request's start */
        c->last_write_at = now;
        return;
    }
    if (!c->last_write_at || io->ret == 5)
        sock_locate(io, nr);
    if (!c->last_write_at && io->how != SOCK_NONE) {
        int headers_only = 0;
        u32 status = http_status(io, &headers_only);
        if (status == 0) {                       /* not an HTTP/1.x server after all */
            http_forget(io->sk, c);
            return;
        }
        if (status < 200)                        /* 100 Continue and the like: the answer comes later */
            return;
        http_release(io->sk, c);                 /* answered: its writes keep it recently used */
        http_status_add(c->service, c->route, status);
        if (status == HTTP_TOO_MANY_REQUESTS || status == HTTP_SERVICE_UNAVAILABLE)
            c->refused = status;
        c->last_write_at = now;
        if (headers_only) {
            c->header_at = now;
            return;
        }
    } else if (http_last_chunk(io)) {
        c->last_write_at = now;
        return;
    }
    if (!c->first_byte_at) {
        c->first_byte_at = now;
        hist_add(c->service, SIG_HTTP_FIRST_BYTE, http_label(c->route, 0), now - c->request_at);
    } else {
        hist_add(c->service, SIG_HTTP_WRITE_GAP, http_label(c->route, 0), now - c->last_write_at);
    }
    c->last_write_at = now;
}

/* The hooks on the socket points (hooks.py; bpf/shared.bpf.c runs them, with
 * the other families' on the same points after these). A read or write on a
 * socket kept as an HTTP/1.x connection is this family's alone (1: no later
 * family's hook sees it); on any other socket a request may start here, and
 * the later families look too (a ClientHello, for tls). */
static __always_inline int http_sock_received(struct sock_io *io, long nr)
{
    struct http_conn *c = http_conn_of(io->sk);
    if (!c)
        sock_locate(io, nr);
    http_read_done(c, io, nr);
    return c != 0;
}

static __always_inline int http_sock_sent(struct sock_io *io, long nr)
{
    struct http_conn *c = http_conn_of(io->sk);
    if (!c)
        return 0;
    http_write_done(c, io, nr);
    return 1;
}

/* The connection's end, in whatever task or softirq frees the socket: its
 * response is over. */
static __always_inline void http_sock_ended(u64 key)
{
    struct http_conn *c = http_conns.lookup(&key);
    u32 held;
    struct http_request *r;
    if (c) {
        http_response_over(key, c);
        http_forget(key, c);
    } else if ((r = http_waiting(key, &held))) {  /* its connection evicted while its request waited */
        r->sk = 0;
    }
}
