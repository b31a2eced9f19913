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


def set_entries(table, keytype, valtype, wanted: dict[int, int]) -> None:
    """Make a u32/u16 -> u32/u16 map hold exactly `wanted` (only writes the differences)."""
    present = dict(items(table))
    for key, value in wanted.items():
        if present.get(key) != value:
            table[keytype(key)] = valtype(value)
    for key in present.keys() - wanted.keys():
        try:
            del table[keytype(key)]
        except KeyError:
            pass
