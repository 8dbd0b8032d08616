# SPDX-License-Identifier: GPL-2.0-or-later
"""The DWARF of one ELF file as mtdwarf (dwarf_reader.c, libdw) writes it:
variables with their types, and the line table.  ``read_dwarf(path)`` runs
the reader; ``parse_dwarf(payload)`` turns its output (the symbol cache's
payload, symcache.py) into ``DwarfData``: ``variables`` (``dwarf_vars.Variable``
with ``TypeInfo`` types, the same as ``dwarf_vars.load_variables`` gives) and
``lines`` (``dwarf_lines.LineTable``).  On libpython3.11 (9 MB of
.debug_info): 0.3 s and 60 MB in the reader, where pyelftools takes 38 s and
725 MB for the same variables and lines."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

import numpy as np

from ..errors import TracerInternalError
from ..native import NATIVE_DIR
from .dwarf_lines import LineTable
from .dwarf_vars import UNKNOWN, VOID, Member, TypeInfo, Variable

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
KINDS = ("base", "enum", "struct", "union", "class", "pointer", "reference", "typedef", "const",
         "volatile", "restrict", "atomic", "array", "function", "unknown")
_QUALIFIERS = frozenset(("const", "volatile", "restrict", "atomic"))


class DwarfFormatError(ValueError):
    """The reader's output is not what it should be (a corrupt cache file)."""


@dataclass
class DwarfData:
    variables: list
    lines: LineTable


def read_dwarf(path: str, out: str) -> bool:
    """Runs the reader on the ELF file ``path``, writing ``out``; False when the
    file has no DWARF."""
    if not os.path.exists(READER):
        raise TracerInternalError(f"the DWARF reader is not built ({READER} is missing): "
                                  "run `make native`")
    run = subprocess.run([READER, path, out], capture_output=True, text=True)
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
        dtype = SECTIONS.get(tag)
        if dtype is None or count * dtype.itemsize != size or at + 20 + size > len(view):
            raise DwarfFormatError(f"bad section {tag!r}")
        out[tag] = np.frombuffer(view[at + 20:at + 20 + size], dtype=dtype)
        at += 20 + size
    if set(out) != set(SECTIONS):
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
        self.types = sections[b"TYPE"].tolist()
        self.members = sections[b"MEMB"].tolist()
        self.dims = sections[b"DIMS"].tolist()
        self.string = string
        self.cache: dict[int, TypeInfo] = {}

    def get(self, index: int) -> TypeInfo:
        if index == -1:
            return VOID
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
            t = TypeInfo("enum", f"enum {name}" if name else "enum", size)
        elif kind in ("struct", "union", "class"):
            t = TypeInfo(kind, f"{kind} {name}" if name else f"{kind} <anon>", size)
            self.cache[index] = t
            for m_name, _pad, offset, m_size, m_type in self.members[first:first + n]:
                mt = self.get(m_type)
                t.members.append(Member(self.string(m_name), offset, m_size or mt.size, mt))
            return t
        elif kind in ("pointer", "reference"):
            t = TypeInfo("pointer", "?", size or 8)
            self.cache[index] = t
            t.target = self.get(target)
            if t.target.kind == "function":
                t.name = "void (*)()"
            else:
                t.name = t.target.name + (" *" if kind == "pointer" else " &")
            return t
        elif kind == "typedef":
            t = TypeInfo("typedef", name or "?", 0)
            self.cache[index] = t
            t.target = self.get(target)
            t.size = t.target.size
            return t
        elif kind in _QUALIFIERS:
            t = TypeInfo(kind, "?", 0)
            self.cache[index] = t
            t.target = self.get(target)
            t.size = t.target.size
            tn = t.target.name
            if t.target.kind == "pointer":
                t.name = f"{tn} {kind}"
            elif t.target.kind == "array" and tn.startswith(kind + " "):
                t.name = tn
            else:
                t.name = f"{kind} {tn}"
            return t
        elif kind == "array":
            t = self._array(target, self.dims[first:first + n], size if _explicit else 0)
        elif kind == "function":
            t = TypeInfo("function", "function", 0)
        else:
            t = TypeInfo("unknown", name or _tag_name(tag), size)
        self.cache[index] = t
        return t

    def _array(self, element: int, dims: list[int], explicit: int) -> TypeInfo:
        t = self.get(element)
        counts = [None if c < 0 else c for c in dims] or [None]
        for count in reversed(counts):   # innermost dimension first
            dim = f"[{count}]" if count is not None else "[]"
            if t.kind == "array":
                base, _, rest = t.name.partition("[")
                name = f"{base}{dim}[{rest}"
            else:
                name = f"{t.name}{dim}"
            t = TypeInfo("array", name, t.size * count if count else 0, t, count)
        if explicit:
            t.size = explicit
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


def parse_dwarf(payload) -> DwarfData:
    """``DwarfData`` from the reader's output (``DwarfFormatError`` if corrupt)."""
    sections = split_sections(payload)
    string = _Strings(sections[b"STRS"])
    types = _Types(sections, string)
    variables = []
    try:
        for name, scope, cu, external, address, type_index in sections[b"VARS"].tolist():
            t = types.get(type_index)
            variables.append(Variable(string(name), address, t.size, t, t.name, string(scope),
                                      bool(external), string(cu) or ""))
        rows = sections[b"LINE"]
        files = [os.path.normpath(string(off)) for off in sections[b"FILE"].tolist()]
        file_index = rows["file"].astype(np.int64)
        if len(file_index) and int(file_index.max()) >= len(files):
            raise DwarfFormatError("bad file index")
        lines = LineTable(rows["address"].copy(), file_index, rows["line"].astype(np.int64), files)
    except (IndexError, TypeError, RecursionError) as exc:
        raise DwarfFormatError(str(exc)) from None
    return DwarfData(variables, lines)
