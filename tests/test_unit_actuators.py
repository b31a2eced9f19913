"""The shipped unit fits the actuators: each real actuator pushes a setting from inside the
unit's sandbox (its capabilities, NoNewPrivileges=, the file system view of ProtectSystem=strict
with the drop-in's ReadWritePaths=, its system call filter), into services laid out and owned
as Debian ships them; and each capability and drop-in path the unit's comments give for an
actuator is needed: without it, that actuator's push fails and the others' still land."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reference_stack import launcher
from tests.actuators.real_servers import haproxy, nginx
from tests.conftest import ROOT
from bench.unit_sandbox import unit_privileges, unit_values, unit_view
from tests.test_systemd import syscalls_made, unit_filter, unit_syscalls

NOBODY, NOGROUP = 65534, 65534
TRACING_CAPABILITIES = {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_SYS_PTRACE"}
# The unit's other capabilities and the drop-in's paths, as its comments give them -> the actuators they serve.
ACTUATOR_CAPABILITIES = {
    "CAP_DAC_OVERRIDE": {"file", "nginx"},   # write in a service's 0700 folder; open nginx's www-data 0640 logs
    "CAP_CHOWN": {"file"},                   # give the new settings file back to the service's user
    "CAP_KILL": {"file"},                    # signal a service run by another user
    "CAP_NET_BIND_SERVICE": {"nginx"},       # `nginx -t` binds nginx's listen ports, Debian's 80 among them
}
DROP_IN_PATHS = {"the settings file's folder": "file", "the nginx include's folder": "nginx",
                 "nginx's logs": "nginx", "nginx's pid file's folder": "nginx"}   # HAProxy's socket: none
# Calls outside the unit's filter that are made, refused (EPERM) and done without, and why.
REFUSED_AND_IGNORED = {"mbind": "OpenBLAS (numpy's) asks to keep the buffers it maps on the local node, "
                                "the kernel's default anyway, and goes on when refused"}

# Run in the sandbox: each actuator reads its setting and pushes one more; what became of each, as JSON.
PUSH_EACH = """
import json, sys
from slotune.actuators.file import FileActuator
from slotune.actuators.haproxy import HaproxyActuator
from slotune.actuators.nginx import NginxActuator
at = json.loads(sys.argv[1])
actuators = {
    "file": FileActuator(at["settings"], at["service_pid_file"], "SIGHUP", owns=lambda pid: pid == at["service"]),
    "nginx": NginxActuator(at["include"], at["conf"], {"limit": "limit_conn perserver {}"},
                           pid_file=at["nginx_pid_file"]),
    "haproxy": HaproxyActuator(at["socket"], {"limit": "maxconn server be_app/app"}),
}
outcome = {}
for name, actuator in actuators.items():
    try:
        value = actuator.current()["limit"] + 1
        actuator.push({"limit": value})
        outcome[name] = "pushed" if actuator.current()["limit"] == value else "not in force"
    except Exception as exc:
        outcome[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(outcome))
"""


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A service run by nobody with its settings and pid file in its own 0700 folder; nginx as
    Debian lays it out; HAProxy with its stats socket. Yields (what the actuators are pointed
    at, each of DROP_IN_PATHS' path here)."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (make test runs as root)")
    base = tmp_path_factory.mktemp("unit-actuators")
    own = base / "my-service"
    own.mkdir(mode=0o700)
    service = subprocess.Popen(["sh", "-c", "trap '' HUP; exec sleep 300"], user=NOBODY, group=NOGROUP,
                               extra_groups=[])
    (own / "settings.json").write_text('{"limit": 4, "name": "api"}\n')
    (own / "service.pid").write_text(f"{service.pid}\n")
    for path in (own, own / "settings.json", own / "service.pid"):
        os.chown(path, NOBODY, NOGROUP)
    (own / "settings.json").chmod(0o600)
    try:
        with nginx(base / "nginx", "limit_conn perserver 8;\n", debian=True) as ng, \
                haproxy(base / "haproxy", launcher.free_ports(1)[0]) as hp:
            at = {"settings": str(own / "settings.json"), "service_pid_file": str(own / "service.pid"),
                  "service": service.pid, "include": str(ng.include), "conf": str(ng.conf),
                  "nginx_pid_file": str(ng.pid_file), "socket": hp.socket}
            drop_in = {"the settings file's folder": own, "the nginx include's folder": ng.include.parent,
                       "nginx's logs": ng.access_log.parent, "nginx's pid file's folder": ng.pid_file.parent}
            yield at, drop_in
    finally:
        service.kill()
        service.wait()


def push_each(services, without: str = "", left_out: str = "", trace: Path | None = None) -> dict[str, str]:
    """What became of each actuator's push, run in the unit's sandbox less the capability `without`
    and the drop-in path `left_out`; with trace, under the unit's system call filter too, the
    calls made counted into trace."""
    at, drop_in = services
    writable = [path for name, path in drop_in.items() if name != left_out]
    tracer = unit_filter(trace) if trace else []
    result = subprocess.run([*unit_view(*writable, *([trace.parent] if trace else [])), *tracer,
                             *unit_privileges(without), sys.executable, "-c", PUSH_EACH, json.dumps(at)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_each_actuator_pushes_from_inside_the_units_sandbox(services, tmp_path):
    """File (a service-owned file in its 0700 folder, and a signal), nginx (`nginx -t`, reload, a
    new worker), HAProxy (its stats socket in a read-only folder): every push lands, and every
    system call made, nginx's included, is in the unit's filter or refused and done without."""
    trace = tmp_path / "syscalls"
    outcome = push_each(services, trace=trace)
    assert outcome == {"file": "pushed", "nginx": "pushed", "haproxy": "pushed"}, outcome
    at, _ = services
    assert json.loads(Path(at["settings"]).read_text())["name"] == "api"
    assert os.stat(at["settings"]).st_uid == NOBODY and os.stat(at["settings"]).st_mode & 0o777 == 0o600
    refused = syscalls_made(trace) - unit_syscalls() - REFUSED_AND_IGNORED.keys()
    assert not refused, f"{refused}: refused by the unit's filter, and the pushes did without; say why in " \
        "REFUSED_AND_IGNORED and the unit's comment, or allow them"


@pytest.mark.parametrize("capability", sorted(ACTUATOR_CAPABILITIES))
def test_each_actuators_capability_is_needed(services, capability):
    assert set(unit_values("CapabilityBoundingSet")) == TRACING_CAPABILITIES | set(ACTUATOR_CAPABILITIES), \
        "a capability in the unit with no reason given here, or one given here that the unit lacks"
    needs = ACTUATOR_CAPABILITIES[capability]
    outcome = push_each(services, without=capability)
    assert {name for name, said in outcome.items() if said != "pushed"} == needs, \
        f"without {capability} (needed by {', '.join(needs)}): {outcome}; a push that lands without it " \
        f"means the unit can drop {capability}"


@pytest.mark.parametrize("path", sorted(DROP_IN_PATHS))
def test_each_drop_in_path_is_needed(services, path):
    """HAProxy needs none: connecting to its socket writes nothing."""
    needs = DROP_IN_PATHS[path]
    outcome = push_each(services, left_out=path)
    assert {name for name, said in outcome.items() if said != "pushed"} == {needs}, outcome
    assert "Read-only file system" in outcome[needs], outcome
