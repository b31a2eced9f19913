/* TLS per service, each figure from one source only.
 *
 * Handshakes come from the TLS records themselves as they cross the service's
 * TCP sockets (seen at the socket layer: bpf/common.h SOCK_PROGRAMS), so every TLS
 * stack counts alike: OpenSSL however it is driven (SSL_do_handshake,
 * SSL_accept, or the first SSL_read through a BIO), BoringSSL, Go's crypto/tls,
 * rustls, Java. Each record starts with a 5-byte header (content type, version,
 * length); a connection's record boundaries are followed in both directions, even
 * when a header or a record is split across syscalls. A handshake runs from the
 * ClientHello (read by a server, written by a client) to the first
 * application-data record (type 23) read by the server (TLS 1.3: the client's
 * Finished; 1.2: its first request) or written by the client (its Finished, or
 * its first request), or to the first application-data write of a TLS 1.2 server
 * that speaks first (both sides have changed cipher spec; in TLS 1.3 the server's
 * own handshake messages are type 23 records, which are not that). A socket is
 * followed from the first call that moves a ClientHello (a read makes the
 * service its server, a write its client), whenever it comes (STARTTLS: after
 * plaintext); once its handshake is timed it is forgotten, as at its end
 * (tcp:tcp_destroy_sock).
 *
 * Plaintext calls and bytes come from uprobes on the services' own libssl
 * (SSL_read, SSL_write and their _ex forms), the one thing the records cannot
 * show. User space attaches them to every libssl its targets map
 * (/proc/<pid>/maps); only watched tasks are counted. */

#define TLS_HEADER 5
#define TLS_MAX_RECORD (16384 + 2048)   /* the largest TLSCiphertext a peer may send */
#define TLS_RECORDS_PER_CALL 16         /* headers followed per syscall; a flight has fewer */
#define TLS_IOVECS 4                    /* iovecs followed per readv/writev/recvmsg/sendmsg */
#define TLS_CCS 20
#define TLS_HANDSHAKE 22
#define TLS_CLIENT_HELLO 1
#define TLS_APPDATA 23

struct tls_conn {
    u64 started;         /* ns the ClientHello crossed */
    u32 service;
    u8 server;           /* it read the ClientHello (else it wrote it) */
    u8 ccs;              /* 1 << direction: a ChangeCipherSpec went that way */
    u8 tls13;            /* the server wrote a type 23 record inside its handshake */
    u32 left[2];         /* per direction: bytes of the current record still to come */
    u32 have[2];         /* per direction: bytes of a header split across syscalls */
    u64 header[2];       /* per direction: those bytes, the first one lowest */
};

BPF_TABLE("lru_hash", u64, struct tls_conn, tls_conns, MAX_TLS_CONNS);   /* socket -> its handshake */

/* ---- handshakes, from the records ---- */

static __always_inline void tls_forget(u64 sk)
{
    /* a lookup takes no lock: most sockets were never ours */
    if (tls_conns.lookup(&sk) && !tls_conns.delete(&sk))
        lru_deleted(LRU_TLS_CONNS);
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

/* Does this call start with a ClientHello (a handshake record, version 3.x, and
 * where its fifth byte came along, handshake type 1)? */
static __always_inline int tls_hello(struct sock_io *io)
{
    u32 n;
    u64 head = sock_head(io, &n);
    if (n < 3 || (head & 0xff) != TLS_HANDSHAKE || ((head >> 8) & 0xff) != 3 || ((head >> 16) & 0xff) > 4)
        return 0;
    return n < 6 || ((head >> 40) & 0xff) == TLS_CLIENT_HELLO;
}

/* A socket nothing is kept for: if a watched task's TCP socket moved the start of
 * a ClientHello, its handshake starts now. */
static __always_inline struct tls_conn *tls_opened(struct sock_io *io, u32 dir)
{
    if (!tls_hello(io) || !sock_is_tcp(io->sk))
        return 0;
    u32 *service = service_of_task(current_tid());
    if (!service)
        return 0;
    struct tls_conn c = {.service = *service, .server = dir == TLS_READ, .started = bpf_ktime_get_ns()};
    if (!tls_conns.insert(&io->sk, &c))
        lru_inserted(LRU_TLS_CONNS);
    return tls_conns.lookup(&io->sk);
}

/* A read or a write returned on a watched task's socket (bpf/common.h struct sock_io). */
static __always_inline void tls_io_done(struct sock_io *io, u32 dir)
{
    if (io->ret <= 0 || io->how == SOCK_NONE || (io->flags & SOCK_MSG_PEEK))
        return;
    struct tls_conn *c = tls_conns.lookup(&io->sk);
    if (!c && !(c = tls_opened(io, dir)))
        return;
    int r = 0;
    u64 rest = io->ret;
    for (int i = 0; i < TLS_IOVECS && rest && !r; i++) {
        u64 seg[2] = {io->buf, rest};    /* one buffer, or the i-th struct iovec: base, len */
        if (io->how == SOCK_IOV) {
            if (i >= io->len)
                break;
            bpf_probe_read_user(seg, sizeof(seg), (void *)(io->buf + i * sizeof(seg)));
        }
        u64 part = seg[1] < rest ? seg[1] : rest;
        if (part)
            r = tls_walk(c, dir, seg[0], part);
        rest -= part;
    }
    if (!r && rest)
        r = -1;                          /* bytes past the iovecs followed: boundaries lost */
    if (r > 0)
        hist_add(c->service, SIG_TLS_HANDSHAKE, 0, bpf_ktime_get_ns() - c->started);
    if (r && !tls_conns.delete(&io->sk))
        lru_deleted(LRU_TLS_CONNS);
}

/* The hooks on the socket points (hooks.py; sock_ended's is tls_forget). They
 * claim no socket (0): its records hide it from no later family. */
static __always_inline int tls_sock_received(struct sock_io *io, long nr)
{
    sock_locate(io, nr);
    tls_io_done(io, TLS_READ);
    return 0;
}

static __always_inline int tls_sock_sent(struct sock_io *io, long nr)
{
    sock_locate(io, nr);
    tls_io_done(io, TLS_WRITE);
    return 0;
}

/* ---- plaintext calls and bytes, from libssl ---- */

struct tls_call {
    u64 ssl;
    u64 out_len;         /* size_t * of the _ex forms, 0 for SSL_read/SSL_write */
    u32 direction;       /* TLS_READ or TLS_WRITE */
};

BPF_TABLE("lru_hash", u32, struct tls_call, tls_calls, MAX_TLS_CALLS); /* tid -> SSL_read/SSL_write in flight */

static __always_inline int tls_enter(struct pt_regs *ctx, u32 direction, u64 out_len)
{
    u32 tid = current_tid();
    if (!service_of_task(tid))
        return 0;
    struct tls_call call = {.ssl = PT_REGS_PARM1(ctx), .out_len = out_len, .direction = direction};
    if (!tls_calls.insert(&tid, &call)) {
        lru_inserted(LRU_TLS_CALLS);
        return 0;
    }
    struct tls_call *old = tls_calls.lookup(&tid);   /* a call whose return was not seen left it there */
    if (old)
        *old = call;
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
    if (!tls_calls.delete(&tid))
        lru_deleted(LRU_TLS_CALLS);
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
