"""`slotune discover --write` against what local processes can say: family names
and label values on their /metrics pages, their process names, their HAProxy
config's stats socket address, level and hint text, each holding newlines,
quotes, `]]`, `[[services]]`, `#`, backslashes, NUL, ESC and other controls and
Unicode line separators. The config written parses, holds exactly the services
picked, each hostile value read back exactly or absent; the table and every
comment are one line of printable ASCII."""
import argparse
import os
import re
import socket
import subprocess
import sys
import tomllib

import pytest
from hypothesis import given, settings, strategies as st

from slotune import config
from slotune.collectors.kernel.targeting import netns_of
from slotune.commands import discover as discover_command
from slotune.profiles.haproxy_config import Admission, StatsSocket
from tests.adversarial.conftest import reply

HOSTILE = ["a\nb", 'q"uote', "]]", "[[services]]", "# hash", "back\\slash", "nul\x00", "esc\x1b[31m\x07",
           "del\x7f\x9b", "cr\r", "ls\u2028ps\u2029", "tab\t", "bidi\u202e", "\u00e9\U0001F600",
           # the finding: a value that ends its line and declares a service sending a root-only file to its port
           'x"\n[services.evil]\nport = 1\n[services.evil.control]\nkind = "http-json"\n'
           'url = "http://127.0.0.1:1/"\ntoken_file = "/etc/shadow"\n# ']
SIGNALS = {"latency_metric": "request_duration_seconds", "ttft_metric": "time_to_first_token_seconds",
           "tpot_metric": "inter_token_latency_seconds"}
ADDRESS = "/run/hap\n[services.x]\x00\x1b]0;t\x07\"\\\u2028.sock"
LEVEL = "oper\nator\x1b[2J"
HINTS = [f"{h}: not read" for h in HOSTILE]


def quoted(text: str) -> str:
    """text as a quoted name or label value of the Prometheus text format."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def page(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


def reference_page() -> bytes:
    """A reference-stack page (`evil_setting`) whose histogram families have hostile names."""
    families = [f'{{{quoted(HOSTILE[-1] + HOSTILE[i] + "_" + signal + "_bucket")},le="1"}} 1'
                for i, signal in enumerate(SIGNALS.values())]
    return page(['evil_setting{setting="x"} 1', *families])


def haproxy_page() -> bytes:
    """HAProxy's exporter page, its proxy and server labels hostile."""
    return page(["haproxy_process_nbthread 1",
                 *(f"haproxy_server_current_sessions{{proxy={quoted(h)},server={quoted(h)}}} 1" for h in HOSTILE)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listener(port: int, process: str, cmdline: str) -> discover_command.Listener:
    return discover_command.Listener(port, netns_of(os.getpid()), 4242, process, cmdline)


def args(**given) -> argparse.Namespace:
    """discover's own defaults (its parser's, so that a new option is there), then `given`."""
    parser = argparse.ArgumentParser()
    discover_command.add_arguments(parser)
    return argparse.Namespace(**{**vars(parser.parse_args(["--timeout", "2"])), **given})


def ascii_lines(text: str) -> bool:
    return all(" " <= c <= "~" for c in text.replace("\n", ""))


@settings(max_examples=200, deadline=500)
@given(st.text())
def test_a_toml_string_reads_back_exactly_and_is_printable_ascii(value):
    written = discover_command.toml_string(value)
    assert tomllib.loads(f"x = {written}")["x"] == value
    assert ascii_lines(written) and "\n" not in written


def test_text_that_was_not_utf8_is_refused_as_a_toml_string_and_its_socket_left_to_fill_in(tmp_path):
    with pytest.raises(ValueError, match="not UTF-8"):
        discover_command.toml_string("/run/\udcff.sock")
    admission = Admission(StatsSocket("/run/\udcff.sock", "admin"), "maxconn server be_app/app", 64)
    admission, hints = discover_command._writable(admission, ["other"])
    assert admission is None and hints[0] == "other" and "\\uDCFF.sock is not a UTF-8 path" in hints[1]
    front = discover_command.Listener(8080, 0, 1, "haproxy", "", profile="haproxy", name="front", hints=hints)
    (tmp_path / "slotune.toml").write_text(discover_command.starter([front]))
    assert config.load(tmp_path / "slotune.toml").services[0].control is None


def test_hostile_metrics_names_config_and_process_names_write_only_escaped_values(tmp_path, serve, monkeypatch,
                                                                                   capsys):
    ref, lb, lb2 = (serve(reply(200, body)) for body in (reference_page(), haproxy_page(), haproxy_page()))
    process = "hap\nroxy\x1b[31m\u2028\x00"
    squatter = free_port()       # a process named after another row (nothing listens: probing it is refused)
    found = [listener(ref.port, "python3", "python3 -m app\n[services.x]"),
             listener(lb.port, process, "/usr/sbin/haproxy -f /etc/haproxy/haproxy.cfg"),
             listener(lb2.port, process, "/usr/sbin/haproxy -f /etc/haproxy/haproxy.cfg"),
             listener(squatter, f"haproxy-{lb.port}", "sleep")]
    admission = Admission(StatsSocket(ADDRESS, LEVEL), "maxconn server be_app/app", 64)
    monkeypatch.setattr(discover_command, "listeners", lambda: found)
    monkeypatch.setitem(discover_command.OWN_CONFIG, "haproxy",
                        lambda _pid, port: (admission if port == lb.port else None, HINTS))
    written = tmp_path / "slotune.toml"
    picks = ",".join(str(p) for p in (ref.port, lb.port, lb2.port, squatter))
    assert discover_command.run(args(pick=picks, write=str(written))) == 0
    table = capsys.readouterr().out
    assert ascii_lines(table) and "hap\\u000Aroxy\\u001B[31m\\u2028\\u0000" in table

    text = written.read_text()
    assert ascii_lines(text)
    services = tomllib.loads(text)["services"]
    assert set(services) == {"evil", f"haproxy-{lb.port}", f"haproxy-{lb2.port}", f"haproxy-{lb.port}-2"}
    evil = services["evil"]
    assert set(evil) == {"port", "profile", "metrics_url", "slo_p99_ms", *SIGNALS}
    assert {key: evil[key] for key in SIGNALS} == \
        {key: HOSTILE[-1] + HOSTILE[i] + "_" + signal for i, (key, signal) in enumerate(SIGNALS.items())}
    tuned = services[f"haproxy-{lb.port}"]
    assert set(tuned) == {"port", "profile", "metrics_url", "slo_p99_ms", "control", "tuners", "settings"}
    assert tuned["control"] == {"kind": "haproxy", "address": ADDRESS,
                                "targets": {"concurrency_limit": "maxconn server be_app/app"}}
    assert set(services[f"haproxy-{lb2.port}"]) == {"port", "profile", "metrics_url", "slo_p99_ms"}
    assert services[f"haproxy-{lb.port}-2"] == {"port": squatter, "slo_p99_ms": 500}
    assert len(config.load(written).services) == 4

    # comments: one line per hint, each value in them a TOML string that reads back when uncommented
    assert text.count("'s config: ") == 2 * len(HINTS)
    assert "# hap\\u000Aroxy\\u001B[31m\\u2028\\u0000's config: a b: not read" in text
    assert "# its stats socket is at level oper\\u000Aator\\u001B[2J:" in text
    commented = [line[2:] for line in text.splitlines() if re.match(r'# \w+ = "', line)]
    assert [tomllib.loads(line) for line in commented]
    # the hostile backend and server labels are no names HAProxy allows: the form is left to fill in
    assert '# concurrency_limit = "maxconn server BACKEND/SERVER"' in text


def test_backend_and_server_labels_haproxy_allows_fill_the_commented_target():
    front = discover_command.Listener(8080, 0, 1, "haproxy", "", profile="haproxy", name="front",
                                      series=[("haproxy_server_up", {"proxy": "be_app", "server": "app1"})])
    assert '# concurrency_limit = "maxconn server be_app/app1"' in discover_command.starter([front])


def test_a_process_name_that_is_not_utf8_or_holds_escapes_is_read_and_shown_inert():
    child = subprocess.Popen([sys.executable, "-c", "import sys; open('/proc/self/comm', 'wb').write("
                              "b'\\xff\\x1b]0;x\\x07'); print(flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()         # its name is set
        name = discover_command._comm(child.pid)
        assert name == "\ufffd\x1b]0;x\x07"
        row = discover_command.table([listener(9000, name, "")]).splitlines()[1]
        assert ascii_lines(row) and "\\uFFFD\\u001B]0;x\\u0007[4242]" in row
    finally:
        child.kill()
        child.wait()
