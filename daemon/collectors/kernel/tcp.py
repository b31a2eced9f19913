"""TCP RTT, retransmits, connect time and churn per service and peer (bpf/tcp.bpf.c).
Each interval it tells the kernel side which local ports the services listen on
and which remote ports name which peer."""
from daemon.collectors.kernel.program import U16, U32, Family, items, set_entries

OTHER = "other"


class Tcp(Family):
    name = source = "tcp"
    signals = ("tcp_rtt", "tcp_connect", "tcp_retransmits", "tcp_opened", "tcp_closed")
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
