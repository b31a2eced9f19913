"""What `slotune discover` reads of a HAProxy's own configuration is a file another
user may write: any text reads to a config and hints, in time linear in its size,
and never ends discover (a 5 000-digit maxconn, a superscript two, a huge line)."""
import time

from hypothesis import given, settings, strategies as st

from slotune.profiles import haproxy_config
from slotune.profiles.haproxy_config import HaproxyConfig

WORDS = st.sampled_from(["global", "defaults", "frontend", "backend", "listen", "from", "maxconn", "bind",
                         "server", "server-template", "default-server", "default_backend", "use_backend",
                         "stats", "socket", "level", "admin", "#", "'", '"', "\\", ":80", "[::]:443",
                         "1-3", "²", "9" * 5000, "unix@/run/h.sock", "ipv6@:8080", "$X"])


def read(text: str) -> HaproxyConfig:
    cfg = HaproxyConfig()
    haproxy_config._parse(text, "haproxy.cfg", cfg)
    return cfg


@settings(max_examples=300, deadline=2000)
@given(st.lists(st.lists(st.one_of(WORDS, st.text(max_size=12)), max_size=8).map(" ".join), max_size=30)
       .map("\n".join))
def test_any_text_reads_to_a_config_and_hints(text):
    cfg = read(text)
    assert all(isinstance(p.ports, list) for p in cfg.proxies.values())


def test_counts_past_what_haproxy_writes_are_read_past():
    cfg = read("global\n  maxconn " + "9" * 5000 + "\nfrontend fe\n  maxconn ²\n  bind :80\n"
               "  default_backend be\nbackend be\n  server s1 127.0.0.1:81 maxconn 12345678901\n")
    assert cfg.global_maxconn is None and cfg.proxies["fe"].values.get("maxconn") is None
    assert cfg.proxies["be"].servers == {"s1": None} and cfg.proxies["fe"].ports == [(80, 80)]


def test_reading_time_is_linear_in_the_file():
    def took(n):
        text = "frontend fe\n" + "  bind " + ",".join(f"[::{i}]:8{i % 10}" for i in range(n)) + "\n" + \
               "  server-template s 1-9 a:1 maxconn 5\n" * n
        best = float("inf")
        for _ in range(3):     # CPU time: the reader's own work, whatever else the host runs
            began = time.process_time()
            read(text)
            best = min(best, time.process_time() - began)
        return best
    small, large = took(2000), took(4000)
    assert large < 3 * small + 0.005, (small, large)
