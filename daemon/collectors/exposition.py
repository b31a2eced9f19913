"""Reads the Prometheus text format as prometheus_client's parser reads it, fast.
families(): the families that parser yields; the plain lines client libraries
write (`# HELP`, `# TYPE`, `name{k="v",...} value [timestamp]`) are read with one
regular expression each, and the samples of a family the caller does not read
are checked, not built. Any other line sends the whole text to prometheus_client's
parser, so the families, and the errors, are always that parser's; that parser takes
time quadratic in a line's length, so it gets only text within MAX_UNUSUAL_CHARS
and lines within MAX_UNUSUAL_LINE (a ValueError for more).
client_form(): whether a body is exactly as client libraries write it (each family a
TYPE line, after a HELP line of the same name if any, then only its own samples; no
escapes, no stray whitespace), checked whole by one regular expression, for a
reader that takes apart only the samples it reads (client_body.py).
A body is a service's, so hostile: every regular expression here runs in time linear
in it, and ValueError is the one exception that comes out of reading one."""
from __future__ import annotations

import re
from typing import Callable, Iterable, NamedTuple

from prometheus_client.metrics_core import METRIC_TYPES
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'(?!__)[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'      # no escapes, no reserved __ names
NUMBER = r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|NaN)"
HEADER = re.compile(rf"#[ \t]+(HELP|TYPE)[ \t]+({NAME})(?:[ \t]+(\S.*))?")
SAMPLE = re.compile(rf"({NAME})(?:\{{((?:{LABEL},)*(?:{LABEL})?)\}})? +({NUMBER})(?: +(-?[0-9]+))?")
LABELS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')
# client_form(): a family is not named again by the header after it (that would join the
# two, or retype the first).
_SUFFIXES = {"counter|gauge|untyped|unknown": "", "histogram": "(?:_bucket|_count|_sum)",
             "summary": "(?:_count|_sum)?"}                  # the sample names each type allows
CLIENT_FORM = re.compile(
    rf"(?:(?:#[ \t]+HELP[ \t]+(?P<help>{NAME})(?:[ \t]+\S[^\n]*)?\n(?=#[ \t]+TYPE[ \t]+(?P=help)[ \t]))?"
    r"#[ \t]+TYPE[ \t]+(?:" + "|".join(
        rf"(?P<f{i}>{NAME})[ \t]+(?:{types})\n"
        rf"(?:(?P=f{i}){suffix}(?=[{{ ])(?:\{{(?:{LABEL},)*(?:{LABEL})?\}})? +{NUMBER}(?: +-?[0-9]+)?\n)*"
        rf"(?!#[ \t]+(?:HELP|TYPE)[ \t]+(?P=f{i})[ \t\n])" for i, (types, suffix) in enumerate(_SUFFIXES.items()))
    + "))*")
_LABEL_SETS = re.compile(rf"^{NAME}\{{([^\n]*)\}}", re.M)     # of client_form's sample lines: the labels
# A counter whose name is only the suffix: the parser's error.
_SUFFIX_ONLY = re.compile(r"^#[ \t]+TYPE[ \t]+_total[ \t]+counter\n", re.M)
SAMPLE_LINE = re.compile(rf"^({NAME})(?:\{{([^\n]*)\}})? +({NUMBER})", re.M)   # of client_form's lines: series, labels, value
SERIES_OF = {"counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""),
             "histogram": ("_count", "_sum", "_bucket")}     # a family's sample names, as the parser allows them
BUILT = ("counter", "gauge", "histogram")                    # the types whose samples are read
# What prometheus_client's parser is given: half a second of it at most on a slow core, less
# than the fast reader takes over a 4 MiB body (a line of n characters costs it n * n).
MAX_UNUSUAL_CHARS = 512 << 10
MAX_UNUSUAL_LINE = 4 << 10


class Family(NamedTuple):
    name: str
    type: str
    samples: list[Sample]


class _Unusual(Exception):
    """A line outside the plain form: prometheus_client's parser reads the text."""


def sample_name(typ: str, name: str) -> str:
    """The name the samples of a family declared `# TYPE name typ` carry once read: a
    counter's ends in _total (the parser adds it where the exporter leaves it out)."""
    if typ != "counter" or name.endswith("_total"):
        return name
    return name + "_total"


def families(text: str, wanted: Callable[[str], bool] = lambda name: True) -> Iterable:
    """The families of an exposition, as prometheus_client's parser yields them, less
    the samples of the counters, gauges and histograms whose sample_name is not wanted,
    and of every other type (those families come with no samples, or not at all);
    ValueError where that parser raises one, as late: after the families before it;
    and at once for text beyond that parser's budget (_within_the_parsers_budget)."""
    try:
        return _plain(text, wanted)
    except _Unusual:
        _within_the_parsers_budget(text)
        return _parsers_families(text)


def _parsers_families(text: str) -> Iterable:
    """prometheus_client's families of text; a ValueError for any error of that parser's
    (an IndexError, say, for `# TYPE \\x1c gauge`)."""
    try:
        yield from text_string_to_metric_families(text)
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(f"prometheus_client's parser: {type(exc).__name__}: {exc}") from None


def _within_the_parsers_budget(text: str) -> None:
    """ValueError for text outside the plain form that prometheus_client's parser would
    take too long over: more than MAX_UNUSUAL_CHARS, or a line over MAX_UNUSUAL_LINE."""
    fix = ("write the plain form client libraries write (label values without escapes, one space "
           "between fields), which has no such limit")
    if len(text) > MAX_UNUSUAL_CHARS:
        raise ValueError(f"{len(text)} characters with lines outside the plain form: more than the "
                         f"{MAX_UNUSUAL_CHARS} read of such a body; {fix}")
    lengths = list(map(len, text.split("\n")))
    longest = max(lengths)
    if longest > MAX_UNUSUAL_LINE:
        raise ValueError(f"line {lengths.index(longest) + 1}: {longest} characters in a body with lines "
                         f"outside the plain form, more than the {MAX_UNUSUAL_LINE} read of a line; {fix}")


def client_form(text: str) -> bool:
    """Whether a body is in the client libraries' form, which the parser reads as written
    (SAMPLE_LINE reads its sample lines)."""
    return (text.endswith("\n") and CLIENT_FORM.fullmatch(text) is not None and not _SUFFIX_ONLY.search(text)
            and not _label_named_twice(text))


def _label_named_twice(text: str) -> bool:
    """Whether a sample line of a body in client form names a label twice (the parser's
    error): a dict per line, in time linear in the body."""
    for label_text in _LABEL_SETS.findall(text):
        pairs = LABELS.findall(label_text)
        if len(dict(pairs)) != len(pairs):
            return True
    return False


def family_name(name: str, typ: str) -> str:
    """The name the parser gives the family declared `# TYPE name typ`: a counter's loses _total."""
    return name[:-6] if typ == "counter" and name.endswith("_total") else name


def number(text: str) -> int | float:
    """As the parser reads a NUMBER: an int where int() takes it, else a float."""
    return int(text) if text.lstrip("+-").isdigit() else float(text)


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    pairs = LABELS.findall(text)
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Unusual    # a label named twice: the parser's error
    return found


def _built(name: str, typ: str, samples: list[Sample]) -> Family:
    """The family as the parser closes it: a counter's name loses _total, its samples gain it."""
    if typ == "counter" and not name.endswith("_total"):
        samples = [s._replace(name=s.name + "_total") for s in samples]
    name = family_name(name, typ)
    typ = "unknown" if typ == "untyped" else typ
    if not name or typ not in METRIC_TYPES:
        raise _Unusual
    return Family(name, typ, samples)


def _plain(text: str, wanted: Callable[[str], bool]) -> list[Family]:
    """The parser's walk over the lines (a HELP or TYPE of a new name starts a family; a
    sample its family does not allow stands alone, untyped), for plain lines only."""
    out: list[Family] = []
    samples: list[Sample] = []
    allowed: tuple[str, ...] = ()
    name, typ, seen, built = "", "untyped", 0, False
    for line in text.split("\n"):
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":
            m = HEADER.fullmatch(line)
            if m is None:
                if "HELP" in line or "TYPE" in line:
                    raise _Unusual
                continue     # a comment
            kind, candidate, rest = m.groups()
            if kind == "HELP":
                if candidate != name:
                    if name:
                        out.append(_built(name, typ, samples))
                    name, typ, samples, seen, allowed = candidate, "untyped", [], 0, (candidate,)
            else:
                if rest is None or (candidate == name and seen):
                    raise _Unusual    # a TYPE without a type, or retyping a family with samples
                if candidate != name:
                    if name:
                        out.append(_built(name, typ, samples))
                    name, samples, seen = candidate, [], 0
                typ = rest
                allowed = tuple(name + s for s in SERIES_OF.get(typ, ("",)))
            built = typ in BUILT and wanted(sample_name(typ, name))
            continue
        m = SAMPLE.fullmatch(line)
        if m is None:
            raise _Unusual
        series, label_text, value, timestamp = m.groups()
        labels = _labels(label_text)
        if series not in allowed:
            if name:
                out.append(_built(name, typ, samples))
            name, typ, samples, seen, allowed, built = "", "untyped", [], 0, (), False
            continue     # a family of one untyped sample, which no reader reads
        seen += 1
        if built:
            samples.append(Sample(series, labels, number(value),
                                  number(timestamp) / 1000 if timestamp else None))
    if name:
        out.append(_built(name, typ, samples))
    return out
