"""A service with routes is judged on its routes' kernel HTTP series alone: each
route's series added into the series without a route label, `other` left out, the
other signals and the service's own metrics (whatever their labels) as they are."""
from slotune.model import routes
from slotune.model.histogram import Histogram

MS = 1_000_000


def test_the_routes_series_are_added_and_other_is_left_out():
    a, b, other = (Histogram.from_values([n * MS] * n) for n in (2, 3, 50))
    rtt, own = Histogram.from_values([MS]), Histogram.from_values([7 * MS])
    histograms = {("http_request", routes.label("/a", {})): a, ("http_request", routes.label("/b", {})): b,
                  ("http_request", routes.label(routes.OTHER, {})): other,
                  ("http_refused", routes.label("/b", {"status": "503"})): b, ("tcp_rtt", "db"): rtt,
                  ("request_seconds", "outcome=ok,route=/z"): own}
    counters = {("http_status", routes.label("/a", {"status": "5xx"})): 2.0,
                ("http_status", routes.label("/b", {"status": "5xx"})): 1.0,
                ("http_status", routes.label(routes.OTHER, {"status": "5xx"})): 9.0,
                ("http_arrived", routes.label(routes.OTHER, {})): 50.0, ("tcp_retransmits", "db"): 4.0}
    kept, counted = routes.judged(("/a", "/b"), histograms, counters)
    assert {key: h.count for key, h in kept.items()} == {
        ("http_request", ""): 5, ("http_refused", "503"): 3, ("tcp_rtt", "db"): 1,
        ("request_seconds", "outcome=ok,route=/z"): 1}
    assert kept[("http_request", "")].mean() == (2 * 2 + 3 * 3) * MS / 5 / 1e9
    assert counted == {("http_status", "5xx"): 3.0, ("tcp_retransmits", "db"): 4.0}


def test_without_routes_the_series_are_as_they_are():
    histograms, counters = {("http_request", ""): Histogram.from_values([MS])}, {("http_status", "5xx"): 1.0}
    assert routes.judged((), histograms, counters) == (histograms, counters)


def test_a_route_with_a_comma_or_an_equals_sign_is_one_label():
    label = routes.label("/a,b=c", {"status": "2xx"})
    kept, counted = routes.judged(("/a,b=c",), {}, {("http_status", label): 1.0})
    assert counted == {("http_status", "2xx"): 1.0}
