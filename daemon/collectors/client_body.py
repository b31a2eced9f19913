"""What the collector reads of a service's /metrics: each sample's meaning (a histogram
bucket, a sum, a counter or a gauge, keyed by family and labels), and, for a body in
the client libraries' form (exposition.client_form), the body's shape: its lines
less their values. A service answers a body of the same shape scrape after scrape,
only its numbers moving; such a body is read from the shape, its values checked
against the grammar and nothing else checked or taken apart again. Any other body
is judged whole by client_form() and, if it passes, gives the next shape."""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Callable, cast

from slotune.collectors.exposition import (BUILT, HEADER, LABELS, NUMBER, SAMPLE_LINE, family_name, number,
                                          sample_name)
from slotune.model import labels
from slotune.model.sample import Key

KNOWN_LINES = 16384        # per service, what a sample line's name and labels mean
_TAIL = rf"{NUMBER}(?: +-?[0-9]+)?"          # a sample line's value, and timestamp if any
TAILS = re.compile(rf"(?:{_TAIL}(?:\n{_TAIL})*)?")   # one a line

Meaning = tuple[str, Key, float] | None     # ("bucket", key, le) | ("sum"|"counter"|"gauge", key, 0.0) | not read


def sample_meaning(typ: str, family: str, series: str, sample_labels: dict[str, str],
                   wanted: Callable[[str], bool]) -> Meaning:
    """What one sample of a family (as the parser names them) is to the collector;
    ValueError for a histogram bucket without its bound, or with one that is not a number."""
    name = series if typ == "counter" else family
    if not wanted(name):
        return None
    key = (name, labels.key(sample_labels))
    if typ == "histogram":
        if series.endswith("_bucket"):
            le = float(sample_labels.get("le", "nan"))
            if math.isnan(le):
                raise ValueError(f"histogram bucket without le, or le not a number: {series}{{{key[1]}}}; "
                                 "give each bucket its upper bound, as le=\"0.5\"")
            return "bucket", key, le
        return ("sum", key, 0.0) if series.endswith("_sum") else None
    if typ == "counter" and not series.endswith("_created"):
        return "counter", key, 0.0
    return ("gauge", key, 0.0) if typ == "gauge" else None


def _picker(indexes: list[int]) -> Callable[[list[str]], tuple[str, ...]]:
    """seq -> the tuple of seq's items at these indexes, in one C call."""
    if len(indexes) == 1:
        only = indexes[0]
        return lambda seq: (seq[only],)
    return operator.itemgetter(*indexes) if indexes else (lambda seq: ())


@dataclass(frozen=True)
class Shape:
    """A body in client form less its values. read() gives the wanted samples of a body
    of this shape, or None for one whose lines differ in anything but their values."""
    lines: int                                  # lines, the "" after the last newline included
    fixed: Callable[[list[str]], tuple[str, ...]]   # lines -> those that must not change: HELP, TYPE, the last ""
    fixed_text: tuple[str, ...]
    samples: Callable[[list[str]], tuple[str, ...]]   # lines -> the sample lines
    heads: tuple[str, ...]                      # each sample line up to its value
    cuts: tuple[slice, ...]                     # and from there on: its value (and timestamp)
    read_at: tuple[tuple[int, Meaning], ...]    # (sample line, meaning) of each sample read

    @classmethod
    def of(cls, text: str, wanted: Callable[[str], bool], meanings: dict) -> "Shape":
        """The shape of a body client_form() accepted; `meanings` remembers, from one body
        to the next, what each line's name and labels mean (emptied when it holds more
        than KNOWN_LINES: a label with ever new values)."""
        if len(meanings) > KNOWN_LINES:
            meanings.clear()
        lines = text.split("\n")
        fixed: list[int] = []
        samples: list[int] = []
        heads: list[str] = []
        cuts: list[slice] = []
        read_at: list[tuple[int, Meaning]] = []
        typ = name = family = ""
        reads = False
        for i, line in enumerate(lines):
            if not line or line[0] == "#":
                fixed.append(i)
                header = HEADER.fullmatch(line)
                if header and header[1] == "TYPE":
                    name, typ = header[2], header[3]
                    family = family_name(name, typ)
                    reads = typ in BUILT and wanted(sample_name(typ, name))
                continue
            sample = SAMPLE_LINE.match(line)
            assert sample is not None, "client_form() accepted every sample line"
            series, label_text, cut = sample[1], sample[2] or "", sample.start(3)
            if reads:
                key = (typ, name, series, label_text)
                means = meanings.get(key, meanings)
                if means is meanings:
                    means = meanings[key] = sample_meaning(typ, family, sample_name(typ, series),
                                                           dict(LABELS.findall(label_text)), wanted)
                if means is not None:
                    read_at.append((len(samples), means))
            samples.append(i)
            heads.append(line[:cut])
            cuts.append(slice(cut, None))
        return cls(len(lines), _picker(fixed), tuple(lines[i] for i in fixed), _picker(samples), tuple(heads),
                   tuple(cuts), tuple(read_at))

    def read(self, text: str) -> list[tuple[Meaning, int | float]] | None:
        """(meaning, value) of each sample read, in the body's order; None when the body is
        not of this shape (then client_form() must judge it)."""
        lines = text.split("\n")
        if len(lines) != self.lines or self.fixed(lines) != self.fixed_text:
            return None
        samples = self.samples(lines)
        if not all(map(str.startswith, samples, self.heads)):
            return None
        tails = cast(list[str], list(map(operator.getitem, samples, self.cuts)))    # str[slice] is str
        if not TAILS.fullmatch("\n".join(tails)):
            return None
        return [(means, number(tails[i].partition(" ")[0])) for i, means in self.read_at]


class Known:
    """What the collector keeps of one service's bodies from one scrape to the next (for
    one `wanted`): what each sample line means, and the last body's shape."""

    def __init__(self):
        self.meanings: dict = {}
        self.shape: Shape | None = None
