/* TLS per service, each figure from one source only.
 *
 * Handshakes come from the TLS records themselves as they cross the service's
 * sockets (the read and write syscalls of connections it accepted or connected),
 * so every TLS stack counts alike: OpenSSL however it is driven (SSL_do_handshake,
 * SSL_accept, or the first SSL_read through a BIO), BoringSSL, Go's crypto/tls,
 * rustls, Java. Each record starts with a 5-byte header (content type, version,
 * length); a connection's record boundaries are followed in both directions, even
 * when a header or a record is split across syscalls. A handshake runs from the
 * ClientHello (read by a server, written by a client) to the first
 * application-data record (type 23) read by the server (TLS 1.3: the client's
 * Finished; 1.2: its first request) or written by the client (its Finished, or
 * its first request), or to the first application-data write of a TLS 1.2 server
 * that speaks first (both sides have changed cipher spec; in TLS 1.3 the server's
 * own handshake messages are type 23 records, which are not that). Then the
 * connection is forgotten: its later records cost nothing.
 *
 * Plaintext calls and bytes come from uprobes on the services' own libssl
 * (SSL_read, SSL_write and their _ex forms), the one thing the records cannot
 * show. User space attaches them to every libssl its targets map
 * (/proc/<pid>/maps); only watched tasks are counted. */

#define TLS_HEADER 5
#define TLS_MAX_RECORD (16384 + 2048)   /* the largest TLSCiphertext a peer may send */
#define TLS_RECORDS_PER_CALL 16         /* headers followed per syscall; a flight has fewer */
#define TLS_IOVECS 4                    /* iovecs followed per readv/writev/recvmsg/sendmsg */
#define TLS_PLAIN_CALLS 8               /* data syscalls before a ClientHello (STARTTLS) before giving up */
#define TLS_CCS 20
#define TLS_HANDSHAKE 22
#define TLS_APPDATA 23
#define TLS_MSG_PEEK 2                  /* recv flag: the data stays queued, it has not crossed yet */

struct tls_conn_key {
    u32 tgid;
    u32 fd;
};

struct tls_conn {
    u64 started;         /* ns the ClientHello crossed; 0 while waiting for one */
    u32 service;
    u8 server;           /* accepted: the ClientHello is read; connected: it is written */
    u8 ccs;              /* 1 << direction: a ChangeCipherSpec went that way */
    u8 tls13;            /* the server wrote a type 23 record inside its handshake */
    u8 plain_calls;      /* data syscalls seen before the ClientHello */
    u32 left[2];         /* per direction: bytes of the current record still to come */
    u32 have[2];         /* per direction: bytes of a header split across syscalls */
    u64 header[2];       /* per direction: those bytes, the first one lowest */
};

BPF_TABLE("lru_hash", struct tls_conn_key, struct tls_conn, tls_conns, 16384);

/* ---- handshakes, from the records ---- */

static __always_inline void tls_opened(long fd, u8 server)
{
    if (fd < 0)
        return;
    u32 *service = service_of_task(current_tid());
    if (!service)
        return;
    struct tls_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    struct tls_conn c = {.service = *service, .server = server};
    tls_conns.update(&k, &c);
}

static __always_inline void tls_closed(u64 fd)
{
    if (!maybe_watched(current_tid()))
        return;
    struct tls_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    if (tls_conns.lookup(&k))   /* a lookup takes no lock: most closed fds were never ours */
        tls_conns.delete(&k);
}

/* One record header has been read. Returns 1 when it ends the handshake. */
static __always_inline int tls_record(struct tls_conn *c, u32 dir, u8 type, int starts_call)
{
    if (type == TLS_CCS) {
        c->ccs |= 1 << dir;
        return 0;
    }
    if (type != TLS_APPDATA)
        return 0;
    if (!c->server)
        return dir == TLS_WRITE;
    if (dir == TLS_READ)
        return 1;
    if (starts_call && !c->tls13 && c->ccs == 3)
        return 1;
    c->tls13 = 1;
    return 0;
}

/* Follows the records in `len` bytes at `buf` that went in direction `dir`.
 * Returns 1 when the handshake ended, -1 when the bytes are not TLS records.
 * Only scalars change from one record to the next (a header is read as one
 * 8-byte word), so the verifier folds the loop's paths together. */
static __always_inline int tls_walk(struct tls_conn *c, u32 dir, u64 buf, u64 len)
{
    dir &= 1;
    u64 off = 0;
    for (int i = 0; i < TLS_RECORDS_PER_CALL; i++) {
        u64 left = c->left[dir];
        if (left >= len - off) {            /* the call ends inside this record */
            c->left[dir] = left - (len - off);
            return 0;
        }
        off += left;
        u64 word = 0;
        bpf_probe_read_user(&word, sizeof(word), (void *)(buf + off));
        u32 have = c->have[dir] & 7;
        u64 header = c->header[dir] | (word << (8 * have));
        int starts_call = off == 0 && have == 0;
        if (TLS_HEADER - have > len - off) {  /* the header goes on in the next call */
            have += len - off;
            c->header[dir] = header & ((1ULL << (8 * (have & 7))) - 1);
            c->have[dir] = have;
            c->left[dir] = 0;
            return 0;
        }
        off += TLS_HEADER - have;
        c->have[dir] = 0;
        c->header[dir] = 0;
        u8 type = header & 0xff;
        u32 length = ((header >> 16) & 0xff00) | ((header >> 32) & 0xff);
        if (type < TLS_CCS || type > 24 || ((header >> 8) & 0xff) != 3 || length > TLS_MAX_RECORD)
            return -1;
        c->left[dir] = length;
        if (tls_record(c, dir, type, starts_call))
            return 1;
    }
    return -1;   /* more records than followed: their boundaries are lost */
}

/* Before a ClientHello: is this the start of one, in the direction it goes? */
static __always_inline int tls_hello(struct tls_conn *c, u32 dir, u64 buf, u64 len)
{
    u8 h[3] = {};
    if (dir != (c->server ? TLS_READ : TLS_WRITE) || len < sizeof(h))
        return 0;
    bpf_probe_read_user(h, sizeof(h), (void *)buf);
    return h[0] == TLS_HANDSHAKE && h[1] == 3 && h[2] <= 4;
}

/* `len` bytes went through connection c in direction dir, in one buffer.
 * Returns 1 when the connection is done with (handshake timed, or not TLS). */
static __always_inline int tls_data(struct tls_conn *c, u32 dir, u64 buf, u64 len)
{
    if (!c->started) {
        if (!tls_hello(c, dir, buf, len))
            return ++c->plain_calls >= TLS_PLAIN_CALLS;
        c->started = bpf_ktime_get_ns();
    }
    int r = tls_walk(c, dir, buf, len);
    if (r > 0)
        hist_add(c->service, SIG_TLS_HANDSHAKE, 0, bpf_ktime_get_ns() - c->started);
    return r != 0;
}

/* A read or write of `ret` bytes returned on fd: buf is the buffer, or the iovec
 * array when iovcnt > 0. For a task that may be watched (ON_SYSCALL_EXIT). */
static __always_inline void tls_io_done(long ret, u64 fd, u64 buf, u64 iovcnt, u32 dir)
{
    if (ret <= 0)
        return;
    struct tls_conn_key k = {.tgid = current_tgid(), .fd = (u32)fd};
    struct tls_conn *c = tls_conns.lookup(&k);
    if (!c)
        return;
    int done = 0;
    if (!iovcnt) {
        done = tls_data(c, dir, buf, ret);
    } else {
        u64 rest = ret;
        for (int i = 0; i < TLS_IOVECS && i < iovcnt && rest && !done; i++) {
            u64 iov[2] = {};     /* struct iovec: base, len */
            bpf_probe_read_user(iov, sizeof(iov), (void *)(buf + i * sizeof(iov)));
            u64 part = iov[1] < rest ? iov[1] : rest;
            if (part)
                done = tls_data(c, dir, iov[0], part);
            rest -= part;
        }
        done |= rest != 0 && c->started != 0;   /* bytes past the iovecs followed: boundaries lost */
    }
    if (done)
        tls_conns.delete(&k);
}

/* recvfrom: a MSG_PEEK read leaves the bytes queued for the next read. */
static __always_inline void tls_recv_done(long ret, u64 fd, u64 buf, u64 flags)
{
    if (!(flags & TLS_MSG_PEEK))
        tls_io_done(ret, fd, buf, 0, TLS_READ);
}

/* recvmsg/sendmsg: the iovecs of their struct user_msghdr. */
static __always_inline void tls_msg_done(long ret, u64 fd, u64 msg, u64 flags, u32 dir)
{
    if (ret <= 0 || !msg || (flags & TLS_MSG_PEEK))
        return;
    u64 iov[2] = {};
    msghdr_iov(msg, iov);
    if (iov[1])
        tls_io_done(ret, fd, iov[0], iov[1], dir);
}

/* This family's part of each socket syscall's exit, the call's arguments (a, its
 * call_args) mapped once for whichever program runs it: this file's own, or
 * http's (bpf/http.bpf.c) when both families are on. */
#define TLS_EXIT_read(ret, a)     tls_io_done(ret, a.arg[0], a.arg[1], 0, TLS_READ)
#define TLS_EXIT_readv(ret, a)    tls_io_done(ret, a.arg[0], a.arg[1], a.arg[2], TLS_READ)
#define TLS_EXIT_recvfrom(ret, a) tls_recv_done(ret, a.arg[0], a.arg[1], a.arg[3])
#define TLS_EXIT_recvmsg(ret, a)  tls_msg_done(ret, a.arg[0], a.arg[1], a.arg[2], TLS_READ)
#define TLS_EXIT_write(ret, a)    tls_io_done(ret, a.arg[0], a.arg[1], 0, TLS_WRITE)
#define TLS_EXIT_writev(ret, a)   tls_io_done(ret, a.arg[0], a.arg[1], a.arg[2], TLS_WRITE)
#define TLS_EXIT_sendto(ret, a)   tls_io_done(ret, a.arg[0], a.arg[1], 0, TLS_WRITE)
#define TLS_EXIT_sendmsg(ret, a)  tls_msg_done(ret, a.arg[0], a.arg[1], a.arg[2], TLS_WRITE)

/* connect() returned 0, or -EINPROGRESS on a non-blocking socket: the ClientHello is ours to write. */
#define TLS_EINPROGRESS -115
ON_SYSCALL_EXIT(connect, if (args->ret == 0 || args->ret == TLS_EINPROGRESS) tls_opened(a.arg[0], 0))

#ifndef FAMILY_HTTP
/* Without the http family these syscalls are this family's alone; with it,
 * bpf/http.bpf.c's programs on them call the tls_* hooks above as well. */
int on_accept_exit(struct tracepoint__syscalls__sys_exit_accept *args)       { tls_opened(args->ret, 1); return 0; }
int on_accept4_exit(struct tracepoint__syscalls__sys_exit_accept4 *args)     { tls_opened(args->ret, 1); return 0; }
#define TLS_ONLY_EXIT(call) ON_SYSCALL_EXIT(call, TLS_EXIT_##call(args->ret, a))
TLS_ONLY_EXIT(read)
TLS_ONLY_EXIT(readv)
TLS_ONLY_EXIT(recvfrom)
TLS_ONLY_EXIT(recvmsg)
TLS_ONLY_EXIT(write)
TLS_ONLY_EXIT(writev)
TLS_ONLY_EXIT(sendto)
TLS_ONLY_EXIT(sendmsg)
int on_close_enter(struct tracepoint__syscalls__sys_enter_close *args)       { tls_closed(args->fd); return 0; }
#endif

/* ---- plaintext calls and bytes, from libssl ---- */

struct tls_call {
    u64 ssl;
    u64 out_len;         /* size_t * of the _ex forms, 0 for SSL_read/SSL_write */
    u32 direction;       /* TLS_READ or TLS_WRITE */
};

BPF_TABLE("lru_hash", u32, struct tls_call, tls_calls, 16384); /* tid -> SSL_read/SSL_write in flight */

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
