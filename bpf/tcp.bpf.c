/* TCP per service and peer: smoothed RTT (tcp:tcp_probe srtt), retransmitted
 * segments (tcp:tcp_retransmit_skb, and tcp:tcp_retransmit_synack for SYN-ACKs: the
 * two ways the kernel adds to TcpRetransSegs), connect time SYN_SENT -> ESTABLISHED and
 * connections opened/closed (sock:inet_sock_set_state).
 * These tracepoints fire in softirq context, where the current task is not the
 * service, so sockets are tied to services in two ways:
 *   - an active open (CLOSE -> SYN_SENT) runs in the connecting task's own
 *     connect(): the socket address (skaddr) is recorded with that task's service;
 *   - an accepted socket is recognised by its network namespace and local port,
 *     which user space fills into tcp_listen_ports from the service's listening
 *     sockets, each read in the service process's own namespace.
 * No tracepoint carries the socket's namespace or the skb's segment count, so two
 * kernel fields are read at offsets user space takes from the running kernel's BTF
 * (never from the installed headers): sock->__sk_common.skc_net.net->ns.inum
 * (TCP_SK_NET_OFF, TCP_NET_INUM_OFF) and TCP_SKB_CB(skb)->tcp_gso_segs
 * (TCP_SKB_SEGS_OFF: the segments the kernel adds to TcpRetransSegs). Where BTF
 * lacks them the offsets are -1: ports then match in every namespace (netns 0 on
 * both sides) and a retransmitted skb counts as one segment. tcp_probe, which
 * fires on every received segment, is attached raw and reads the socket's ports
 * and srtt at BTF offsets too (TCP_PORTS_OFF, TCP_SRTT_OFF); without them the
 * RTT is not measured.
 * RTT is sampled at most once per TCP_RTT_EVERY_NS per connection (the first
 * received segment after that), so each busy connection weighs the same in time,
 * however many segments it receives: a burst of ACKs counts once. The time of
 * the last sample is kept per slot of the socket's address (tcp_rtt_at, an array
 * beside tcp_sock_hint), so a segment inside the interval costs no hash lookup;
 * two connections sharing a slot share its interval.
 * The peer label comes from the remote port (ServiceSpec.peers), else "other".
 * The first test on every segment is two lookups in small arrays (inlined by
 * the JIT, 16 KiB together so they stay in cache): tcp_sock_hint counts the
 * owned sockets whose address hashes to a slot, and tcp_port_hint has a bit for
 * each local port some service listens on (user space sets it). A segment of a socket no service owns, the host's other traffic, stops
 * there; only the others look up tcp_socks, the namespace and tcp_listen_ports. */

#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7
#define TCP_LISTEN 10
#define IPPROTO_TCP_ 6
/* tcp_retransmit_skb's err when __tcp_retransmit_skb gave up before the kernel
 * counted the segments (the skb still in the host queue, no memory, no route, no window). */
#define TCP_NOT_COUNTED(err) ((err) == -16 || (err) == -12 || (err) == -113 || (err) == -11 || (err) == -22)

struct tcp_owner {
    u64 connect_at;      /* ns at SYN_SENT, 0 for accepted sockets */
    u32 service;
    u16 peer;
    u16 pad;
};

struct tcp_listen_key {
    u32 netns;           /* inode of the network namespace (0: unknown, see above) */
    u16 port;            /* local port, host order */
    u16 pad;
};

struct tcp_peer_key {
    u32 service;
    u16 port;            /* remote port, host order */
    u16 pad;
};

BPF_TABLE("lru_hash", u64, struct tcp_owner, tcp_socks, MAX_TCP_SOCKS); /* skaddr -> owner */
BPF_HASH(tcp_listen_ports, struct tcp_listen_key, u32, 1024);          /* (netns, local port) -> service */
BPF_HASH(tcp_peer_ports, struct tcp_peer_key, u16, 1024);              /* (service, remote port) -> peer id */
BPF_ARRAY(tcp_sock_hint, u32, TCP_HINT_SLOTS);                          /* owned sockets per address slot */
BPF_ARRAY(tcp_port_hint, u64, 1024);                                    /* bit per local port a service listens on */
BPF_ARRAY(tcp_rtt_at, u64, TCP_HINT_SLOTS);                             /* ns of the last RTT sample per address slot */

static __always_inline u32 tcp_slot(u64 sk)
{
    return (u32)((sk >> 8) ^ (sk >> 20)) & (TCP_HINT_SLOTS - 1);
}

static __always_inline u32 *tcp_sock_slot(u64 sk)
{
    u32 slot = tcp_slot(sk);
    return tcp_sock_hint.lookup(&slot);
}

static __always_inline int tcp_port_listened(u16 sport)
{
    u32 word = sport >> 6;
    u64 *bits = tcp_port_hint.lookup(&word);
    return bits && (*bits >> (sport & 63)) & 1;
}

/* Could a service own this socket? False for nearly every socket it does not. */
static __always_inline int tcp_maybe_owned(u64 sk, u16 sport)
{
    u32 *n = tcp_sock_slot(sk);
    return (n && *n) || tcp_port_listened(sport);
}

static __always_inline void tcp_own(u64 sk, struct tcp_owner *o)
{
    if (tcp_socks.insert(&sk, o)) {
        struct tcp_owner *known = tcp_socks.lookup(&sk);   /* an address reused before its end was seen */
        if (known)
            *known = *o;
        return;
    }
    lru_inserted(LRU_TCP_SOCKS);
    u32 *n = tcp_sock_slot(sk);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline void tcp_forget(u64 sk)
{
    u32 *n = tcp_sock_slot(sk);
    if (!n || !*n || tcp_socks.delete(&sk))
        return;              /* not ours */
    lru_deleted(LRU_TCP_SOCKS);
    __sync_fetch_and_add(n, -1);
}

static __always_inline u16 tcp_peer_of(u32 service, u16 remote_port)
{
    struct tcp_peer_key k = {.service = service, .port = remote_port};
    u16 *peer = tcp_peer_ports.lookup(&k);
    return peer ? *peer : TCP_PEER_OTHER;
}

static __always_inline u32 tcp_netns_of(u64 sk)
{
    if (TCP_SK_NET_OFF < 0 || TCP_NET_INUM_OFF < 0)
        return 0;
    u64 net = 0;
    u32 inum = 0;
    bpf_probe_read_kernel(&net, sizeof(net), (void *)(sk + TCP_SK_NET_OFF));
    if (net)
        bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(net + TCP_NET_INUM_OFF));
    return inum;
}

/* The service listening on the socket's (namespace, local port), or 0. */
static __always_inline u32 *tcp_listener_of(u64 sk, u16 sport)
{
    struct tcp_listen_key k = {.netns = tcp_netns_of(sk), .port = sport};
    return tcp_listen_ports.lookup(&k);
}

/* Owner of a socket seen in softirq that passed tcp_maybe_owned: recorded at
 * connect or at an earlier event, else by (namespace, listening port), and then
 * recorded for the next events. */
static __always_inline struct tcp_owner *tcp_owner_found(u64 sk, u16 sport, u16 dport)
{
    struct tcp_owner *known = tcp_socks.lookup(&sk);
    if (known)
        return known;
    u32 *service = tcp_listener_of(sk, sport);
    if (!service)
        return 0;
    struct tcp_owner o = {.service = *service, .peer = tcp_peer_of(*service, dport)};
    tcp_own(sk, &o);
    return tcp_socks.lookup(&sk);
}

static __always_inline struct tcp_owner *tcp_owner_of(u64 sk, u16 sport, u16 dport)
{
    return tcp_maybe_owned(sk, sport) ? tcp_owner_found(sk, sport, dport) : 0;
}

#if TCP_PORTS_OFF >= 0
/* tcp:tcp_probe, attached raw (its arguments: the socket, the skb): the kernel
 * builds no trace record for the segment, which it would for every segment of
 * every connection on the host, and the program reads the socket's two ports in
 * one load and its srtt only for a sample it keeps. */
int on_tcp_probe(struct bpf_raw_tracepoint_args *ctx)
{
    u64 sk = ctx->args[0];
    u32 ports = 0;                       /* skc_dport (network order), then skc_num */
    bpf_probe_read_kernel(&ports, sizeof(ports), (void *)(sk + TCP_PORTS_OFF));
    u16 sport = ports >> 16;
    if (!tcp_maybe_owned(sk, sport))
        return 0;
    u32 slot = tcp_slot(sk);
    u64 *last = tcp_rtt_at.lookup(&slot);
    u64 now = bpf_ktime_get_ns();
    if (!last || now - *last < TCP_RTT_EVERY_NS)
        return 0;
    struct tcp_owner *o = tcp_owner_found(sk, sport, __builtin_bswap16((u16)ports));
    if (!o)
        return 0;
    u32 srtt = 0;                        /* tcp_sock.srtt_us: 8 times the smoothed RTT in us */
    bpf_probe_read_kernel(&srtt, sizeof(srtt), (void *)(sk + TCP_SRTT_OFF));
    if (srtt < 8)                        /* no RTT measured yet */
        return 0;
    *last = now;
    hist_add(o->service, SIG_TCP_RTT, o->peer, (u64)(srtt >> 3) * 1000);
    return 0;
}
#endif

int on_tcp_retransmit(struct tracepoint__tcp__tcp_retransmit_skb *args)
{
#if TCP_RETRANSMIT_ERR
    if (TCP_NOT_COUNTED(args->err))
        return 0;
#endif
    struct tcp_owner *o = tcp_owner_of((u64)args->skaddr, args->sport, args->dport);
    if (!o)
        return 0;
    u16 segs = 1;
    if (TCP_SKB_SEGS_OFF >= 0) {
        bpf_probe_read_kernel(&segs, sizeof(segs), (void *)((u64)args->skbaddr + TCP_SKB_SEGS_OFF));
        if (!segs)
            segs = 1;
    }
    count_add(o->service, SIG_TCP_RETRANSMITS, o->peer, segs);
    return 0;
}

/* A SYN-ACK sent again by a listener (fires only when sent; one segment). */
int on_tcp_retransmit_synack(struct tracepoint__tcp__tcp_retransmit_synack *args)
{
    if (!tcp_port_listened(args->sport))
        return 0;
    u32 *service = tcp_listener_of((u64)args->skaddr, args->sport);
    if (service)
        count_add(*service, SIG_TCP_RETRANSMITS, tcp_peer_of(*service, args->dport), 1);
    return 0;
}

int on_tcp_state(struct tracepoint__sock__inet_sock_set_state *args)
{
    if (args->protocol != IPPROTO_TCP_)
        return 0;
    u64 sk = (u64)args->skaddr;
    int from = args->oldstate, to = args->newstate;

    if (from == TCP_CLOSE && to == TCP_SYN_SENT) {          /* in the caller's connect() */
        u32 *service = service_of_task(current_tid());
        if (!service)
            return 0;
        struct tcp_owner o = {.connect_at = bpf_ktime_get_ns(), .service = *service,
                              .peer = tcp_peer_of(*service, args->dport)};
        tcp_own(sk, &o);
        return 0;
    }
    if (to == TCP_CLOSE && (from == TCP_SYN_SENT || from == TCP_SYN_RECV || from == TCP_LISTEN)) {
        tcp_forget(sk);                                     /* never established */
        return 0;
    }
    if (to != TCP_ESTABLISHED && to != TCP_CLOSE)
        return 0;
    struct tcp_owner *o = tcp_owner_of(sk, args->sport, args->dport);
    if (!o)
        return 0;
    u32 service = o->service;
    u16 peer = o->peer;
    if (to == TCP_ESTABLISHED) {
        if (from == TCP_SYN_SENT && o->connect_at)
            hist_add(service, SIG_TCP_CONNECT, peer, bpf_ktime_get_ns() - o->connect_at);
        count_add(service, SIG_TCP_OPENED, peer, 1);
    } else {
        tcp_forget(sk);
        count_add(service, SIG_TCP_CLOSED, peer, 1);
    }
    return 0;
}
