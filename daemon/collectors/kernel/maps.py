"""Reading and writing BPF maps from user space: every entry in one batch call
where the kernel allows it, and writes of only what differs."""
from __future__ import annotations

import ctypes

U32, U16 = ctypes.c_uint32, ctypes.c_uint16


def items(table) -> list:
    """All entries of a hash map, in one batch call when the kernel allows it;
    plain integers come back as int, structs as their ctypes value."""
    try:
        pairs = list(table.items_lookup_batch())
    except Exception:
        pairs = list(table.items())
    return [(_plain(k), _plain(v)) for k, v in pairs]


def _plain(value):
    return value.value if isinstance(value, ctypes._SimpleCData) else value


def set_entries(table, valtype, wanted: dict[tuple, int]) -> None:
    """Make a map keyed by a struct hold exactly `wanted`, keys given as tuples of
    every field in order (only writes the differences)."""
    present = {tuple(getattr(k, f) for f, _ in k._fields_): v for k, v in items(table)}
    for key, value in wanted.items():
        if present.get(key) != value:
            table[table.Key(*key)] = valtype(value)
    for key in present.keys() - wanted.keys():
        try:
            del table[table.Key(*key)]
        except KeyError:
            pass
