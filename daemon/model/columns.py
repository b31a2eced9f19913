"""Per-window values over a service's history, handed from one call to the next.
A caller that reads every window of the history again each time it runs (the
control loop each second, attribution each span) keeps what it worked out with
the newest window; the next call, whose history is the same windows less some
at the front and more at the back, reads only the windows added since.
A value kept and never taken (the next call came late, or asked under another
key) stays with its window and holds the older windows of its call: History
lets it go when that window leaves, or each such value would keep the windows
before it alive, and those the ones before them, without end."""
from __future__ import annotations

import operator
from collections import deque
from typing import Any, Callable, Sequence

from slotune.model.window import Window

ROWS_KEPT = 4            # windows back a call looks for what the last call kept


def handed(ws: Sequence[Window], key) -> Any:
    """What the last call kept under key with its newest window, one of ws' ROWS_KEPT
    newest, taken off it; None where there is none."""
    return next((w.derived.pop(key) for w in ws[-1:-1 - ROWS_KEPT:-1] if key in w.derived), None)


def continued(held: Sequence[Window], ws: Sequence[Window]) -> int | None:
    """Where ws begins in held, when ws continues held (its windows from there are ws'
    first ones: some gone at the front, some new at the back); None when it does not."""
    first = next((i for i, w in enumerate(held) if w is ws[0]), None) if ws else None
    if first is None or len(held) - first > len(ws) or not all(map(operator.is_, held[first:], ws)):
        return None
    return first


def column(ws: Sequence[Window], key, value: Callable[[Window], object]) -> list:
    """value(w) for each of ws, from the column the last call kept under key (handed),
    reading only the windows added since; kept with ws' newest for the next call."""
    kept = handed(ws, key)
    first = continued(kept[0], ws) if kept is not None else None
    if first is None:
        values = [value(w) for w in ws]
    else:
        values = kept[1][first:]
        values += [value(w) for w in ws[len(values):]]
    if ws:
        ws[-1].derived[key] = (ws, values)
    return values


class History(deque):
    """A service's windows, oldest first, the newest maxlen of them: a window pushed
    out takes what was kept with it (Window.derived)."""

    def append(self, w: Window) -> None:
        if len(self) == self.maxlen:
            self[0].derived.clear()
        super().append(w)
