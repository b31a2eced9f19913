/* TCP per service and peer: smoothed RTT (tcp:tcp_probe srtt), retransmits
 * (tcp:tcp_retransmit_skb), connect time SYN_SENT -> ESTABLISHED and connections
 * opened/closed (sock:inet_sock_set_state).
 * These tracepoints fire in softirq context, where the current task is not the
 * service, so sockets are tied to services in two layout-safe ways:
 *   - an active open (CLOSE -> SYN_SENT) runs in the connecting task's own
 *     connect(): the socket address (skaddr) is recorded with that task's service;
 *   - an accepted socket is recognised by its local port, which user space fills
 *     into tcp_listen_ports from the service's listening sockets.
 * The peer label comes from the remote port (ServiceSpec.peers), else "other". */

#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7
#define TCP_LISTEN 10
#define IPPROTO_TCP_ 6

struct tcp_owner {
    u64 connect_at;      /* ns at SYN_SENT, 0 for accepted sockets */
    u32 service;
    u16 peer;
    u16 pad;
};

struct tcp_peer_key {
    u32 service;
    u16 port;            /* remote port, host order */
    u16 pad;
};

BPF_TABLE("lru_hash", u64, struct tcp_owner, tcp_socks, 65536);   /* skaddr -> owner */
BPF_HASH(tcp_listen_ports, u16, u32, 1024);                        /* local port -> service */
BPF_HASH(tcp_peer_ports, struct tcp_peer_key, u16, 1024);          /* (service, remote port) -> peer id */

static __always_inline u16 tcp_peer_of(u32 service, u16 remote_port)
{
    struct tcp_peer_key k = {.service = service, .port = remote_port};
    u16 *peer = tcp_peer_ports.lookup(&k);
    return peer ? *peer : TCP_PEER_OTHER;
}

/* Owner of a socket seen in softirq: recorded at connect, else by listening port. */
static __always_inline int tcp_owner_of(u64 sk, u16 sport, u16 dport, struct tcp_owner *out)
{
    struct tcp_owner *known = tcp_socks.lookup(&sk);
    if (known) {
        *out = *known;
        return 1;
    }
    u32 *service = tcp_listen_ports.lookup(&sport);
    if (!service)
        return 0;
    out->connect_at = 0;
    out->service = *service;
    out->peer = tcp_peer_of(*service, dport);
    return 1;
}

int on_tcp_probe(struct tracepoint__tcp__tcp_probe *args)
{
    struct tcp_owner o = {};
    if (!tcp_owner_of((u64)args->skaddr, args->sport, args->dport, &o))
        return 0;
    hist_add(o.service, SIG_TCP_RTT, o.peer, (u64)args->srtt * 1000);
    return 0;
}

int on_tcp_retransmit(struct tracepoint__tcp__tcp_retransmit_skb *args)
{
    struct tcp_owner o = {};
    if (!tcp_owner_of((u64)args->skaddr, args->sport, args->dport, &o))
        return 0;
    count_add(o.service, SIG_TCP_RETRANSMITS, o.peer, 1);
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
        tcp_socks.update(&sk, &o);
        return 0;
    }
    struct tcp_owner o = {};
    if (!tcp_owner_of(sk, args->sport, args->dport, &o))
        return 0;
    if (to == TCP_ESTABLISHED) {
        if (from == TCP_SYN_SENT && o.connect_at)
            hist_add(o.service, SIG_TCP_CONNECT, o.peer, bpf_ktime_get_ns() - o.connect_at);
        else if (from == TCP_SYN_RECV)
            tcp_socks.update(&sk, &o);
        count_add(o.service, SIG_TCP_OPENED, o.peer, 1);
    } else if (to == TCP_CLOSE) {
        if (from != TCP_SYN_SENT && from != TCP_SYN_RECV && from != TCP_LISTEN)
            count_add(o.service, SIG_TCP_CLOSED, o.peer, 1);
        tcp_socks.delete(&sk);
    }
    return 0;
}
