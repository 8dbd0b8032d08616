# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's ``block_events`` table: MadT's Y/W/G events (memcpy/memmove
``Y``, memset and system calls that wrote traced memory ``W``, system calls
that read it ``G``; data/block_events.json), one row each, named like the
accesses: the heap block that held the address when the event happened
(``<malloc0014@build_list+39>+8``, ``<freed:...>`` after its release), else
the variable or symbol, else the region.

``pos`` places an event among its thread's records and accesses: the
``pos`` (in the ``events`` view) of the first access after it, or of the
call record after it when no access of the thread comes between them;
``order`` is the tracer's total order of accesses, allocations and block
events.  Each event carries its blocks (trace/block_event_records.py): they
are not looked up again here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .block_event_records import read_block_event_rows
from .columnar import PartWriter
from .format import (BLOCK_EVENT_FREED, BLOCK_EVENT_HAS_SOURCE, BLOCK_EVENT_KINDS,
                     BLOCK_EVENT_SOURCE_FREED, BLOCK_EVENT_WHATS)
from .naming import AccessNamer
from .reader import iter_access_chunks


class BlockEventPlacer:
    """Counts, per block event, its thread's accesses with a smaller order, from
    the access chunks the store's pass sees (each thread's in order): the pass
    over the accesses is not made a second time for the events."""

    def __init__(self, directory: str):
        rows = read_block_event_rows(directory)
        self.rows = rows[np.lexsort((rows["order"], rows["tid"]))]
        self.tids = self.rows["tid"].astype(np.int64)
        self.before = np.zeros(len(self.rows), dtype=np.int64)
        self._mine: dict[int, np.ndarray] = {}

    def see(self, tid: int, orders: np.ndarray) -> None:
        if not len(self.rows) or not len(orders):
            return
        mine = self._mine.get(tid)
        if mine is None:
            mine = self._mine[tid] = np.flatnonzero(self.tids == tid)
        if len(mine):
            if (orders[1:] < orders[:-1]).any():
                orders = np.sort(orders)
            self.before[mine] += np.searchsorted(orders, self.rows["order"][mine], side="left")


def write_block_events(directory: str, namer: AccessNamer | None,
                       placer: BlockEventPlacer | None = None) -> int:
    """The block_events table; ``placer``: the counts of the accesses before each
    event, made by the store's pass (else the accesses are read here)."""
    if placer is None:
        placer = BlockEventPlacer(directory)
        for tid, chunk in iter_access_chunks(directory):
            placer.see(tid, chunk["order"])
    rows = placer.rows
    writer = PartWriter(directory, "block_events")
    if len(rows):
        namer = namer or AccessNamer(directory)
        seqs = rows["seq"].astype(np.int64)
        codes, names = namer.code_names(rows["rip"])
        has_source = (rows["flags"] & BLOCK_EVENT_HAS_SOURCE) != 0
        data = namer.data_labels(rows["address"], rows["block"],
                                 ((rows["flags"] & BLOCK_EVENT_FREED) != 0).astype(np.uint8))
        source_data = namer.data_labels(rows["source"], rows["source_block"],
                                        ((rows["flags"] & BLOCK_EVENT_SOURCE_FREED) != 0
                                         ).astype(np.uint8))
        writer.write({
            "tid": rows["tid"].astype(np.int32), "pos": seqs + placer.before, "seq": seqs,
            "order": rows["order"],
            "kind": pa.array(np.array(BLOCK_EVENT_KINDS, dtype=object)[rows["kind"]],
                             type=pa.string()),
            "what": pa.array(np.array(BLOCK_EVENT_WHATS, dtype=object)[rows["what"]],
                             type=pa.string()),
            "rip": rows["rip"], "instruction": pa.array([names[c] for c in codes.tolist()],
                                                        type=pa.string()),
            "addr": rows["address"], "size": rows["size"],
            "source": pa.array(rows["source"], type=pa.uint64(), mask=~has_source),
            "data": pa.array(data, type=pa.string()),
            "source_data": pa.array([d if h else None for d, h in
                                     zip(source_data, has_source.tolist())], type=pa.string())})
    writer.close()
    writer.ensure_file()
    return writer.rows
