"""TCP RTT, retransmits, connect time and churn per service and peer (bpf/tcp.bpf.c).
Each interval it tells the kernel side which local ports the services listen on
and which remote ports name which peer."""
from daemon.collectors.kernel.family import Family, Signal
from daemon.collectors.kernel.maps import U16, U32, items, set_entries

OTHER = "other"


class Tcp(Family):
    name = source = "tcp"
    signals = (Signal("tcp_rtt", "slotune_tcp_rtt_seconds", "peer", "histogram",
                      "Smoothed TCP round-trip time of the service's connections, per received segment"),
               Signal("tcp_connect", "slotune_tcp_connect_seconds", "peer", "histogram",
                      "TCP connect time (SYN_SENT to ESTABLISHED) of the service's outgoing connections"),
               Signal("tcp_retransmits", "slotune_tcp_retransmits_total", "peer", "counter",
                      "TCP segments the service's connections retransmitted"),
               Signal("tcp_opened", "slotune_tcp_connections_opened_total", "peer", "counter",
                      "TCP connections the service established (outgoing and accepted)"),
               Signal("tcp_closed", "slotune_tcp_connections_closed_total", "peer", "counter",
                      "Established TCP connections of the service that closed"))
    tracepoints = (("tcp:tcp_probe", "on_tcp_probe"),
                   ("tcp:tcp_retransmit_skb", "on_tcp_retransmit"),
                   ("sock:inet_sock_set_state", "on_tcp_state"))
    defines = {"TCP_PEER_OTHER": 0}

    def __init__(self):
        self.peer_ids: dict[str, int] = {OTHER: 0}   # grows only: ids stay stable for deltas

    def label(self, signal: str, label_id: int) -> str:
        for name, peer_id in self.peer_ids.items():
            if peer_id == label_id:
                return name
        return OTHER

    def refresh(self, program, targets, service_ids) -> None:
        listen = {}
        peers = {}
        for name, procs in targets.items():
            sid = service_ids[name]
            for port in procs.listen_ports:
                listen[port] = sid
            for port, peer in procs.service.peers.items():
                peers[(sid, port)] = self.peer_ids.setdefault(peer, len(self.peer_ids))
        set_entries(program.table("tcp_listen_ports"), U16, U32, listen)
        table = program.table("tcp_peer_ports")
        present = {(k.service, k.port): v for k, v in items(table)}
        for (sid, port), peer_id in peers.items():
            if present.get((sid, port)) != peer_id:
                table[table.Key(sid, port, 0)] = U16(peer_id)
        for sid, port in present.keys() - peers.keys():
            del table[table.Key(sid, port, 0)]
