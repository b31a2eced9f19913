"""TCP from the kernel's own tracepoints, through a shaped link: a client service
in this namespace sends bulk data to a sink in a network namespace over a veth
pair whose egress is TBF-shaped. Its RTT median rises as the queue predicts and
agrees in distribution with the srtt the client itself samples every 5 ms (TCP_INFO)
at the same time (both weigh time: the probe samples each connection at most
every 10 ms, not per received segment; the sawtooth of a filling and dropping
queue makes that distribution bimodal, ~20 ms and ~75 ms, so its median falls
in the gap and swings between runs, and the check is on every decile and the mean); retransmits appear with a tiny queue and are 0 on a clean link
(paced well below the veth's capacity: unpaced bulk over a veth on two busy
CPUs drops in the backlog); connects
are timed and counted. The BTF offsets the probe reads kernel fields at agree
with bpftool."""
import json
import re
import subprocess
import uuid

import pytest

from slotune.collectors.kernel.btf import VMLINUX, Btf, BtfError
from slotune.collectors.kernel.families.tcp import CB_SEGS, NET_INUM, SKB_CB, SK_NET
from slotune.model.service import ServiceSpec
from tests.probes.agreement import record
from tests.probes.conftest import collected, hist

RATE_BIT_S = 10e6
LIMIT_B = 100_000


def sh(*cmd) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def veth_namespace(name: str, subnet: str) -> tuple[str, str, str]:
    """Network namespace `name` joined to ours by a veth pair on <subnet>.1 (here)
    and <subnet>.2 (there); returns (veth here, veth there, address there)."""
    outer, inner = f"{name}a", f"{name}b"
    sh("ip", "netns", "add", name)
    sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
    sh("ip", "link", "set", inner, "netns", name)
    sh("ip", "addr", "add", f"{subnet}.1/24", "dev", outer)
    sh("ip", "-n", name, "addr", "add", f"{subnet}.2/24", "dev", inner)
    sh("ip", "link", "set", outer, "up")
    sh("ip", "-n", name, "link", "set", inner, "up")
    sh("ip", "-n", name, "link", "set", "lo", "up")
    return outer, inner, f"{subnet}.2"


def remove_namespace(name: str) -> None:
    """Undo veth_namespace(name, ...), whatever part of it was done."""
    subprocess.run(["ip", "link", "del", f"{name}a"], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def shaped_link(root_only):
    """(namespace, veth on our side, sink address); everything removed afterwards."""
    name = f"sltn{uuid.uuid4().hex[:6]}"
    try:
        outer, _, addr = veth_namespace(name, f"10.213.{10 + uuid.uuid4().int % 200}")
        yield name, outer, addr
    finally:
        remove_namespace(name)


def shape(dev, limit_bytes):
    # burst above the device MTU, or TBF drops everything
    sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(RATE_BIT_S)}bit",
       "burst", "32kb", "limit", str(limit_bytes))


def transfer(client, seconds, pause=0.0) -> list[float]:
    """One connection sending for `seconds`; the client's own srtt, sampled every
    5 ms, sorted (seconds)."""
    client.stdin.write(f"{seconds} {pause}\n")
    client.stdin.flush()
    samples = sorted(s / 1e6 for s in json.loads(client.stdout.readline()))
    assert samples, "the connection closed before its first sample"
    return samples


def decile_gap(own: list[float], probe) -> float:
    """The largest gap, over the deciles of the client's own samples, between the
    share of them above the decile and the share of the probe's samples above it
    (a Kolmogorov-Smirnov distance read at nine points)."""
    deciles = [(p / 10, own[p * (len(own) - 1) // 10]) for p in range(1, 10)]
    return max(abs(probe.fraction_above(value) - (1 - p)) for p, value in deciles)


def test_rtt_retransmits_and_connects_through_a_shaped_link(kernel, spawn, tag, shaped_link):
    ns, dev, addr = shaped_link
    sink = spawn("tcp_bulk", "sink", tag, prefix=["ip", "netns", "exec", ns])
    port = int(sink.stdout.readline())
    client = spawn("tcp_bulk", "send", tag, addr, port)
    collector = kernel([ServiceSpec("client", cmdline=f"tcp_bulk.py send {tag}", peers={port: "sink"})],
                       ["tcp"])
    collected(collector)

    clean_own = transfer(client, 1.0, pause=0.002)     # ~65 Mbit/s: well below what the veth takes
    clean = collected(collector)["client"]
    shape(dev, LIMIT_B)
    own = transfer(client, 1.5)
    shaped = collected(collector)["client"]
    shape(dev, 10_000)
    transfer(client, 0.3)
    tiny = collected(collector)["client"]

    shaped_rtt = hist(shaped.histograms, ("tcp_rtt", "sink"))
    rtt_clean = hist(clean.histograms, ("tcp_rtt", "sink")).quantile(0.5)
    rtt_shaped = shaped_rtt.quantile(0.5)
    own_mean = sum(own) / len(own)
    gap = decile_gap(own, shaped_rtt)
    print(f"RTT p50 clean {rtt_clean * 1e3:.3f} ms (own {clean_own[len(clean_own) // 2] * 1e3:.3f}), "
          f"shaped {rtt_shaped * 1e3:.2f} ms (own {own[len(own) // 2] * 1e3:.2f}), "
          f"mean {shaped_rtt.mean() * 1e3:.1f} ms (own {own_mean * 1e3:.1f}), decile gap {gap:.3f}, "
          f"retransmits clean {clean.counters.get(('tcp_retransmits', 'sink'), 0)} "
          f"tiny {tiny.counters.get(('tcp_retransmits', 'sink'), 0)}")
    queue_s = LIMIT_B * 8 / RATE_BIT_S            # the longest the TBF queue can hold a packet
    assert rtt_shaped >= 10 * rtt_clean
    assert rtt_shaped <= 1.5 * queue_s
    # 2026-12-01, 8 runs alone and under 3 busy loops: gap 0.045-0.118, mean +5..+14 %
    # (a bucket's midpoint reads a little above the values in it).
    record("TCP RTT mean, shaped link (TBF 10 Mbit, 100 kB)", "the client's own TCP_INFO srtt every 5 ms",
           shaped_rtt.mean() * 1e3, own_mean * 1e3, "ms", f"within 25 % (and decile gap {gap:.2f} <= 0.2)")
    assert gap <= 0.2
    assert abs(shaped_rtt.mean() - own_mean) <= 0.25 * own_mean
    assert clean.counters.get(("tcp_retransmits", "sink"), 0) == 0
    assert tiny.counters.get(("tcp_retransmits", "sink"), 0) > 0
    for phase in (clean, shaped, tiny):           # one connection each, opened, timed, closed
        assert phase.counters[("tcp_opened", "sink")] == 1
        assert hist(phase.histograms, ("tcp_connect", "sink")).count == 1
        assert phase.counters[("tcp_closed", "sink")] == 1


def test_btf_offsets_agree_with_bpftool(root_only):
    """daemon/collectors/kernel/btf.py against bpftool's own decoding of the running
    kernel's BTF: every direct member of the structs the probes touch, and the member
    paths bpf/tcp.bpf.c reads through anonymous structs and unions."""
    raw = subprocess.run(["bpftool", "btf", "dump", "file", VMLINUX, "format", "raw"],
                         check=True, capture_output=True, text=True).stdout
    types, current = {}, None           # id -> (kind, name, [(member, type id, byte offset)])
    for line in raw.splitlines():
        head = re.match(r"\[(\d+)\] (\w+) '([^']*)'(?:.* type_id=(\d+))?", line)
        if head:
            current = types[int(head[1])] = (head[2], head[3], [], int(head[4] or 0))
        elif current and (m := re.match(r"\t'([^']*)' type_id=(\d+) bits_offset=(\d+)", line)):
            current[2].append((m[1], int(m[2]), int(m[3]) // 8))

    def resolve(tid):
        while types[tid][0] in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
            tid = types[tid][3]
        return tid

    def find(tid, name):
        for member, mtid, off in types[resolve(tid)][2]:
            if member == name:
                return mtid, off
            if member == "(anon)" and (inner := find(mtid, name)):
                return inner[0], off + inner[1]

    def path_offset(struct, path):
        tid = next(i for i, t in types.items() if t[:2] == ("STRUCT", struct))
        total = 0
        for part in path.split("."):
            tid, off = find(tid, part)
            total += off
        return total

    with open(VMLINUX, "rb") as f:
        btf = Btf(f.read())
    checked = 0
    for struct in ("sock", "sock_common", "sk_buff", "net", "ns_common", "tcp_skb_cb", "tcp_sock"):
        for member, _, off in next(t for t in types.values() if t[:2] == ("STRUCT", struct))[2]:
            if member != "(anon)":
                assert btf.offset(struct, member) == off, (struct, member)
                checked += 1
    for struct, path in (SK_NET, NET_INUM, SKB_CB, CB_SEGS):
        assert btf.offset(struct, path) == path_offset(struct, path), (struct, path)
    print(f"{checked} members and 4 paths agree with bpftool")
    with pytest.raises(BtfError, match="no sock.no_such_member"):
        btf.offset("sock", "no_such_member")
