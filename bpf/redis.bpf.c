/* Redis (RESP2 and RESP3) per service, from a Redis server's own sockets, without
 * touching it. A TCP connection becomes one when a watched task whose name is a
 * Redis server's (redis-server, valkey-server, keydb-server, or Redis's I/O
 * threads, io_thd_*) reads RESP commands from it first: arrays of bulk strings
 * ("*3\r\n$3\r\nSET..."). A connection such a task writes on first is its own
 * client's (a replica's to its primary) and is let alone; a client's connection
 * in any other process, whose replies may look like commands, is never looked at:
 * its task has another name. Per command:
 *   redis_arrived        counted as it is read (answered or not yet);
 *   redis_command/<cls>  the read that brought it (the first of its batch) to the
 *                        first write after it, its reply, by command class (the
 *                        command's name, looked up in redis_commands, filled by
 *                        user space: read, write, blocking, other). A server reads
 *                        what a pipelining client sent, runs every command in it,
 *                        then writes their replies in one go: the commands read
 *                        together share one time, which is each one's. Writes
 *                        with no command waiting (a subscriber's messages, a
 *                        MONITOR feed) time nothing;
 *   redis_errors         replies that are errors ("-ERR", RESP3 "!"), read from
 *                        the first byte of a batch's reply: an error among the
 *                        later replies of a pipelined batch is not seen.
 * Commands are counted by walking the RESP headers of what each read brought,
 * each "*<n>\r\n" or "$<len>\r\n" read from the read's buffer (24 bytes, one user
 * read each, which also hold the command's name after its header) and the bulk
 * strings' bytes jumped over; a bulk string longer than
 * the read carries over to the next reads (skip). What cannot be followed (a
 * header cut by the read's end, more than REDIS_STEPS headers in one read: a
 * pipeline of more than 21 GETs at once, an inline command such as telnet's
 * "PING\r\n") makes the rest of that batch count as one command of class other;
 * the next batch is walked afresh. Connections are kept in an LRU map
 * (bpf/common.h lru_changes counts what it evicts). The walk keeps its state in
 * the connection and reads user memory at computed addresses, never indexes a
 * buffer by them, so the verifier's states stay alike from one header to the
 * next and it walks the loop once per header, not once per path. */

#define REDIS_STEPS 64               /* headers walked per read */
#define REDIS_HEADER 16              /* the bytes read for a header: type, up to 8 digits, CRLF */
#define REDIS_NAME 8                 /* a command name's bytes that classify it */

struct redis_conn {
    u64 request_at;                  /* ns of the first read of the batch waiting for its reply, 0: none */
    u32 service;
    u32 skip;                        /* bytes of a bulk string (and its CRLF) still to come */
    u32 args;                        /* bulk strings still to come in the current command */
    u32 arrived;                     /* commands read whole, ever (a walk's count is its difference) */
    union {
        u16 waiting[REDIS_CLASSES];  /* commands of the batch, by class */
        u64 batch;                   /* all of them: 0 when none waits */
    };
    u8 name_next;                    /* the next bulk string is the command's name */
    u8 cls;                          /* the class of the command being read */
    u8 lost;                         /* the batch's bytes could not be followed */
    u8 client;                       /* the server's task wrote first: its own client connection */
};

BPF_TABLE("lru_hash", u64, struct redis_conn, redis_conns, MAX_REDIS_CONNS);   /* socket -> its connection */
/* A command's class by its name: its first REDIS_NAME bytes, upper case, zero-padded. */
BPF_HASH(redis_commands, u64, u8, REDIS_COMMAND_NAMES);

#define REDIS_WORD(a, b, c, d, e, f, g, h) ((u64)(a) | (u64)(b) << 8 | (u64)(c) << 16 | (u64)(d) << 24 \
    | (u64)(e) << 32 | (u64)(f) << 40 | (u64)(g) << 48 | (u64)(h) << 56)

/* Is the current task a Redis server's? Its name's first 8 bytes (comm), or 7 for Redis's I/O threads. */
static __always_inline int redis_server_task(void)
{
    char comm[16] = {};
    bpf_get_current_comm(comm, sizeof(comm));
    u64 word;
    __builtin_memcpy(&word, comm, sizeof(word));
    return word == REDIS_WORD('r', 'e', 'd', 'i', 's', '-', 's', 'e')
        || word == REDIS_WORD('v', 'a', 'l', 'k', 'e', 'y', '-', 's')
        || word == REDIS_WORD('k', 'e', 'y', 'd', 'b', '-', 's', 'e')
        || (word & 0x00ffffffffffffffULL) == REDIS_WORD('i', 'o', '_', 't', 'h', 'd', '_', 0);
}

/* A header in the words w (REDIS_HEADER bytes, `have` of them real): its type in
 * *type, its number in *value, and its length with CRLF as the result; 0 when the
 * bytes end before its CRLF, -1 when it is none (a negative number, "$-1", is none
 * either, nor is one of 9 digits: a bulk string of 100 MB or more is not followed).
 * Without a branch per byte, so that it stays short and the verifier walks it once:
 * the first CR is found by the zero-byte trick on the words XOR CR, its index by a
 * multiply, and the digits are parsed eight at once (SWAR). The LF after the CR is
 * not checked: a stream that has none is broken, and its next header will not parse. */
static __always_inline int redis_header(const u64 w[2], u64 have, u8 *type, s64 *value)
{
    const u64 cr = 0x0d0d0d0d0d0d0d0dULL, ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    u64 x0 = w[0] ^ cr, x1 = w[1] ^ cr;
    u64 t0 = (x0 - ones) & ~x0 & highs & ~0x80ULL;   /* a CR's byte has its high bit set; not the type's */
    u64 t1 = (x1 - ones) & ~x1 & highs;
    if (!t0 && !t1)
        return have < REDIS_HEADER ? 0 : -1;
    /* the lowest such bit is 0x80 << 8 k: its byte's index k, read off a multiply; the
     * second word's only where the first has none (chosen by a mask, not a branch) */
    u64 k0 = (((t0 & -t0) >> 7) * 0x0001020304050607ULL) >> 56;
    u64 k1 = 8 + ((((t1 & -t1) >> 7) * 0x0001020304050607ULL) >> 56);
    u64 first = -((t0 | -t0) >> 63);            /* all ones where the first word has it */
    u64 k = (k0 & first) | (k1 & ~first);
    if (k + 1 >= have)
        return 0;                                /* its CR or LF not read yet */
    u64 n = k - 1;                               /* digits, 1 to 8 (a bulk string under 100 MB) */
    if (n < 1 || n > 8)
        return -1;
    /* the digits at the top of a word, '0's below them, then 8 digits parsed at once (SWAR) */
    u64 d = w[0] >> 8 | w[1] << 56;
    d = d << (8 * (8 - n)) | 0x3030303030303030ULL >> (8 * n - 1) >> 1;
    if (((d - 0x3030303030303030ULL) | (d + 0x4646464646464646ULL)) & highs)
        return -1;                               /* not all digits */
    d -= 0x3030303030303030ULL;
    d = d * 10 + (d >> 8);                       /* pairs */
    d = ((d & 0x000000ff000000ffULL) * (100 + (1000000ULL << 32))
         + ((d >> 16) & 0x000000ff000000ffULL) * (1 + (10000ULL << 32))) >> 32;
    s64 v = (s64)d;
    *type = (u8)w[0];
    *value = v;
    return k + 2;
}

/* The class of the command whose name is the `len` bytes starting `at` bytes into the
 * words w (read with its header: at most 11 + 8 of their 24 bytes): its first REDIS_NAME
 * bytes with bit 5 of each cleared (upper case, for letters), looked up. The bytes are
 * taken out of the words and the length clamped to 1..8 by arithmetic, not branches. */
static __always_inline u8 redis_class(const u64 w[3], u64 at, s64 len)
{
    u64 s = 8 * at, second = -((s >> 6) & 1);  /* all ones when the name starts in the second word */
    u64 r = s & 63;
    u64 a = (w[0] & ~second) | (w[1] & second), b = (w[1] & ~second) | (w[2] & second);
    u64 word = a >> r | (b << 1) << (63 - r);
    u64 l = (u64)len;
    l += (REDIS_NAME - l) & -((u64)(REDIS_NAME - (s64)l) >> 63);   /* at most 8 */
    l += ((l | -l) >> 63) ^ 1;                                      /* at least 1 */
    word &= ((2ULL << (8 * l - 1)) - 1) & 0xdfdfdfdfdfdfdfdfULL;
    u8 *cls = redis_commands.lookup(&word);
    return cls ? *cls & (REDIS_CLASSES - 1) : REDIS_OTHER;
}

/* The command c was reading has all its bytes: it waits for its reply. */
static __always_inline void redis_complete(struct redis_conn *c)
{
    c->waiting[c->cls & (REDIS_CLASSES - 1)]++;
    c->arrived++;
}

/* Walks the headers of the bytes a read brought (located by io) and adds the commands
 * they complete to c->waiting; returns how many. */
static __always_inline u32 redis_walk(struct redis_conn *c, struct sock_io *io)
{
    u64 seg[2] = {};
    sock_first(io, seg);
    u64 ret = seg[1] < (u64)io->ret ? seg[1] : (u64)io->ret;   /* a readv's first buffer only */
    u32 start = c->arrived;
    u64 pos = 0;
    if (c->skip) {                               /* the rest of a bulk string comes first */
        if (c->skip > ret) {
            c->skip -= ret;
            return 0;
        }
        pos = c->skip;
        c->skip = 0;
        if (!c->args)
            redis_complete(c);
    }
    for (int step = 0; step < REDIS_STEPS; step++) {
        if (pos >= ret)
            return c->arrived - start;
        u64 w[3] = {};                           /* a header, and a command name after it */
        u8 type = 0;
        s64 value = 0;
        int len = bpf_probe_read_user(w, sizeof(w), (void *)(seg[0] + pos)) ? -1
                  : redis_header(w, ret - pos, &type, &value);
        if (len <= 0 || type != (c->args ? '$' : '*'))
            break;
        pos += len;
        if (!c->args) {                          /* a command starts: an array of bulk strings */
            c->args = value;
            c->name_next = value > 0;
            continue;
        }
        c->args--;
        if (c->name_next) {
            c->name_next = 0;
            c->cls = redis_class(w, len, value);
        }
        pos += value + 2;                        /* the bulk string's bytes and CRLF */
        if (pos > ret) {
            c->skip = pos - ret;
            return c->arrived - start;
        }
        if (!c->args)
            redis_complete(c);
    }
    c->lost = 1;                                 /* a header we cannot follow, or too many */
    return c->arrived - start;
}

/* A read on the connection c of a Redis server. A batch of a connection whose bytes
 * could not be followed is walked afresh, as a client sends its next commands once it
 * has its replies: if they are still no RESP, the batch counts as one command of class
 * other. */
static __always_inline void redis_read(struct redis_conn *c, struct sock_io *io, long nr)
{
    sock_locate(io, nr);
    if (!c->request_at) {
        c->request_at = bpf_ktime_get_ns();
        if (c->lost) {
            c->lost = 0;
            c->args = c->skip = c->name_next = 0;
        }
    }
    u32 commands = c->lost ? 0 : redis_walk(c, io);
    if (c->lost && !c->batch) {
        c->waiting[REDIS_OTHER] = 1;
        commands = 1;
    }
    if (commands)
        count_add(c->service, SIG_REDIS_ARRIVED, 0, commands);
}

/* A write on the connection c: the reply of the batch waiting, if one waits. */
static __always_inline void redis_write(struct redis_conn *c, struct sock_io *io, long nr)
{
    if (!c->request_at)
        return;
    u64 took = bpf_ktime_get_ns() - c->request_at;
    c->request_at = 0;                           /* the next read starts the next batch */
    if (!c->batch)
        return;
#pragma unroll
    for (int cls = 0; cls < REDIS_CLASSES; cls++) {
        if (c->waiting[cls])
            hist_add_n(c->service, SIG_REDIS_COMMAND, cls, took, c->waiting[cls]);
    }
    c->batch = 0;
    sock_locate(io, nr);
    u32 n;
    u8 first = (u8)sock_head(io, &n);
    if (n && (first == '-' || first == '!'))
        count_add(c->service, SIG_REDIS_ERRORS, 0, 1);
}

static __always_inline void redis_forget(u64 sk)
{
    if (!redis_conns.delete(&sk))
        lru_deleted(LRU_REDIS_CONNS);
}

/* A new connection of a Redis server's task (0: another's task, or none): the
 * server's own when it reads first (keep: 0), a client's (a replica's to its primary)
 * when it writes first (keep: 1), kept only to be let alone. */
static __always_inline struct redis_conn *redis_opened(struct sock_io *io, u8 client)
{
    if (!redis_server_task() || !sock_is_tcp(io->sk))
        return 0;
    u32 *service = service_of_task(current_tid());
    if (!service)
        return 0;
    struct redis_conn fresh = {.service = *service, .client = client};
    if (!redis_conns.insert(&io->sk, &fresh))
        lru_inserted(LRU_REDIS_CONNS);
    return redis_conns.lookup(&io->sk);
}

/* The hooks on the socket points (hooks.py). A socket kept as a Redis server's
 * connection is this family's alone. One that starts with no RESP array ('*': a TLS
 * handshake, the cluster bus) is never kept, so the tls family sees it; the verifier
 * then follows the tls hook from few states of this one. */
static __always_inline int redis_sock_received(struct sock_io *io, long nr)
{
    if (io->flags & SOCK_MSG_PEEK)
        return 0;
    struct redis_conn *c = redis_conns.lookup(&io->sk);
    if (!c) {
        if (io->ret <= 0)
            return 0;
        sock_locate(io, nr);
        u32 n;
        if ((u8)sock_head(io, &n) != '*' || !(c = redis_opened(io, 0)))
            return 0;
    }
    if (c->client)
        return 0;
    if (io->ret == 0) {                          /* end of file */
        redis_forget(io->sk);
        return 1;
    }
    redis_read(c, io, nr);
    return 1;
}

static __always_inline int redis_sock_sent(struct sock_io *io, long nr)
{
    struct redis_conn *c = redis_conns.lookup(&io->sk);
    if (!c) {
        redis_opened(io, 1);
        return 0;
    }
    if (c->client)
        return 0;
    redis_write(c, io, nr);
    return 1;
}

static __always_inline void redis_sock_ended(u64 key)
{
    if (redis_conns.lookup(&key))
        redis_forget(key);
}
