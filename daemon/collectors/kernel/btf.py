"""Struct member offsets of the running kernel, read from its BTF
(/sys/kernel/btf/vmlinux), for the few probes that must read a kernel struct: the
installed headers may not match the running kernel, BTF always does. Pure Python
over the BTF format (include/uapi/linux/btf.h); no bpftool needed at run time."""
from __future__ import annotations

import functools
import struct

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F

# BTF kinds this module follows, and the bytes each kind's record carries after
# the common 12-byte header (per vlen entry where the kind has a vlen).
STRUCT, UNION, TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG = 4, 5, 8, 9, 10, 11, 18
FIXED = {1: 4, 3: 12, 14: 4, 17: 4}                  # INT, ARRAY, VAR, DECL_TAG
PER_ENTRY = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}   # STRUCT, UNION, ENUM, FUNC_PROTO, DATASEC, ENUM64
ALIASES = {TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG}


class BtfError(LookupError):
    """No BTF, or a struct member the running kernel does not have."""


class Btf:
    """The type section of one BTF blob, indexed by type id and by struct name."""

    def __init__(self, data: bytes):
        magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)
        if magic != MAGIC:
            raise BtfError("not BTF (bad magic)")
        self.data = data
        self.strings = hdr_len + str_off
        self.records = [0]                      # type id -> offset of its record (id 0 is void)
        self.by_name: dict[str, list[int]] = {}  # struct/union name -> type ids
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        while pos < end:
            name_off, info = struct.unpack_from("<II", data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            self.records.append(pos)
            if kind in (STRUCT, UNION) and name_off:
                self.by_name.setdefault(self.name(name_off), []).append(len(self.records) - 1)
            pos += 12 + FIXED.get(kind, 0) + PER_ENTRY.get(kind, 0) * vlen

    def name(self, off: int) -> str:
        start = self.strings + off
        return self.data[start:self.data.index(b"\0", start)].decode()

    def resolve(self, type_id: int) -> int:
        """The type behind typedefs and qualifiers."""
        while True:
            _, info, target = struct.unpack_from("<III", self.data, self.records[type_id])
            if (info >> 24) & 0x1F not in ALIASES:
                return type_id
            type_id = target

    def members(self, type_id: int):
        """(name, type id, byte offset) of a struct's or union's members (a bit field: its first byte)."""
        pos = self.records[type_id]
        _, info, _ = struct.unpack_from("<III", self.data, pos)
        if (info >> 24) & 0x1F not in (STRUCT, UNION):
            return
        for i in range(info & 0xFFFF):
            name_off, member_type, offset = struct.unpack_from("<III", self.data, pos + 12 + 12 * i)
            bits = offset & 0xFFFFFF if info >> 31 else offset
            yield (self.name(name_off) if name_off else ""), member_type, bits // 8

    def find(self, type_id: int, name: str) -> tuple[int, int] | None:
        """(type id, byte offset) of member `name`, looking into anonymous structs and unions."""
        for member, member_type, offset in self.members(type_id):
            if member == name:
                return member_type, offset
            if not member:
                inner = self.find(self.resolve(member_type), name)
                if inner:
                    return inner[0], offset + inner[1]
        return None

    def offset(self, struct_name: str, path: str) -> int:
        """Byte offset of `path` ("__sk_common.skc_net.net") from the start of struct_name."""
        for type_id in self.by_name.get(struct_name, []):
            total, current = 0, type_id
            for part in path.split("."):
                hit = self.find(self.resolve(current), part)
                if hit is None:
                    break
                current, off = hit
                total += off
            else:
                return total
        raise BtfError(f"the running kernel's BTF has no {struct_name}.{path}")


@functools.cache
def offsets(wanted: tuple[tuple[str, str], ...], path: str = VMLINUX) -> dict[tuple[str, str], int]:
    """{(struct, member path): byte offset} for each wanted pair, read once per process."""
    try:
        with open(path, "rb") as f:
            btf = Btf(f.read())
    except OSError as exc:
        raise BtfError(f"cannot read {path} ({exc.strerror}): the kernel was built without BTF") from None
    return {w: btf.offset(*w) for w in wanted}
