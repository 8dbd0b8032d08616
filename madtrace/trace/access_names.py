# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's dimensions of data accesses: each access row carries two ids
(its instruction, its data) given by the access pass in C (access_pass.py),
and the names are made once per id, here, into two small tables:

* ``instructions``: ``iid``, ``rip``, ``size``, ``instruction``
  (``function+0xoff``), one row per distinct (rip, size);
* ``data``: ``data``, ``symbol``, ``variable``, ``region``, ``base``,
  ``block``, ``freed``, one row per distinct thing an access touches: a heap
  block live or freed (with its region), a DWARF variable at one offset (its
  element or field), an ELF object, or a bare region; the access's offset is
  ``addr - base``.

A data key (the C side makes it) is ``kind << 62 | hi << 32 | lo``: kind 0 a
bare region (lo: its interval), 1 a heap block (lo: id << 1 | freed, hi: the
interval of its address when it was allocated), 2 a DWARF variable (hi: the
object, lo: the offset in it), 3 an ELF object (hi: the object).  An interval
is a module's section (0..S-1), a version of a traced region (S..S+H-1: the
region as it was when the access happened, from meta.json's
data_tracing.region_history), or a mapping of the last memory map
(S+H..S+H+M-1, for what no version holds); S+H+M: unmapped.  The names
are those of naming.py (AccessNamer), which both sides share.
"""

from __future__ import annotations

import numpy as np

from ..binary.dwarf_vars import describe_in_variable
from .access_pass import AccessIds
from .blocks import block_name
from .compact import compact_reader
from ..errors import CorruptTraceError
from .meta import read_meta
from .naming import AccessNamer

LOW32 = (1 << 32) - 1
HI30 = (1 << 30) - 1


def region_history(directory: str) -> list[list]:
    """The versions of the traced regions, ``[start, end, label, from, to]``
    (meta.json's data_tracing.region_history; none in older traces)."""
    try:
        meta = read_meta(directory)
    except CorruptTraceError:
        return []
    history = (meta.get("data_tracing") or {}).get("region_history") or []
    return [list(v) for v in history if isinstance(v, list) and len(v) == 5]


class AccessDimensions:
    """Ids for access rows, and the rows of the two dimension tables."""

    def __init__(self, namer: AccessNamer, whole_objects: bool = False):
        """``whole_objects``: one data id per variable, whatever the offset of the
        access in it (a summary's counts; ``variable`` is then None)."""
        self.namer = namer
        self.whole_objects = whole_objects
        history = sorted(region_history(namer.directory), key=lambda v: (v[0], v[3]))
        n_sections, n_history = len(namer.sections.starts), len(history)
        self.labels = [namer.region_names[int(i)] for i in namer.sections.ids.tolist()] + \
            [v[2] for v in history] + \
            [namer.region_names[int(i)] for i in namer.maps.ids.tolist()] + ["unmapped"]
        h_start = np.array([v[0] for v in history], dtype=np.uint64)
        self.interval_starts = np.concatenate([namer.sections.starts, h_start, namer.maps.starts,
                                               np.zeros(1, dtype=np.uint64)])
        interval_ids = np.arange(len(self.labels), dtype=np.int64)
        objects = namer.objects
        blocks = namer.blocks.rows
        no_end = np.iinfo(np.uint64).max
        self.ids = AccessIds(
            (objects.starts, objects.ends, objects.ids),
            [v is not None for v in namer.object_vars],
            (namer.sections.starts, namer.sections.ends, interval_ids[:n_sections]),
            (namer.maps.starts, namer.maps.ends, interval_ids[n_sections + n_history:-1]),
            len(self.labels) - 1,
            blocks["address"] if len(blocks) else np.zeros(0, dtype=np.uint64),
            blocks["order"] if len(blocks) else np.zeros(0, dtype=np.uint64),
            (h_start, np.array([v[1] for v in history], dtype=np.uint64),
             np.array([v[3] for v in history], dtype=np.uint64),
             np.array([no_end if v[4] is None else v[4] for v in history], dtype=np.uint64),
             interval_ids[n_sections:n_sections + n_history]))
        if whole_objects:
            self.ids.whole_objects()
        self._data_rows = 0          # data ids already described
        self._inst_rows = 0

    def close(self) -> None:
        self.ids.close()

    def rows(self, rows: np.ndarray, access_start: int, events: np.ndarray, spans) -> dict:
        """The store's access_rows columns of a chunk (AccessIds.rows)."""
        return self.ids.rows(rows, access_start, events, spans)

    def data_ids(self, rows: np.ndarray) -> np.ndarray:
        """The data ids of access rows (AccessIds.data_ids)."""
        return self.ids.data_ids(rows)

    def row_chunks(self, path: str, spans, chunk_rows: int):
        """The access_rows columns of a compact file of a thread without call
        records, in chunks (CompactReader.row_chunks)."""
        return compact_reader(path).row_chunks(self.ids, spans, chunk_rows)

    def counts(self) -> np.ndarray:
        """Per data id: loads, stores, bytes."""
        return self.ids.counts()

    # ------------------------------------------------------------ the tables
    def new_instructions(self) -> dict:
        """The instructions table's rows of the ids not given out before."""
        keys = self.ids.keys(1, self._inst_rows)
        first, self._inst_rows = self._inst_rows, self._inst_rows + len(keys)
        rip = keys & np.uint64((1 << 48) - 1)
        size = (keys >> np.uint64(48)).astype(np.uint16)
        codes, names = self.namer.code_names(rip)
        return {"iid": np.arange(first, first + len(keys), dtype=np.uint32), "rip": rip,
                "size": size, "instruction": [names[c] for c in codes.tolist()]}

    def new_data(self) -> dict:
        """The data table's rows of the ids not given out before.  Heap blocks (a
        program that allocates much has hundreds of thousands of ids) are named
        column-wise; the few others one by one."""
        keys = self.ids.keys(0, self._data_rows)
        first, self._data_rows = self._data_rows, self._data_rows + len(keys)
        n = len(keys)
        kind = (keys >> np.uint64(62)).astype(np.int64)
        hi = ((keys >> np.uint64(32)) & np.uint64(HI30)).astype(np.int64)
        lo = (keys & np.uint64(LOW32)).astype(np.int64)
        symbol = np.full(n, None, dtype=object)
        variable = np.full(n, None, dtype=object)
        region = np.full(n, None, dtype=object)
        base = np.zeros(n, dtype=np.uint64)
        block = np.zeros(n, dtype=np.uint32)
        freed = np.zeros(n, dtype=bool)
        namer = self.namer
        blocks = namer.blocks
        heap = np.flatnonzero(kind == 1)
        if len(heap):
            ids, released = lo[heap] >> 1, (lo[heap] & 1).astype(bool)
            rows = blocks.rows[ids - 1]
            kinds, sites, labels = blocks.kinds, blocks.sites, self.labels
            symbol[heap] = [block_name(kinds[k], i, sites[t], f) for k, i, t, f in zip(
                rows["kind"].tolist(), ids.tolist(), rows["site"].tolist(), released.tolist())]
            region[heap] = [labels[h] for h in hi[heap].tolist()]
            base[heap] = rows["address"]
            block[heap] = ids
            freed[heap] = released
        for i in np.flatnonzero(kind != 1).tolist():
            k, h, low = int(kind[i]), int(hi[i]), int(lo[i])
            if k == 0:
                region[i] = self.labels[low]
                base[i] = int(self.interval_starts[low])
            else:
                symbol[i] = namer.object_names[h]
                base[i] = namer.object_starts[h]
                region[i] = self._region_at(int(base[i]))
                if k == 2 and not self.whole_objects:
                    variable[i] = describe_in_variable(namer.object_vars[h], low)
        return {"did": np.arange(first, first + n, dtype=np.uint32), "symbol": symbol.tolist(),
                "variable": variable.tolist(), "region": region.tolist(), "base": base.tolist(),
                "block": block.tolist(), "freed": freed.tolist()}

    def _region_at(self, address: int) -> str:
        """A static object's region: its module's section (else the last map's)."""
        at = np.array([address], dtype=np.uint64)
        for table in (self.namer.sections, self.namer.maps):
            j = int(table.find(at)[0])
            if j >= 0:
                return self.namer.region_names[int(table.ids[j])]
        return "unmapped"
