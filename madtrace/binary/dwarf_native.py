# SPDX-License-Identifier: GPL-2.0-or-later
"""The DWARF of one ELF file as mtdwarf (dwarf_reader.c, libdw) writes it:
variables with their types, and the line table.  ``read_dwarf(path)`` runs
the reader; ``parse_dwarf(payload)`` turns its output (the symbol cache's
payload, dwarf_cache.py) into ``DwarfData``: ``variables`` (``dwarf_vars.Variable``
with ``TypeInfo`` types, the same as ``dwarf_vars.load_variables`` gives) and
``lines`` (``dwarf_lines.LineTable``).  On libpython3.11 (9 MB of
.debug_info): 0.3 s and 60 MB in the reader, where pyelftools takes 38 s and
725 MB for the same variables and lines."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import numpy as np

from ..cache.disk import CorruptEntry
from ..errors import TracerInternalError
from ..native import NATIVE_DIR
from .dwarf_lines import LineTable
from .dwarf_vars import (UNKNOWN, VOID, Member, TypeInfo, Variable, array_type, enum_type,
                         link_alias, link_pointer, struct_type)

READER = os.path.join(NATIVE_DIR, "mtdwarf")
MAGIC = b"MTDW0001"
NONE = 0xFFFFFFFF
TYPE_DTYPE = np.dtype([("kind", "<u4"), ("name", "<u4"), ("size", "<u8"), ("target", "<i8"),
                       ("first", "<u4"), ("n", "<u4"), ("tag", "<u4"), ("explicit", "<u4")])
MEMBER_DTYPE = np.dtype([("name", "<u4"), ("pad", "<u4"), ("offset", "<u8"), ("size", "<u8"),
                         ("type", "<i8")])
VAR_DTYPE = np.dtype([("name", "<u4"), ("scope", "<u4"), ("cu", "<u4"), ("external", "<u4"),
                      ("address", "<u8"), ("type", "<i8")])
LINE_DTYPE = np.dtype([("address", "<u8"), ("file", "<i4"), ("line", "<i4")])
SECTIONS = {b"STRS": np.dtype("u1"), b"TYPE": TYPE_DTYPE, b"MEMB": MEMBER_DTYPE,
            b"DIMS": np.dtype("<i8"), b"VARS": VAR_DTYPE, b"LINE": LINE_DTYPE,
            b"FILE": np.dtype("<u4")}
# added by the cache (summaries): each variable's size and type name, so that a
# warm load builds a type only when a variable's fields are named
SUMMARY_SECTIONS = {b"VSIZ": np.dtype("<u8"), b"VTYN": np.dtype("<u4"), b"VSTR": np.dtype("u1")}
KINDS = ("base", "enum", "struct", "union", "class", "pointer", "reference", "typedef", "const",
         "volatile", "restrict", "atomic", "array", "function", "unknown")
_QUALIFIERS = frozenset(("const", "volatile", "restrict", "atomic"))


class DwarfFormatError(CorruptEntry):
    """The reader's output is not what it should be (a corrupt cache file)."""


@dataclass
class DwarfData:
    variables: list
    lines: LineTable


def read_dwarf(path: str, out: str, nice: int = 0) -> bool:
    """Runs the reader on the ELF file ``path``, writing ``out`` (``nice``: at
    that lower priority); False when the file has no DWARF."""
    if not os.path.exists(READER):
        raise TracerInternalError(f"the DWARF reader is not built ({READER} is missing): "
                                  "run `make native`")
    argv = [READER, path, out]
    if nice:
        argv = ["nice", "-n", str(nice)] + argv
    run = subprocess.run(argv, capture_output=True, text=True)
    if run.returncode == 2:
        return False
    if run.returncode != 0:
        raise TracerInternalError(f"the DWARF reader failed on {path}: {run.stderr.strip()}")
    return True


def split_sections(payload) -> dict[bytes, np.ndarray]:
    view = memoryview(payload)
    if bytes(view[:8]) != MAGIC:
        raise DwarfFormatError("not the DWARF reader's output")
    at, out = 8, {}
    while at < len(view):
        if at + 20 > len(view):
            raise DwarfFormatError("truncated section header")
        tag = bytes(view[at:at + 4])
        count, size = np.frombuffer(view[at + 4:at + 20], dtype="<u8").tolist()
        dtype = SECTIONS.get(tag) or SUMMARY_SECTIONS.get(tag)
        if dtype is None or count * dtype.itemsize != size or at + 20 + size > len(view):
            raise DwarfFormatError(f"bad section {tag!r}")
        out[tag] = np.frombuffer(view[at + 20:at + 20 + size], dtype=dtype)
        at += 20 + size
    if not set(SECTIONS) <= set(out) or \
            set(out) - set(SECTIONS) not in (set(), set(SUMMARY_SECTIONS)):
        raise DwarfFormatError("missing sections")
    return out


class _Strings:
    def __init__(self, blob: np.ndarray):
        self.blob = blob.tobytes()
        self._cache: dict[int, str | None] = {NONE: None}

    def __call__(self, offset: int) -> str | None:
        s = self._cache.get(offset, False)
        if s is False:
            end = self.blob.find(b"\0", offset)
            if offset >= len(self.blob) or end < 0:
                raise DwarfFormatError("bad string offset")
            s = self._cache[offset] = self.blob[offset:end].decode("utf-8", "replace")
        return s


class _Types:
    """TypeInfo objects from the type records, built as dwarf_vars._TypeResolver
    builds them from DIEs (same kinds, names, sizes, members)."""

    def __init__(self, sections, string):
        self.sections = sections
        self.types = self.members = self.dims = None      # lists made at the first build
        self.string = string
        self.cache: dict[int, TypeInfo] = {}

    def get(self, index: int) -> TypeInfo:
        if index == -1:
            return VOID
        if self.types is None:
            self.types = self.sections[b"TYPE"].tolist()
            self.members = self.sections[b"MEMB"].tolist()
            self.dims = self.sections[b"DIMS"].tolist()
        if index < 0 or index >= len(self.types):
            return UNKNOWN
        hit = self.cache.get(index)
        return hit if hit is not None else self._build(index)

    def _build(self, index: int) -> TypeInfo:
        kind_code, name_off, size, target, first, n, tag, _explicit = self.types[index]
        if kind_code >= len(KINDS):
            raise DwarfFormatError("bad type kind")
        kind = KINDS[kind_code]
        name = self.string(name_off)
        if kind == "base":
            t = TypeInfo("base", name or "?", size)
        elif kind == "enum":
            t = enum_type(name, size)
        elif kind in ("struct", "union", "class"):
            t = self.cache[index] = struct_type(kind, name, size)
            for m_name, _pad, offset, m_size, m_type in self.members[first:first + n]:
                mt = self.get(m_type)
                t.members.append(Member(self.string(m_name), offset, m_size or mt.size, mt))
            return t
        elif kind in ("pointer", "reference"):
            t = self.cache[index] = TypeInfo("pointer", "?", size or 8)
            return link_pointer(t, self.get(target), kind == "reference")
        elif kind == "typedef" or kind in _QUALIFIERS:
            t = self.cache[index] = TypeInfo(kind, name or "?", 0)
            return link_alias(t, self.get(target))
        elif kind == "array":
            dims = [None if c < 0 else c for c in self.dims[first:first + n]]
            t = array_type(self.get(target), dims, size if _explicit else 0)
        elif kind == "function":
            t = TypeInfo("function", "function", 0)
        else:
            t = TypeInfo("unknown", name or _tag_name(tag), size)
        self.cache[index] = t
        return t


def _tag_name(tag: int) -> str:
    try:
        from elftools.dwarf.enums import ENUM_DW_TAG
        for name, value in ENUM_DW_TAG.items():
            if value == tag:
                return name
    except ImportError:
        pass
    return f"DW_TAG_{tag:#x}"


class CachedVariable:
    """A DWARF variable read from the cache: the attributes of
    ``dwarf_vars.Variable``; its ``type`` is built when first asked for."""

    __slots__ = ("name", "address", "size", "type_name", "scope", "external", "cu", "_types",
                 "_type_index", "_type")

    def __init__(self, name, address, size, type_name, scope, external, cu, types, type_index):
        self.name, self.address, self.size, self.type_name = name, address, size, type_name
        self.scope, self.external, self.cu = scope, external, cu
        self._types, self._type_index, self._type = types, type_index, None

    @property
    def type(self) -> TypeInfo:
        if self._type is None:
            self._type = self._types.get(self._type_index)
        return self._type

    def __repr__(self) -> str:
        return f"CachedVariable({self.name!r}, {self.address:#x}, {self.size}, {self.type_name!r})"


def _section(tag: bytes, items: np.ndarray) -> bytes:
    return tag + np.array([len(items), items.nbytes], dtype="<u8").tobytes() + items.tobytes()


def summarize(payload: bytes) -> tuple[bytes, DwarfData]:
    """The reader's output with each variable's size and type name appended
    (every type built once, here), and the ``DwarfData`` it holds."""
    data = parse_dwarf(payload)
    blob, offsets, index = bytearray(), [], {}
    for v in data.variables:
        off = index.get(v.type_name)
        if off is None:
            off = index[v.type_name] = len(blob)
            blob += v.type_name.encode() + b"\0"
        offsets.append(off)
    sections = split_sections(payload)
    lines = sections[b"LINE"]
    sections[b"LINE"] = lines[np.argsort(lines["address"], kind="stable")]   # sorted once
    sections[b"VSIZ"] = np.array([v.size for v in data.variables], dtype="<u8")
    sections[b"VTYN"] = np.array(offsets, dtype="<u4")
    sections[b"VSTR"] = np.frombuffer(bytes(blob), dtype="u1")
    return MAGIC + b"".join(_section(tag, items) for tag, items in sections.items()), data


def parse_dwarf(payload) -> DwarfData:
    """``DwarfData`` from the reader's output (``DwarfFormatError`` if corrupt);
    lazy types when the output has the cache's summaries."""
    sections = split_sections(payload)
    string = _Strings(sections[b"STRS"])
    types = _Types(sections, string)
    variables = []
    try:
        records = sections[b"VARS"].tolist()
        if b"VSIZ" in sections:
            type_name = _Strings(sections[b"VSTR"])
            if len(sections[b"VSIZ"]) != len(records) or len(sections[b"VTYN"]) != len(records):
                raise DwarfFormatError("summaries do not match the variables")
            for (name, scope, cu, external, address, type_index), size, tn in zip(
                    records, sections[b"VSIZ"].tolist(), sections[b"VTYN"].tolist()):
                variables.append(CachedVariable(string(name), address, size, type_name(tn),
                                                string(scope), bool(external), string(cu) or "",
                                                types, type_index))
        else:
            for name, scope, cu, external, address, type_index in records:
                t = types.get(type_index)
                variables.append(Variable(string(name), address, t.size, t, t.name,
                                          string(scope), bool(external), string(cu) or ""))
        rows = sections[b"LINE"]
        files = [os.path.normpath(string(off)) for off in sections[b"FILE"].tolist()]
        file_index = rows["file"].astype(np.int64)
        if len(file_index) and int(file_index.max()) >= len(files):
            raise DwarfFormatError("bad file index")
        lines = LineTable(rows["address"].copy(), file_index, rows["line"].astype(np.int64), files)
    except (IndexError, TypeError, RecursionError) as exc:
        raise DwarfFormatError(str(exc)) from None
    return DwarfData(variables, lines)
