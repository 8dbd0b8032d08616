# SPDX-License-Identifier: GPL-2.0-or-later
"""Naming of data accesses for the store, vectorised: a chunk of accesses gets
its names with numpy lookups in sorted interval tables, never a Python call
per access.  Python runs once per distinct instruction (``func+0xoff``) and
once per distinct (DWARF variable, offset) pair (``points[3].y``).

Names (the columns of the store's accesses table):

* ``symbol``: the object the address is in: a heap block's forged name
  (``<malloc0014@build_list+33>``, ``<freed:0014@...>`` for an access after
  it was freed), a DWARF variable, an ELF object symbol; null if none;
* ``offset``: address - the object's start (the region's start without one);
* ``variable``: the element or field of a DWARF variable (``values[3]``,
  ``points[2].y``), null elsewhere;
* ``region``: ``.bss of prog``, ``[heap]``, ``anon``...;
* ``instruction``: the accessing instruction, ``function+0xoff``.
"""

from __future__ import annotations

import numpy as np

from ..binary.address_space import AddressSpace
from ..binary.dwarf_vars import describe_in_variable
from ..binary.maps import parse_maps
from ..cache.disk import build_id
from ..errors import BinaryChangedError, CorruptTraceError
from .blocks import block_name, load_block_table
from .meta import read_meta
from .saved_maps import last_maps_text

OBJECT_KINDS = ("OBJECT", "COMMON", "TLS")


def address_space_of(directory: str) -> AddressSpace:
    """The modules and mappings of the traced process, from the last memory
    map the trace saved and the ELF files it names (read where they are)."""
    text = last_maps_text(directory)
    space = AddressSpace.from_maps(parse_maps(text) if text is not None else [])
    check_binaries(directory, space)
    return space


def check_binaries(directory: str, space: AddressSpace) -> None:
    """BinaryChangedError when a module's binary is not the one recorded (meta.json's
    modules[].build_id; traces without one are not checked)."""
    try:
        recorded = {m.get("path"): m.get("build_id") for m in read_meta(directory).get("modules") or []
                    if isinstance(m, dict)}
    except CorruptTraceError:
        return
    for module in space.modules:
        was = recorded.get(module.path)
        if not isinstance(was, str):
            continue
        now = build_id(module.image)
        if now != was:
            raise BinaryChangedError(
                f"{module.path} changed since {directory} was recorded (build-id {was[:12]}, now "
                f"{(now or 'none')[:12]}): its names would be wrong; record again, or put the "
                "recorded binary back")


class Intervals:
    """Sorted [start, end) intervals with a payload index; lookup of many
    addresses at once (the nearest interval starting at or before each
    address, and the one before it for nested intervals)."""

    def __init__(self, items: list[tuple[int, int, int]]):
        items.sort()
        self.starts = np.array([i[0] for i in items], dtype=np.uint64)
        self.ends = np.array([i[1] for i in items], dtype=np.uint64)
        self.ids = np.array([i[2] for i in items], dtype=np.int64)

    def find(self, addresses: np.ndarray) -> np.ndarray:
        """Index (into starts/ends/ids) of the interval holding each address, -1 for none."""
        out = np.full(len(addresses), -1, dtype=np.int64)
        if not len(self.starts) or not len(addresses):
            return out
        i = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        for back in (0, 1):
            j = i - back
            ok = (j >= 0) & (out < 0)
            jj = np.maximum(j, 0)
            ok &= (addresses < self.ends[jj]) & (addresses >= self.starts[jj])
            out[ok] = jj[ok]
        return out

    def lookup(self, addresses: np.ndarray) -> np.ndarray:
        """Payload of the interval holding each address, -1 for none."""
        j = self.find(addresses)
        return np.where(j >= 0, self.ids[np.maximum(j, 0)] if len(self.ids) else -1, -1)


class AccessNamer:
    def __init__(self, directory: str, space=None):
        self.directory = directory
        if space is None:
            space = address_space_of(directory)
        self.space = space
        self._code_names: dict[int, str] = {}
        self._variable_names: dict[tuple[int, int], str] = {}
        # static objects: DWARF variables first, then ELF object symbols
        self.object_names: list[str] = []
        self.object_vars: list = []          # the DWARF Variable, or None
        self.object_starts: list[int] = []
        items: list[tuple[int, int, int]] = []
        seen: set[int] = set()
        for mod in space.modules:
            if mod.name == "[vdso]":
                continue
            for var in mod.image.variables():
                if var.address and var.size:
                    start = mod.bias + var.address
                    self._add_object(items, start, var.size, var.name, var)
                    seen.add(start)
            for sym in mod.image.symbols:
                if sym.kind in OBJECT_KINDS and sym.address and sym.size:
                    start = mod.bias + sym.address
                    if start not in seen:
                        seen.add(start)
                        self._add_object(items, start, sym.size, sym.name, None)
        self.objects = Intervals(items)
        # regions: module sections, then the mappings of the memory map
        self.region_names: list[str] = []
        index: dict[str, int] = {}

        def region_id(label: str) -> int:
            if label not in index:
                index[label] = len(self.region_names)
                self.region_names.append(label)
            return index[label]

        self.sections = Intervals([(r[0], r[1], region_id(f"{r[2]} of {r[3].name}"))
                                   for r in space.sections])
        self.maps = Intervals([(m.start, m.end, region_id(m.label)) for m in space.mappings])
        self.unmapped = region_id("unmapped")
        # heap blocks by id: names are made only for the blocks accesses name
        self.blocks = load_block_table(directory)

    def _add_object(self, items, start: int, size: int, name: str, var) -> None:
        items.append((start, start + size, len(self.object_names)))
        self.object_names.append(name)
        self.object_vars.append(var)
        self.object_starts.append(start)

    # ----------------------------------------------------------------- names
    def code_names(self, rips: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """(codes, names): ``names[codes[i]]`` is ``function+0xoff`` of rips[i]."""
        unique, inverse = np.unique(rips, return_inverse=True)
        names = []
        for rip in unique.tolist():
            name = self._code_names.get(rip)
            if name is None:
                name = self._code_names[rip] = self.space.code_location(rip)
            names.append(name)
        return inverse.astype(np.int32), names

    def data_names(self, addr: np.ndarray, block: np.ndarray, freed: np.ndarray) -> dict:
        """symbol (codes, names), offset, variable (codes, names), region (codes, names)."""
        n = len(addr)
        symbol = np.full(n, -1, dtype=np.int64)
        offset = np.zeros(n, dtype=np.int64)
        # heap blocks (by the id each access carries); block k's name is
        # symbol 2k (live) or 2k+1 (freed), offset from its address
        rows = self.blocks.rows
        has_block = (block > 0) & (block <= len(rows))
        if has_block.any():
            b = block[has_block].astype(np.int64)
            symbol[has_block] = 2 * b + (freed[has_block] != 0)
            offset[has_block] = (addr[has_block] - rows["address"][b - 1]).astype(np.int64)
        base = 2 * (len(rows) + 1)
        # static objects
        rest = ~has_block
        obj = np.full(n, -1, dtype=np.int64)
        obj[rest] = self.objects.lookup(addr[rest])
        is_obj = obj >= 0
        if is_obj.any():
            starts = np.array(self.object_starts, dtype=np.uint64)
            symbol[is_obj] = base + obj[is_obj]
            offset[is_obj] = (addr[is_obj] - starts[obj[is_obj]]).astype(np.int64)
        # regions: a module's section, else a mapping; without an object, the
        # offset is from the region's start
        region = np.full(n, self.unmapped, dtype=np.int64)
        region_start = np.zeros(n, dtype=np.uint64)
        found = np.zeros(n, dtype=bool)
        for table in (self.sections, self.maps):
            todo = np.flatnonzero(~found)
            j = table.find(addr[todo])
            hit = j >= 0
            region[todo[hit]] = table.ids[j[hit]]
            region_start[todo[hit]] = table.starts[j[hit]]
            found[todo[hit]] = True
        bare = ~has_block & ~is_obj
        offset[bare] = (addr[bare] - region_start[bare]).astype(np.int64)
        symbol_codes, symbol_names = _compact(symbol, lambda keys: self._symbol_names(keys, base))
        variable = self._variables(obj, offset)
        region_codes, region_names = _compact(region, lambda keys: [self.region_names[k]
                                                                    for k in keys.tolist()])
        return {"symbol": (symbol_codes, symbol_names), "offset": offset,
                "variable": variable, "region": (region_codes, region_names)}

    def data_labels(self, addr: np.ndarray, block: np.ndarray, freed: np.ndarray) -> list[str]:
        """One string per address, as the store's ``data`` column reads: the
        variable, else symbol+offset, else region+offset."""
        names = self.data_names(addr, block, freed)
        sym_codes, sym_names = names["symbol"]
        var_codes, var_names = names["variable"]
        reg_codes, reg_names = names["region"]
        out = []
        for s, v, r, off in zip(sym_codes.tolist(), var_codes.tolist(), reg_codes.tolist(),
                                names["offset"].tolist()):
            if v >= 0:
                out.append(var_names[v])
            elif s >= 0:
                out.append(f"{sym_names[s]}+{off}")
            else:
                out.append(f"{reg_names[r]}+{off}")
        return out

    def _symbol_names(self, keys: np.ndarray, base: int) -> list[str]:
        """The names of symbol keys (sorted): heap block k is 2k (live) or 2k + 1
        (freed), below ``base``; the static objects from ``base`` on.  The blocks'
        rows are read column-wise (a trace may name hundreds of thousands)."""
        blocks = keys[keys < base]
        ids, freed = blocks >> 1, (blocks & 1).astype(bool)
        rows = self.blocks.rows[ids - 1]
        kinds, sites = self.blocks.kinds, self.blocks.sites
        names = [block_name(kinds[k], i, sites[t], f) for k, i, t, f in zip(
            rows["kind"].tolist(), ids.tolist(), rows["site"].tolist(), freed.tolist())]
        return names + [self.object_names[k - base] for k in keys[keys >= base].tolist()]

    def _variables(self, obj: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """DWARF element/field names, per distinct (variable, offset)."""
        codes = np.full(len(obj), -1, dtype=np.int32)
        is_var = obj >= 0
        if is_var.any():
            has_var = np.array([v is not None for v in self.object_vars], dtype=bool)
            is_var &= has_var[np.maximum(obj, 0)]
        if not is_var.any():
            return codes, []
        keys = (obj[is_var].astype(np.uint64) << np.uint64(32)) | offset[is_var].astype(np.uint64)
        unique, inverse = np.unique(keys, return_inverse=True)
        names = []
        for key in unique.tolist():
            pair = (key >> 32, key & 0xFFFFFFFF)
            name = self._variable_names.get(pair)
            if name is None:
                name = describe_in_variable(self.object_vars[pair[0]], pair[1])
                self._variable_names[pair] = name
            names.append(name)
        codes[is_var] = inverse.astype(np.int32)
        return codes, names


def _compact(ids: np.ndarray, names_of) -> tuple[np.ndarray, list[str]]:
    """Global ids (-1: none) -> (local codes, the names they index);
    ``names_of(unique ids, sorted)`` names them all."""
    codes = np.full(len(ids), -1, dtype=np.int32)
    present = ids >= 0
    if not present.any():
        return codes, []
    unique, inverse = np.unique(ids[present], return_inverse=True)
    codes[present] = inverse.astype(np.int32)
    return codes, names_of(unique)
