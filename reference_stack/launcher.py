"""Starting and stopping the whole stack as separate processes: the run dir
(admin token, self-signed certificate), the stack's own Redis, the inference
server, the tools, the TLS sidecar and the gateway; a state file records what
runs where, for `down`, tests and benches."""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .ports import port
from .service import DEFAULT_RUN_DIR
from .tools import TOOLS

ROOT = Path(__file__).resolve().parents[1]
STATE_FILE = "state.json"
# inference_args for a model small enough that tests on a busy 2-core machine stay quick.
SMALL_MODEL = ["--device", "cpu", "--d-model", "64", "--layers", "2", "--heads", "4", "--max-new-tokens", "4"]
# inference_args for paced capacity (reference_stack/paced.py): each token step 5 ms + 0.5 ms a
# sequence, 5 % jitter; with 12-token answers, 15 answers/s at batch 1 and 74 at batch 8, on any host.
PACED = ["--paced", "5,0.5,0.05"]
# The same small model in the LLM mode (docs/llm_serving.md), with a context of 128 + 256 tokens.
SMALL_LLM_MODEL = ["--mode", "llm", "--device", "cpu", "--d-model", "64", "--layers", "2", "--heads", "4",
                   "--max-prompt-tokens", "128", "--max-new-tokens", "256"]


@dataclass
class StackConfig:
    run_dir: Path = DEFAULT_RUN_DIR
    host: str = "127.0.0.1"
    gateway_port: int = field(default_factory=lambda: port("gateway"))
    inference_port: int = field(default_factory=lambda: port("inference"))
    sidecar_port: int = field(default_factory=lambda: port("sidecar"))
    sidecar_admin_port: int = field(default_factory=lambda: port("sidecar_admin"))
    redis_port: int = field(default_factory=lambda: port("redis"))
    tool_ports: dict[str, int] = field(default_factory=lambda: {name: port(name) for name in TOOLS})
    # Initial settings per service name (gateway, inference, sidecar, or a tool's name): {key: value}.
    settings: dict[str, dict[str, object]] = field(default_factory=dict)
    inference_args: list[str] = field(default_factory=list)    # e.g. ["--device", "cuda", "--layers", "6"]
    gateway_args: list[str] = field(default_factory=list)      # e.g. ["--parallel-tools", "4"]
    startup_timeout_s: float = 90.0

    @property
    def llm_mode(self) -> bool:
        """The inference server runs in LLM mode (`--mode llm`): the gateway then streams from its openai API."""
        args = self.inference_args
        return any(a == "--mode" and args[i + 1:i + 2] == ["llm"] for i, a in enumerate(args)) or "--mode=llm" in args

    @classmethod
    def on_free_ports(cls, run_dir: Path, **kwargs) -> "StackConfig":
        """A config whose every port is free on loopback now (tests, benches, a second stack beside one)."""
        p = free_ports(5 + len(TOOLS))
        return cls(run_dir=Path(run_dir), gateway_port=p[0], inference_port=p[1], sidecar_port=p[2],
                   sidecar_admin_port=p[3], redis_port=p[4], tool_ports=dict(zip(TOOLS, p[5:])), **kwargs)


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on loopback right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def init_run_dir(run_dir: Path) -> dict[str, Path]:
    """Create the run dir, a 0600 admin token and a self-signed certificate, each only if missing.
    Safe when several services' units run it at once (one at a time, under a lock file)."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(run_dir)
    token, cert, key = run_dir / "admin.token", run_dir / "tls.crt", run_dir / "tls.key"
    with open(run_dir / ".init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not token.exists():
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        if not (cert.exists() and key.exists()):
            openssl = shutil.which("openssl")
            if not openssl:
                raise RuntimeError("the openssl command is missing; install it (apt-get install openssl) "
                                   "to create the sidecar's certificate")
            old_umask = os.umask(0o077)
            try:
                subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
                                "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                                "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
            finally:
                os.umask(old_umask)
            os.chmod(cert, 0o644)
    return {"token_file": token, "cert": cert, "key": key}


def _check_private(run_dir: Path) -> None:
    """Refuse a run dir that is a link, that another user owns, or that others can write: it holds
    the admin token that a root daemon reads and sends, and whoever can swap it chooses that token."""
    st = os.lstat(run_dir)
    fix = "use a folder of your own (--run-dir, env SLOTUNE_STACK_RUN_DIR)"
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"run dir {run_dir} is not a folder (a symbolic link?); {fix}")
    if st.st_uid != os.geteuid():
        raise RuntimeError(f"run dir {run_dir} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                           f"{fix} or chown it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeError(f"run dir {run_dir} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                           f"chmod 700 {run_dir} or {fix}")


def _set_flags(values: dict[str, object]) -> list[str]:
    return [f for k, v in values.items() for f in ("--set", f"{k}={json.dumps(v) if isinstance(v, bool) else v}")]


def commands(cfg: StackConfig, files: dict[str, Path]) -> dict[str, list[str]]:
    """Every process of the stack: name -> argv. Services run as `python -m reference_stack <service>`."""
    py = [sys.executable, "-m", "reference_stack"]
    common = ["--host", cfg.host, "--run-dir", str(cfg.run_dir), "--token-file", str(files["token_file"])]
    redis_server = shutil.which("redis-server")
    if not redis_server:
        raise RuntimeError("redis-server is missing; install it (apt-get install redis-server)")
    procs = {"redis": [redis_server, "--port", str(cfg.redis_port), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--dir", str(cfg.run_dir), "--daemonize", "no"],
             "inference": py + ["inference", "--port", str(cfg.inference_port), *common,
                                *_set_flags(cfg.settings.get("inference", {})), *cfg.inference_args]}
    for name, tool_port in cfg.tool_ports.items():
        procs[name] = py + ["tool", "--name", name, "--port", str(tool_port), *common,
                            *_set_flags(cfg.settings.get(name, {}))]
    procs["sidecar"] = py + ["sidecar", "--port", str(cfg.sidecar_port), "--admin-port", str(cfg.sidecar_admin_port),
                             "--upstream", f"http://127.0.0.1:{cfg.inference_port}", "--cert", str(files["cert"]),
                             "--key", str(files["key"]), *common, *_set_flags(cfg.settings.get("sidecar", {}))]
    procs["gateway"] = py + ["gateway", "--port", str(cfg.gateway_port),
                             "--inference-url", f"http://127.0.0.1:{cfg.inference_port}",
                             "--sidecar-url", f"https://127.0.0.1:{cfg.sidecar_port}", "--cert", str(files["cert"]),
                             "--redis-url", f"redis://127.0.0.1:{cfg.redis_port}/0",
                             *[f for n, p in cfg.tool_ports.items() for f in ("--tool", f"{n}=http://127.0.0.1:{p}")],
                             *(["--inference-api", "openai"] if cfg.llm_mode else []),
                             *common, *_set_flags(cfg.settings.get("gateway", {})), *cfg.gateway_args]
    return procs


def urls(cfg: StackConfig) -> dict[str, str]:
    """Base URL of each service's plain-HTTP port (the one with /healthz, /metrics, /admin/config)."""
    out = {"gateway": f"http://127.0.0.1:{cfg.gateway_port}",
           "inference": f"http://127.0.0.1:{cfg.inference_port}",
           "sidecar": f"http://127.0.0.1:{cfg.sidecar_admin_port}"}
    out.update({name: f"http://127.0.0.1:{port}" for name, port in cfg.tool_ports.items()})
    return out


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _redis_up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _spawn(cfg: StackConfig, name: str, argv: list[str]) -> subprocess.Popen:
    """One of the stack's processes, in its own session, logging to <run dir>/<name>.log."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with open(cfg.run_dir / f"{name}.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cfg.run_dir, start_new_session=True)


def start(cfg: StackConfig) -> dict:
    """Start every process, wait until each answers, write <run dir>/state.json and return that state.
    On failure, stop what was started and raise RuntimeError with the failing process's log tail."""
    files = init_run_dir(cfg.run_dir)
    base = urls(cfg)
    state = {"run_dir": str(cfg.run_dir), "pids": {}, "urls": base, "query_url": base["gateway"] + "/query",
             "sidecar_tls_url": f"https://127.0.0.1:{cfg.sidecar_port}", "redis_port": cfg.redis_port,
             "ports": {"gateway": cfg.gateway_port, "inference": cfg.inference_port, "sidecar": cfg.sidecar_port,
                       "sidecar_admin": cfg.sidecar_admin_port, "redis": cfg.redis_port, **cfg.tool_ports},
             **{k: str(v) for k, v in files.items()}}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, argv in commands(cfg, files).items():
            procs[name] = _spawn(cfg, name, argv)
            state["pids"][name] = procs[name].pid
        deadline = time.monotonic() + cfg.startup_timeout_s
        waiting = dict(procs)
        while waiting:
            for name in list(waiting):
                if waiting[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with status {waiting[name].returncode}; "
                                       f"its log {cfg.run_dir / (name + '.log')} ends:\n{_tail(cfg.run_dir / (name + '.log'))}")
                if _redis_up(cfg.redis_port) if name == "redis" else _healthy(base[name]):
                    del waiting[name]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(waiting)} not healthy after {cfg.startup_timeout_s:.0f} s; "
                                   f"logs are in {cfg.run_dir}")
            time.sleep(0.2)
    except BaseException:
        _terminate(state["pids"])
        raise
    (cfg.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    return state


def restart(cfg: StackConfig, state: dict, name: str) -> float:
    """Stop one service and start it again as start() did (same argv, log, run dir), record its
    new pid in the state file; the seconds until it answered again. RuntimeError if it does not."""
    began = time.monotonic()
    _terminate({name: state["pids"][name]})
    proc = _spawn(cfg, name, commands(cfg, init_run_dir(cfg.run_dir))[name])
    state["pids"][name] = proc.pid
    (cfg.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    while not _healthy(state["urls"][name]):
        if proc.poll() is not None or time.monotonic() - began > cfg.startup_timeout_s:
            raise RuntimeError(f"{name} did not come back after a restart (exit {proc.poll()}); "
                               f"see {cfg.run_dir / (name + '.log')}")
        time.sleep(0.2)
    return time.monotonic() - began


def load_state(run_dir: Path) -> dict:
    path = Path(run_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RuntimeError(f"no stack state at {path}; start one with `python -m reference_stack up "
                           f"--run-dir {run_dir}`") from None


def _ours(pid: int) -> bool:
    """The pid still runs one of the stack's programs (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"reference_stack" in cmdline or b"redis-server" in cmdline


def _terminate(pids: dict[str, int], grace_s: float = 5.0) -> list[str]:
    """SIGTERM each of the stack's processes (gateway first), SIGKILL what outlives grace_s."""
    live = {name: pid for name, pid in reversed(list(pids.items())) if _ours(pid)}
    for pid in live.values():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for pid in live.values():
        while _ours(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _ours(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(pid)
    return list(live)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop(run_dir: Path) -> list[str]:
    """Stop the stack recorded in run_dir; returns the names of the processes that were running."""
    state = load_state(run_dir)
    stopped = _terminate(state["pids"])
    (Path(run_dir) / STATE_FILE).unlink(missing_ok=True)
    return stopped


def status(run_dir: Path) -> dict:
    """The recorded state with, per process, whether it runs and answers."""
    state = load_state(run_dir)
    state["health"] = {name: ("up" if (_redis_up(state["redis_port"]) if name == "redis"
                                       else _healthy(state["urls"][name])) else "down" if not _ours(pid)
                              else "not answering") for name, pid in state["pids"].items()}
    return state
