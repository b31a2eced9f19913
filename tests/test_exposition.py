"""The fast exposition reader (daemon/collectors/exposition.py) against
prometheus_client's own parser, the independent reference: on what real client
libraries write (prometheus_client's registry with its process and GC collectors,
the engines' documented expositions) it reads the same families and samples
without calling that parser; on odd and broken text, and on thousands of random
edits of a plain body, every outcome (what the collector keeps, or the error)
is the parser's."""
import random
import re

import pytest
from prometheus_client import (CollectorRegistry, Counter, Enum, Gauge, GCCollector, Histogram, Info,
                               PlatformCollector, ProcessCollector, Summary, generate_latest)
from prometheus_client.parser import text_string_to_metric_families

from slotune.collectors import exposition, service_metrics
from slotune.collectors.client_body import Known
from slotune.collectors.exposition import BUILT, families
from slotune.profiles import reference
from tests.profiles import exposition as engines


def client_library_body() -> str:
    """What a Python service exports: prometheus_client's registry, default collectors included."""
    r = CollectorRegistry()
    ProcessCollector(registry=r)
    GCCollector(registry=r)
    PlatformCollector(registry=r)
    h = Histogram("gateway_request_duration_seconds", "time to answer", ["outcome"], registry=r,
                  buckets=(.005, .01, .025, .05, .1, .5, 1, 5))
    c = Counter("gateway_tool_calls_total", "tool calls", ["tool", "outcome"], registry=r)
    plain = Counter("gateway_cache_requests", "lookups", ["level"], registry=r)
    g = Gauge("gateway_inflight_requests", "in flight", registry=r)
    s = Summary("gateway_payload_bytes", "payload", registry=r)
    Info("gateway_build", "build", registry=r).info({"version": "1.2", "commit": "abc"})
    Enum("gateway_state", "state", states=["up", "down"], registry=r).state("up")
    rng = random.Random(1)
    for _ in range(300):
        h.labels(rng.choice(["ok", "error", "rejected"])).observe(rng.expovariate(20))
        c.labels(rng.choice(["search", "calc"]), rng.choice(["ok", "error"])).inc()
        plain.labels("l1").inc(0.5)
        s.observe(rng.random() * 1000)
    g.set(-3)
    return generate_latest(r).decode()


PLAIN = {
    "prometheus_client": client_library_body(),
    **{name: getattr(engines, name)(3) for name in ("vllm", "sglang", "tgi", "triton", "envoy", "litellm")},
    "edges": "\n".join([
        "# a comment", "", "# TYPE a_total counter", 'a_total{x="1"} +5 1700000000000', 'a_total{x="2"} -5',
        "# TYPE b counter", "b 1e3", "b_created 1.7e9", "# HELP c what c is, with \"quotes\" and \\ too",
        "# TYPE c gauge", "c{} NaN", 'c{k="}{,=",} Inf', 'c{k="v"}   -Inf', "stray_sample 1",
        "c 2", "# HELP d only help", "d 4", "# TYPE e histogram", 'e_bucket{le="0.5"} 1.0',
        'e_bucket{le="+Inf"} 2', "e_sum .5", "e_count 2", "e_created 5.", "\t# TYPE f gauge \r", "f 7\r", ""]),
}

ODD = {   # each leaves the plain form: prometheus_client's parser decides
    "escaped label value": '# TYPE g gauge\ng{path="a\\"b\\\\c\\nd"} 1\n',
    "label named twice": '# TYPE g gauge\ng{a="1",a="2"} 1\n',
    "label named twice, apart": '# TYPE g gauge\ng{a="1",b="2",c="3",b="4"} 1\n',
    "reserved label": '# TYPE g gauge\ng{__x="1"} 1\n',
    "name among the labels": '# TYPE g gauge\n{__name__="g",a="1"} 1\n',
    "quoted utf-8 name": '# TYPE "g.h" gauge\n{"g.h",a="1"} 1\n',
    "retyped family": "# TYPE g gauge\ng 1\n# TYPE g counter\ng 2\n",
    "type missing": "# TYPE g\ng 1\n",
    "unknown type": "# TYPE g gaugeish\ng 1\n",
    "empty counter name": "# TYPE _total counter\n_total 1\n",
    "not the format": "this is { not the prometheus format\n",
    "value with underscore": "# TYPE g gauge\ng 1_000\n",
    "hex value": "# TYPE g gauge\ng 0x10\n",
    "float timestamp": "# TYPE g gauge\ng 1 1.5\n",
    "tab before the value": "# TYPE g gauge\ng\t1\n",
    "bare help": "# HELP\n# TYPE g gauge\ng 1\n",
    "exemplar": '# TYPE g_total counter\ng_total 1 # {trace_id="a"} 1\n',
}


def read(fams) -> list:
    """What a reader can see of families: those of the types the collector reads, with
    their samples (names, labels, values as written: int or float, timestamps)."""
    return [(f.name, f.type, [(s.name, s.labels, repr(s.value), s.timestamp) for s in f.samples])
            for f in fams if f.type in BUILT and f.samples]


def outcome(parse):
    try:
        return read(parse())
    except ValueError as exc:
        return ("ValueError", str(exc))


def reference_outcome(text: str):
    return outcome(lambda: text_string_to_metric_families(text))


def kept(text: str, wanted, known=None):
    """What the collector keeps of a body (service_metrics.parse), or its error."""
    try:
        hists, counters, gauges = service_metrics.parse(text, wanted, known)
    except ValueError as exc:
        return ("ValueError", str(exc))
    return ({k: (h.bounds_s, h.counts.tolist(), h.total_s) for k, h in hists.items()},
            {k: repr(v) for k, v in counters.items()}, {k: repr(v) for k, v in gauges.items()})


@pytest.mark.parametrize("name", list(PLAIN))
def test_plain_bodies_are_read_as_the_parser_reads_them_without_it(name, monkeypatch):
    text = PLAIN[name]
    expected = reference_outcome(text)
    assert expected and not isinstance(expected[0], str)

    def not_called(_text):
        raise AssertionError("the plain form went to prometheus_client's parser")
    monkeypatch.setattr(exposition, "text_string_to_metric_families", not_called)
    assert outcome(lambda: families(text)) == expected


@pytest.mark.parametrize("name", list(ODD))
def test_odd_text_gets_the_parsers_answer(name):
    text = ODD[name]
    assert outcome(lambda: families(text)) == reference_outcome(text)


def test_a_family_not_read_keeps_no_samples_and_the_collector_keeps_the_same():
    text = PLAIN["prometheus_client"]
    wanted = reference.PROFILE.wants
    fams = families(text, wanted)
    assert {f.name for f in fams if f.samples} == {"gateway_request_duration_seconds", "gateway_tool_calls",
                                                   "gateway_inflight_requests"}
    assert not [f for f in fams if f.name.startswith(("process_", "python_")) and f.samples]
    assert kept(text, wanted) == _kept_by_the_parser(text, wanted)


def _kept_by_the_parser(text, wanted):
    real = service_metrics.families, service_metrics.client_form
    service_metrics.families = lambda text, wanted: text_string_to_metric_families(text)
    service_metrics.client_form = lambda text: False
    try:
        return kept(text, wanted)
    finally:
        service_metrics.families, service_metrics.client_form = real


def test_client_library_bodies_are_kept_from_their_client_form():
    """Bodies as client libraries write them take the whole-body reader (client_form),
    which keeps what the parser's families give, scrape after scrape with what each
    line means remembered; the other bodies do not."""
    assert all(exposition.client_form(PLAIN[name]) for name in PLAIN if name != "edges")
    assert not exposition.client_form(PLAIN["edges"])
    assert not [name for name, text in ODD.items() if exposition.client_form(text)]
    wanted = reference.PROFILE.wants
    known = Known()
    for seed in range(3):
        random.seed(seed)
        text = client_library_body() + PLAIN["vllm"]
        assert kept(text, wanted, known) == _kept_by_the_parser(text, wanted) == kept(text, wanted)
    assert known.meanings and known.shape
    known = Known()     # the same lines in families of another type or name mean something else
    for text in ("# TYPE a gauge\na 1\n", "# TYPE a counter\na 1\n", "# TYPE a_total counter\na_total 1\n",
                 "# TYPE x histogram\nx_count 1\n", "# TYPE x_count gauge\nx_count 1\n"):
        assert kept(text, lambda name: True, known) == _kept_by_the_parser(text, lambda name: True), text


EDITS = ['"', "\\", "{", "}", ",", "=", " ", "\t", "#", "_", ":", ".", "e", "+", "-", "Inf", "NaN", "\n",
         "le", "0", "9", "x", "TYPE", "HELP", "_total", "_bucket", "\r", "é"]


def edited(rng, text: str) -> str:
    """A few random edits: a character or token put in, taken out, a line repeated or moved."""
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(text))
        kind = rng.random()
        if kind < 0.5:
            text = text[:i] + rng.choice(EDITS) + text[i:]
        elif kind < 0.8:
            text = text[:i] + text[i + rng.randint(1, 4):]
        else:
            lines = text.split("\n")
            j = rng.randrange(len(lines))
            lines.insert(rng.randrange(len(lines)), lines[j])
            text = "\n".join(lines)
    return text


WANTED = (lambda name: True), (lambda name: not name.startswith(("b", "c", "vllm:e2e")))


def test_random_edits_of_a_plain_body_get_the_parsers_outcome():
    """3000 bodies, each a plain one with a few random edits: what the collector keeps,
    or the error it reports, is what it kept and reported with prometheus_client's
    parser alone."""
    base = PLAIN["edges"] + PLAIN["vllm"].split("# TYPE vllm:num_requests_running")[0][-600:]
    rng = random.Random(2112)
    plain = 0
    for _ in range(3000):
        text = edited(rng, base)
        try:
            exposition._plain(text, WANTED[0])
            plain += 1
        except exposition._Unusual:
            pass
        for wanted in WANTED:
            assert kept(text, wanted) == _kept_by_the_parser(text, wanted), repr(text)
        assert outcome(lambda text=text: families(text)) == reference_outcome(text), repr(text)
    assert plain > 500, plain      # the fast path was taken often


def test_random_edits_of_a_client_library_body_get_the_parsers_outcome():
    """The same for 600 edits of a body in client form, what each line means remembered
    across all of them (one `known` per wanted, as the collector keeps one per service)."""
    base = PLAIN["prometheus_client"]
    rng = random.Random(2113)
    known = (Known(), Known())
    whole = 0
    for _ in range(600):
        text = edited(rng, base)
        whole += exposition.client_form(text)
        for wanted, lines in zip(WANTED, known):
            assert kept(text, wanted, lines) == _kept_by_the_parser(text, wanted), repr(text)
    assert whole > 30, whole      # the whole-body reader was taken often


def test_a_body_of_the_same_shape_is_read_from_it(monkeypatch):
    """A service's next body, its lines the same but for their values (the service a
    second later), is read from the last body's shape (client_body.Shape) without
    client_form() judging it again, and keeps what the parser gives; a line added, a
    header changed or a value the grammar refuses sends the body to client_form(), and
    the outcome is still the parser's."""
    judged = []
    real = service_metrics.client_form
    monkeypatch.setattr(service_metrics, "client_form", lambda text: judged.append(text) or real(text))
    base = client_library_body()

    def scaled(k: int) -> str:      # every plain number of every sample times k: buckets stay cumulative
        return re.sub(r"(?m)^([^#\n][^\n]* )([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)$",
                      lambda m: f"{m[1]}{float(m[2]) * k!r}", base)
    wanted = reference.PROFILE.wants
    known = Known()
    for k in range(1, 6):
        text = scaled(k)
        assert text != base or k == 1
        assert kept(text, wanted, known) == _kept_by_the_parser(text, wanted)
    assert len(judged) == 1 and known.shape is not None
    grown = scaled(6).replace('gateway_tool_calls_total{outcome="ok",tool="calc"}',
                              'gateway_tool_calls_total{outcome="ok",tool="web"} 1.0\n'
                              'gateway_tool_calls_total{outcome="ok",tool="calc"}')
    broken = scaled(8).replace("gateway_inflight_requests -3.0", "gateway_inflight_requests -3.0.1")
    retyped = scaled(11).replace("# TYPE gateway_inflight_requests gauge", "# TYPE gateway_inflight_requests counter")
    for text in (grown, scaled(7), broken, scaled(10), retyped):
        assert kept(text, wanted, known) == _kept_by_the_parser(text, wanted)
    assert judged[1:] == [grown, scaled(7), broken, retyped]    # scaled(10): the shape of scaled(7)
