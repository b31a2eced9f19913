"""HTTP/1.x per service from its TCP sockets' reads and writes (bpf/http.bpf.c): the whole
response, its first body byte (a streaming LLM server's TTFT), the gaps between
its body writes (inter-token), its status class, and the responses that sent
the client away (429, 503: a limit or a queue timeout), timed apart. Requests for a
service's untimed paths (its own /metrics, health checks) are neither counted nor timed;
those of a service with routes are counted and timed by route class (model/routes.py)."""
import ctypes

from slotune.collectors.kernel import sockets
from slotune.collectors.kernel.family import Family, Map, Signal
from slotune.collectors.kernel.helpers import PT_REGS
from slotune.collectors.kernel.maps import set_entries
from slotune.model import routes as route_class, servers
from slotune.model.signals import HTTP_ARRIVED, HTTP_FIRST_BYTE, HTTP_REFUSED, HTTP_REQUEST, HTTP_STATUS, HTTP_WRITE_GAP

STATUS_CLASSES = {n: f"{n}xx" for n in range(2, 6)}   # label id: the status code's first digit
# The statuses that mean "not served, come back later" (label id: the code itself):
# nginx's limit_req/limit_conn (503 by default, 429 when configured), HAProxy's
# queue timeout and its rate limits, an engine's own admission control.
REFUSED = {"HTTP_TOO_MANY_REQUESTS": 429, "HTTP_SERVICE_UNAVAILABLE": 503}


SERVICE_IDS = 1024      # service ids with slots in the per-CPU counters below; ids start at 1
CLASS_SLOTS = 8         # http_statuses slots per service: the status code's first digit
UNTIMED_PATHS = 1024    # (service, path) pairs neither counted nor timed, over every service
CHECK_UNTIMED, CHECK_ROUTES = 1, 2   # http_checks: what a service's request lines are read for
ROUTES = 8              # route prefixes per service (config's `routes`), classed in the kernel
ROUTE_BYTES = 64        # the longest prefix: 8 words, compared a word at a time
ROUTE_SHIFT = 10        # a series' label id: its route class (1..ROUTES, OTHER) above its own (< 1024)
OTHER = ROUTES + 1      # the class of a request none of its service's routes starts


def path_hash(path: str) -> int:
    """FNV-1a (32 bits) of a path's bytes, as bpf/http.bpf.c hashes a request line's path."""
    h = 2166136261
    for byte in path.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


class Http(Family):
    name = source = "http"
    times = (servers.HTTP,)
    signals = (Signal(HTTP_REQUEST, "slotune_http_request_duration_seconds", None, "histogram",
                      "HTTP/1.x request latency seen from the kernel: the request's first read to the last "
                      "write of its response (all of a streamed one)"),
               Signal(HTTP_FIRST_BYTE, "slotune_http_first_byte_seconds", None, "histogram",
                      "HTTP/1.x request's first read to the first write of response body bytes "
                      "(a streaming LLM server's time to first token)"),
               Signal(HTTP_WRITE_GAP, "slotune_http_write_gap_seconds", None, "histogram",
                      "Time between two body writes of one HTTP/1.x response (chunks, SSE events: "
                      "a token stream's inter-token gap)"),
               Signal(HTTP_STATUS, "slotune_http_responses_total", "status", "counter",
                      "HTTP/1.x responses by status class (2xx..5xx), read from their status line"),
               Signal(HTTP_REFUSED, "slotune_http_refused_duration_seconds", "status", "histogram",
                      "HTTP/1.x responses that refused the request (429, 503), timed as http_request: "
                      "they are also in it"),
               Signal(HTTP_ARRIVED, "slotune_http_requests_arrived_total", None, "counter",
                      "HTTP/1.x requests read by the service, counted as they arrive (answered or not yet): "
                      "the load offered to it"))
    raw_tracepoints = sockets.POINTS   # shared with the tls family (hooks.py)
    hooks = (("sock_received", "http_sock_received"), ("sock_sent", "http_sock_sent"),
             ("sock_ended", "http_sock_ended"))
    claims = ("sock_received", "sock_sent")   # a socket it keeps as an HTTP/1.x connection is its alone
    helpers = PT_REGS                  # where a read's or a write's bytes are: the syscall's registers
    defines = {"HTTP_SERVICE_IDS": SERVICE_IDS, "HTTP_CLASS_SLOTS": CLASS_SLOTS,
               "HTTP_UNTIMED_PATHS": UNTIMED_PATHS, "HTTP_ROUTES": ROUTES, "HTTP_ROUTE_WORDS": ROUTE_BYTES // 8,
               "HTTP_ROUTE_SHIFT": ROUTE_SHIFT, "HTTP_OTHER_ROUTE": OTHER, **REFUSED}
    service_arrays = {"http_arrived": (HTTP_ARRIVED, 1), "http_statuses": (HTTP_STATUS, CLASS_SLOTS)}
    maps = {"http_conns": Map(65536, True, "an evicted connection's last response, answered but not yet over, "
                                           "is not timed (requests still waiting for their answer are kept in "
                                           "http_in_flight and brought back)"),
            "http_in_flight": Map(16384, False, "requests waiting for their answer past it are not kept apart, "
                                                "so a flood of connections can evict them from http_conns before "
                                                "they are answered, and they go untimed")}

    def __init__(self):
        self.checks: dict[int, int] = {}                      # service id -> its http_checks bits, as set
        self.routes: dict[str, tuple[str, ...]] = {}          # service -> its routes, as set in http_routes
        self.own_label = {s.name: s.label for s in self.signals}
        self.defines = {**self.defines, **sockets.layout()}
        self.raw_tracepoints = sockets.points()
        self.tracepoints = sockets.syscall_points()

    def refresh(self, program, targets, service_ids) -> None:
        """The services' untimed paths (ServiceSpec.untimed()) into http_untimed, their routes
        into http_routes, and what each service's request lines are read for."""
        wanted = {(service_ids[name], path_hash(path)): 1 for name, procs in targets.items()
                  for path in procs.service.untimed()}
        set_entries(program.table("http_untimed"), ctypes.c_uint8, dict(list(wanted.items())[:UNTIMED_PATHS]))
        routes = {name: procs.service.routes for name, procs in targets.items() if procs.service.routes}
        sets = program.table("http_routes")
        for name, prefixes in routes.items():
            if self.routes.get(name) != prefixes:
                sets[sets.Key(service_ids[name])] = route_set(sets.Leaf, prefixes)
        for name in self.routes.keys() - routes.keys():
            sets.pop(sets.Key(service_ids[name]), None)
        self.routes = routes
        checks = {sid: CHECK_UNTIMED for sid, _ in wanted}
        for name in routes:
            checks[service_ids[name]] = checks.get(service_ids[name], 0) | CHECK_ROUTES
        table = program.table("http_checks")
        for sid in checks.keys() | self.checks.keys():
            if 0 <= sid < SERVICE_IDS and checks.get(sid, 0) != self.checks.get(sid, 0):
                table[ctypes.c_int(sid)] = ctypes.c_uint8(checks.get(sid, 0))
        self.checks = checks

    def label(self, signal: str, label_id: int, service: str) -> str:
        route, own = divmod(label_id, 1 << ROUTE_SHIFT)
        value = str(own) if signal == HTTP_REFUSED else STATUS_CLASSES.get(own, "") if signal == HTTP_STATUS else ""
        if not route:
            return value
        routes = self.routes.get(service, ())
        name = self.own_label[signal]
        return route_class.label(routes[route - 1] if route <= len(routes) else route_class.OTHER,
                                 {name: value} if name else {})


def route_set(leaf, routes: tuple[str, ...]):
    """A service's routes as bpf/http.bpf.c's struct http_route_set: each prefix's bytes
    (zero-padded), a mask of 0xff over them, and its length."""
    out = leaf()
    for i, route in enumerate(routes[:ROUTES]):
        prefix = route.encode()[:ROUTE_BYTES]
        ctypes.memmove(out.route[i].word, prefix, len(prefix))
        ctypes.memset(out.route[i].mask, 0xFF, len(prefix))
        out.len[i] = len(prefix)
    return out
