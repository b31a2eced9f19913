"""A real vLLM (its CPU build, from scripts/engine.sh) serving the tiny model on a
free loopback port, started once for the engine tests and stopped after them; and
what the tests read of it: its own /metrics, parsed with prometheus_client's parser."""
from __future__ import annotations

import contextlib
import threading
import urllib.request
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reference_stack.engine import serve
from reference_stack.launcher import free_ports
from tests.probes.conftest import kernel  # noqa: F401  (the live-kernel collector fixture)

NO_EOS = {"ignore_eos": True}     # every answer exactly max_tokens long: the tiny model's text is noise


@dataclass(frozen=True)
class Engine:
    port: int
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def page(self) -> str:
        """Its /metrics page as it is now."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def totals(self, *names: str) -> list[float]:
        """Each named sample summed over its label sets, from one read of the page."""
        found = dict.fromkeys(names, 0.0)
        for f in text_string_to_metric_families(self.page()):
            for s in f.samples:
                if s.name in found:
                    found[s.name] += s.value
        return list(found.values())


@pytest.fixture(scope="package")
def engine(tmp_path_factory):
    if why := serve.missing():
        pytest.fail(why)         # make test sets it up: its absence is a broken set-up, not a skip
    port, = free_ports(1)
    with serve.vllm(tmp_path_factory.mktemp("vllm"), port, *serve.SMALL_ENGINE) as proc:
        yield Engine(port, proc.pid)


@contextlib.contextmanager
def scraping(engine: Engine, paths=("/metrics", "/health"), every_s: float = 0.5):
    """GETs of paths every every_s in a thread, as slotune and Prometheus (each once a
    second or less) and a health check do, for the length of the block; yields the list
    of the statuses they got. Rendering vLLM's /metrics takes its API server a few ms,
    in which a new request waits in its socket unread: time the kernel, which starts at
    the read, does not see and the client does."""
    got: list[int] = []
    stop = threading.Event()

    def loop():
        while not stop.wait(every_s):
            for path in paths:
                with contextlib.suppress(OSError), urllib.request.urlopen(engine.url + path, timeout=5) as r:
                    r.read()
                    got.append(r.status)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield got
    finally:
        stop.set()
        t.join(10)
