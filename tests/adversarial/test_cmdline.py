"""Finding a service's processes against other local users' processes: a
command line built to make the cmdline pattern backtrack, one that hides the
pattern's text past the head a pattern reads, one that copies the service's
command line from another account, a scan that runs out of its time budget;
and the `user` finder in the config."""
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

from slotune import config
from slotune.collectors.kernel.targeting import CMDLINE_BYTES, Targeting
from slotune.model.service import ServiceSpec

NOBODY = 65534
ARG_BYTES = 96 * 1024          # under the kernel's MAX_ARG_STRLEN (128 KiB for one argument)


@pytest.fixture
def start():
    """start(argv, executable=None, uid=None) -> a running Popen whose exec is done; killed at teardown."""
    procs = []

    def run(argv, executable=None, uid=None):
        def drop():
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        p = subprocess.Popen(argv, executable=executable, preexec_fn=drop if uid is not None else None,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        head = " ".join(argv)[:64].encode()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                if f.read(4096).replace(b"\0", b" ").startswith(head):
                    return p
            time.sleep(0.01)
        raise AssertionError(f"{argv[0]} did not start")

    yield run
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_a_1_5_mib_command_line_of_repeated_python_scans_fast_and_does_not_match(start):
    filler = ["python" * (ARG_BYTES // 6)] * 16                 # 1.5 MiB, 262 144 times "python"
    attacker = start([sys.executable, "-c", "import time; time.sleep(60)", *filler])
    with open(f"/proc/{attacker.pid}/cmdline", "rb") as f:
        assert len(f.read()) > 1.5 * 2**20
    targeting = Targeting([ServiceSpec("gateway", cmdline="python.*gateway")])
    t0 = time.perf_counter()
    found = targeting.scan()
    took = time.perf_counter() - t0
    assert attacker.pid not in found["gateway"].tgids
    assert took < 2.0, f"one scan took {took:.2f} s"             # a safety bound; about 0.05 s here


def test_gateway_past_the_first_4_kib_of_the_command_line_is_not_read(start):
    tag = f"slotune-test-{os.getpid()}-{time.monotonic_ns()}"
    hidden = start([sys.executable, "-c", "import time; time.sleep(60)", tag, "a" * CMDLINE_BYTES, "gateway"])
    found = Targeting([ServiceSpec("head", cmdline=tag), ServiceSpec("tail", cmdline=f"{tag}.*gateway")]).scan()
    assert hidden.pid in found["head"].tgids
    assert hidden.pid not in found["tail"].tgids


def test_another_users_process_with_the_services_command_line(root_only, start):
    tag = f"slotune-test-{os.getpid()}-{time.monotonic_ns()}-gateway"
    impostor = start([tag, "60"], executable=shutil.which("sleep"), uid=NOBODY)
    found = Targeting([ServiceSpec("by-cmdline", cmdline=tag),
                       ServiceSpec("as-root", cmdline=tag, user="root"),
                       ServiceSpec("as-nobody-uid", cmdline=tag, user=NOBODY),
                       ServiceSpec("as-nobody-name", cmdline=tag, user="nobody"),
                       ServiceSpec("by-user-alone", user=NOBODY)]).scan()
    assert impostor.pid in found["by-cmdline"].tgids               # cmdline alone is fooled
    assert impostor.pid not in found["as-root"].tgids
    assert found["as-nobody-uid"].tgids == {impostor.pid}
    assert found["as-nobody-name"].tgids == {impostor.pid}
    assert impostor.pid in found["by-user-alone"].tgids


def test_a_scan_out_of_budget_keeps_known_processes_and_warns_once(start, caplog):
    tag = f"slotune-test-{os.getpid()}-{time.monotonic_ns()}"
    first = start([sys.executable, "-c", "import time; time.sleep(60)", tag, "1"])
    targeting = Targeting([ServiceSpec("svc", cmdline=tag)])
    assert targeting.scan()["svc"].tgids == {first.pid}
    targeting.scan_budget_s = 0.0                                 # every new process is over budget
    second = start([sys.executable, "-c", "import time; time.sleep(60)", tag, "2"])
    with caplog.at_level(logging.WARNING, logger="slotune.collectors.kernel.targeting"):
        for _ in range(2):
            assert first.pid in targeting.scan()["svc"].tgids     # known: kept however late the scan
    warnings = [r.getMessage() for r in caplog.records if "budget" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "service svc" in warnings[0] and "user, systemd_unit or cgroup" in warnings[0]
    targeting.scan_budget_s = 10.0
    assert targeting.scan()["svc"].tgids == {first.pid, second.pid}   # a skipped process was not written off


def load(tmp_path, service_lines: str) -> config.Config:
    path = tmp_path / "slotune.toml"
    path.write_text(f"[services.api]\n{service_lines}\n")
    return config.load(path)


@pytest.mark.parametrize("value, user", [('"nobody"', "nobody"), ("65534", NOBODY), ("0", 0)])
def test_config_user_alone_is_a_finder(tmp_path, value, user):
    assert load(tmp_path, f"user = {value}").service("api").spec.user == user


@pytest.mark.parametrize("value, words", [
    ('"no-such-account-slotune"', "no account on this host: create it, or give its numeric uid"),
    ("-1", "not a uid"),
    ("4294967295", "not a uid"),
    ("true", "an account name or a numeric uid"),
    ('["nobody"]', "an account name or a numeric uid"),
])
def test_config_user_that_names_no_account(tmp_path, value, words):
    with pytest.raises(config.ConfigError, match=words) as err:
        load(tmp_path, f'cmdline = "api"\nuser = {value}')
    assert "services.api.user" in str(err.value)
