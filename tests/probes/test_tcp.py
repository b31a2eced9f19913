"""TCP from the kernel's own tracepoints, through a shaped link: a client service
in this namespace sends bulk data to a sink in a network namespace over a veth
pair whose egress is TBF-shaped. Its RTT median rises as the queue predicts and
agrees within 20 % with the srtt the client itself samples every 5 ms (TCP_INFO)
at the same time (weighted per received segment, as the probe sees it); retransmits appear with a tiny queue and are 0 on a clean link
(paced well below the veth's capacity: unpaced bulk over a veth on two busy
CPUs drops in the backlog); connects
are timed and counted."""
import json
import subprocess
import uuid

import pytest

from daemon.model.service import ServiceSpec
from tests.probes.conftest import collected, hist

RATE_BIT_S = 10e6
LIMIT_B = 100_000


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture
def shaped_link(root_only):
    """(namespace, veth on our side, sink address); everything removed afterwards."""
    name = f"sltn{uuid.uuid4().hex[:6]}"
    outer, inner = f"{name}a", f"{name}b"
    net = 10 + uuid.uuid4().int % 200
    try:
        sh("ip", "netns", "add", name)
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", name)
        sh("ip", "addr", "add", f"10.213.{net}.1/24", "dev", outer)
        sh("ip", "-n", name, "addr", "add", f"10.213.{net}.2/24", "dev", inner)
        sh("ip", "link", "set", outer, "up")
        sh("ip", "-n", name, "link", "set", inner, "up")
        sh("ip", "-n", name, "link", "set", "lo", "up")
        yield name, outer, f"10.213.{net}.2"
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def shape(dev, limit_bytes):
    # burst above the device MTU, or TBF drops everything
    sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(RATE_BIT_S)}bit",
       "burst", "32kb", "limit", str(limit_bytes))


def transfer(client, seconds, pause=0.0):
    """One connection sending for `seconds`; the median of the client's own srtt samples
    (seconds), each weighted by the segments received since the one before: the
    probe reads srtt once per received segment, so this is the same distribution."""
    client.stdin.write(f"{seconds} {pause}\n")
    client.stdin.flush()
    samples = sorted(json.loads(client.stdout.readline()))
    total = sum(w for _, w in samples)
    seen = 0
    for srtt_us, weight in samples:
        seen += weight
        if seen >= total / 2:
            return srtt_us / 1e6
    raise AssertionError("the client received no segments")


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

    rtt_clean = hist(clean.histograms, ("tcp_rtt", "sink")).quantile(0.5)
    rtt_shaped = hist(shaped.histograms, ("tcp_rtt", "sink")).quantile(0.5)
    print(f"RTT p50 clean {rtt_clean * 1e3:.3f} ms (own {clean_own * 1e3:.3f}), "
          f"shaped {rtt_shaped * 1e3:.2f} ms (own {own * 1e3:.2f}), "
          f"retransmits clean {clean.counters.get(('tcp_retransmits', 'sink'), 0)} "
          f"tiny {tiny.counters.get(('tcp_retransmits', 'sink'), 0)}")
    queue_s = LIMIT_B * 8 / RATE_BIT_S            # the longest the TBF queue can hold a packet
    assert rtt_shaped >= 10 * rtt_clean
    assert rtt_shaped <= 1.5 * queue_s
    assert abs(rtt_shaped - own) <= 0.2 * own
    assert clean.counters.get(("tcp_retransmits", "sink"), 0) == 0
    assert tiny.counters.get(("tcp_retransmits", "sink"), 0) > 0
    for phase in (clean, shaped, tiny):           # one connection each, opened, timed, closed
        assert phase.counters[("tcp_opened", "sink")] == 1
        assert hist(phase.histograms, ("tcp_connect", "sink")).count == 1
        assert phase.counters[("tcp_closed", "sink")] == 1
