"""TCP RTT, retransmitted segments, connect time and churn per service and peer
(bpf/tcp.bpf.c). Each interval it tells the kernel side on which (network
namespace, local port) the services listen and which remote ports name which peer.
The two kernel fields the program reads (a socket's namespace, an skb's segment
count) are at offsets taken from the running kernel's BTF when it is built."""
from __future__ import annotations

import ctypes
import logging

from slotune.collectors.kernel.btf import BtfError, offsets
from slotune.collectors.kernel.family import Family, Map, Points, Signal
from slotune.collectors.kernel.maps import U16, U32, set_entries
from slotune.model.signals import TCP_CONNECT, TCP_RETRANSMITS, TCP_RTT

log = logging.getLogger(__name__)

OTHER = "other"
# One RTT sample per connection per 10 ms at most: a busy connection weighs 100
# samples a second whatever its packet rate, instead of one per received segment.
RTT_EVERY_NS = 10_000_000
SK_NET = ("sock", "__sk_common.skc_net.net")      # struct net * of a socket
NET_INUM = ("net", "ns.inum")                      # its inode, as in /proc/<pid>/ns/net
SKB_CB = ("sk_buff", "cb")                         # TCP_SKB_CB(skb) lives here
CB_SEGS = ("tcp_skb_cb", "tcp_gso_segs")           # tcp_skb_pcount(skb)
DPORT = ("sock", "__sk_common.skc_dport")          # remote port (network order), then
NUM = ("sock", "__sk_common.skc_num")              # the local port (host order) right after it
SRTT = ("tcp_sock", "srtt_us")                     # 8 times the smoothed RTT, us
SOCK_HINT_SLOTS = 1024                             # tcp_sock_hint slots (socket address hash): 8 KiB
RETRANSMIT_FORMAT = "/sys/kernel/tracing/events/tcp/tcp_retransmit_skb/format"


def kernel_layout() -> dict[str, int]:
    """The #defines bpf/tcp.bpf.c reads kernel fields with (-1: unknown on this kernel)."""
    try:
        off = offsets((SK_NET, NET_INUM, SKB_CB, CB_SEGS))
        layout = {"TCP_SK_NET_OFF": off[SK_NET], "TCP_NET_INUM_OFF": off[NET_INUM],
                  "TCP_SKB_SEGS_OFF": off[SKB_CB] + off[CB_SEGS]}
    except BtfError as exc:
        log.warning("tcp probes: %s; listening ports are matched in every network namespace "
                    "and a retransmitted skb counts as one segment", exc)
        layout = {"TCP_SK_NET_OFF": -1, "TCP_NET_INUM_OFF": -1, "TCP_SKB_SEGS_OFF": -1}
    layout.update(rtt_layout())
    try:   # since Linux 6.10 the tracepoint also fires when the retransmit gave up, with err
        with open(RETRANSMIT_FORMAT) as f:
            layout["TCP_RETRANSMIT_ERR"] = int("field:int err;" in f.read())
    except OSError:
        layout["TCP_RETRANSMIT_ERR"] = 0
    return layout


def rtt_layout() -> dict[str, int]:
    """Where on_tcp_probe, a raw tracepoint program, finds a socket's ports and srtt."""
    try:
        off = offsets((DPORT, NUM, SRTT))
        if off[NUM] != off[DPORT] + 2:
            raise BtfError(f"the running kernel's sock has skc_num at {off[NUM]}, not right after skc_dport")
        return {"TCP_PORTS_OFF": off[DPORT], "TCP_SRTT_OFF": off[SRTT]}
    except BtfError as exc:
        log.warning("tcp probes: %s; the TCP RTT is not measured (the other TCP signals are)", exc)
        return {"TCP_PORTS_OFF": -1, "TCP_SRTT_OFF": -1}


class Tcp(Family):
    name = source = "tcp"
    signals = (Signal(TCP_RTT, "slotune_tcp_rtt_seconds", "peer", "histogram",
                      "Smoothed TCP round-trip time of the service's connections, "
                      "sampled at most every 10 ms per connection"),
               Signal(TCP_CONNECT, "slotune_tcp_connect_seconds", "peer", "histogram",
                      "TCP connect time (SYN_SENT to ESTABLISHED) of the service's outgoing connections"),
               Signal(TCP_RETRANSMITS, "slotune_tcp_retransmits_total", "peer", "counter",
                      "TCP segments the service's connections retransmitted"),
               Signal("tcp_opened", "slotune_tcp_connections_opened_total", "peer", "counter",
                      "TCP connections the service established (outgoing and accepted)"),
               Signal("tcp_closed", "slotune_tcp_connections_closed_total", "peer", "counter",
                      "Established TCP connections of the service that closed"))
    tracepoints = (("tcp:tcp_retransmit_skb", "on_tcp_retransmit"),
                   ("tcp:tcp_retransmit_synack", "on_tcp_retransmit_synack"),
                   ("sock:inet_sock_set_state", "on_tcp_state"))
    raw_tracepoints: Points = (("tcp:tcp_probe", "on_tcp_probe"),)   # every received segment: no record built
    maps = {"tcp_socks": Map(65536, True, "an evicted outgoing connection's later RTT, retransmits and close "
                                          "are no longer its service's (an accepted one is found again by its "
                                          "listening port)")}

    def __init__(self):
        self.peer_ids: dict[str, int] = {OTHER: 0}   # grows only: ids stay stable for deltas
        self.defines = {"TCP_PEER_OTHER": 0, "TCP_RTT_EVERY_NS": RTT_EVERY_NS, "TCP_HINT_SLOTS": SOCK_HINT_SLOTS,
                        **kernel_layout()}
        self.port_words: dict[int, int] = {}         # tcp_port_hint words written (port // 64 -> bits)
        self.netns_known = self.defines["TCP_SK_NET_OFF"] >= 0 and self.defines["TCP_NET_INUM_OFF"] >= 0
        if self.defines["TCP_PORTS_OFF"] < 0:
            self.raw_tracepoints = ()                # no on_tcp_probe in the program

    def label(self, signal: str, label_id: int, service: str) -> str:
        for name, peer_id in self.peer_ids.items():
            if peer_id == label_id:
                return name
        return OTHER

    def refresh(self, program, targets, service_ids) -> None:
        listen = {}
        peers = {}
        for name, procs in targets.items():
            sid = service_ids[name]
            for netns, port in procs.listen_ports:
                listen[(netns if self.netns_known else 0, port, 0)] = sid
            for port, peer in procs.service.peers.items():
                peers[(sid, port, 0)] = self.peer_ids.setdefault(peer, len(self.peer_ids))
        set_entries(program.table("tcp_listen_ports"), U32, listen)    # keys (netns, port, pad)
        set_entries(program.table("tcp_peer_ports"), U16, peers)       # keys (service, port, pad)
        words: dict[int, int] = {}
        for _, port, _ in listen:
            words[port >> 6] = words.get(port >> 6, 0) | 1 << (port & 63)
        hint = program.table("tcp_port_hint")
        for word in words.keys() | self.port_words.keys():
            if words.get(word, 0) != self.port_words.get(word, 0):
                hint[ctypes.c_int(word)] = ctypes.c_uint64(words.get(word, 0))
        self.port_words = words
