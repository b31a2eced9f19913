"""`slotune probes`: --print shows exactly what BCC compiles; --watch shows a
service's figures (count, p50, p99, max) after saying once what attached and
what did not; bad input names the input and the fix."""
import re
import threading
import urllib.request

from slotune.bpf import header, source
from slotune.commands.probes import attach_report
from slotune.collectors.kernel.families import FAMILIES
from slotune.collectors.kernel.program import HINT_SLOTS
from slotune.model.histogram import SLOTS, SUB_BITS
from tests.conftest import run_slotune


def test_print_shows_every_family_after_the_defines():
    result = run_slotune("probes", "--print")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.index("#define SIG_RUNQUEUE_WAIT ") < text.index(header("common").strip()[:200])
    for name in ("targeting", "runqueue", "offcpu", "tcp", "tls", "http"):
        assert source(name).strip() in text, name
    assert "#define OFFCPU_FUTEX 3" in text and "#define TLS_WRITE 1" in text


def test_print_generates_the_constants_common_h_shares():
    text = run_slotune("probes", "--print").stdout
    generated = text[:text.index("/* ---- bpf/common.h")]
    for define in (f"SUB_BITS {SUB_BITS}", f"SLOTS {SLOTS}", f"HINT_SLOTS {HINT_SLOTS}"):
        assert f"#define {define}\n" in generated
        assert f"#define {define.split()[0]} " not in header("common")


def test_list_shows_each_family_where_it_attaches_and_its_metrics():
    text = run_slotune("probes", "--list").stdout
    for family in FAMILIES.values():
        assert f"{family.name}  (bpf/{family.source}.bpf.c)" in text
        assert all(s.metric in text for s in family.signals), family.name
    assert "attaches to sched:sched_wakeup, sched:sched_wakeup_new, sched:sched_switch\n" in text
    assert "slotune_offcpu_seconds{service,syscall}  histogram: " in text
    assert "uprobe:libssl:SSL_read," in text


def test_print_one_family():
    text = run_slotune("probes", "--print", "--family", "tcp").stdout
    assert source("tcp").strip() in text and source("http").strip() not in text


def test_watch_prints_a_table_for_the_service(root_only, spawn, tag):
    server = spawn("http_server", tag, 0.0)
    port = int(server.stdout.readline())
    stop = threading.Event()

    def requests():
        while not stop.wait(0.05):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()

    client = threading.Thread(target=requests)
    client.start()
    try:
        result = run_slotune("probes", "--watch", "--service", f"web=http_server.py {tag}", "--family", "http",
                             "--interval", "1.5", "--count", "2")
    finally:
        stop.set()
        client.join()
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("service        signal") == 2
    assert re.search(r"^web +http_request +\d+ ", result.stdout, re.M), result.stdout
    assert result.stdout.count("attached (") == 1 and "not attached" not in result.stdout
    assert re.search(r"^attached \(\d+\): sched:sched_process_fork, ", result.stdout, re.M), result.stdout
    assert "sock:sock_recv_length," in result.stdout.split("service        signal")[0]
    assert "p99        max\n" in result.stdout
    p50, p99, top = re.search(r"^web +http_request +\d+ +(\S+) +(\S+) +(\S+)$", result.stdout, re.M).groups()
    assert all(v.endswith(("s", "ms", "µs")) for v in (p50, p99, top)), (p50, p99, top)


def test_bad_input_names_the_fix():
    assert "expected NAME=MATCH" in run_slotune("probes", "--watch", "--service", "web").stderr
    assert "known: exec, http, offcpu, redis, runqueue, tcp, tls" in run_slotune("probes", "--print", "--family", "dns").stderr
    assert "needs at least one --service" in run_slotune("probes", "--watch").stderr


def test_watch_says_what_attached_and_what_did_not():
    report = attach_report({"sched:sched_switch": True, "uprobe:/lib/libssl.so.3:SSL_read": False})
    assert report == "attached (1): sched:sched_switch\nnot attached (1): uprobe:/lib/libssl.so.3:SSL_read"
