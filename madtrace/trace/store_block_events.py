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
    over the accesses is not made a second time for the events.

    Per chunk, only the events whose order falls inside the chunk's span are
    searched in it; those after it get the whole chunk through a difference
    array summed once at the end, so a chunk costs its events, not all of them
    (a program with hundreds of thousands of block events)."""

    def __init__(self, directory: str):
        rows = read_block_event_rows(directory)
        self.rows = rows[np.lexsort((rows["order"], rows["tid"]))]
        self.tids = self.rows["tid"].astype(np.int64)
        self._before = np.zeros(len(self.rows), dtype=np.int64)
        # per thread: its events (indices, orders: sorted) and the counts owed to
        # the events from index i on (a difference array)
        self._mine: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def see(self, tid: int, orders: np.ndarray) -> None:
        if not len(self.rows) or not len(orders):
            return
        mine = self._mine.get(tid)
        if mine is None:
            index = np.flatnonzero(self.tids == tid)
            mine = self._mine[tid] = (index, self.rows["order"][index],
                                      np.zeros(len(index) + 1, dtype=np.int64))
        index, events, owed = mine
        if not len(index):
            return
        if (orders[1:] < orders[:-1]).any():
            orders = np.sort(orders)
        lo = int(np.searchsorted(events, orders[0], side="right"))   # before it: none
        hi = int(np.searchsorted(events, orders[-1], side="right"))  # after it: all
        if lo < hi:
            self._before[index[lo:hi]] += np.searchsorted(orders, events[lo:hi], side="left")
        owed[hi] += len(orders)

    @property
    def before(self) -> np.ndarray:
        """Per event (``rows``' order): its thread's accesses seen with a smaller order."""
        out = self._before.copy()
        for index, _events, owed in self._mine.values():
            out[index] += np.cumsum(owed)[:len(index)]
        return out


def block_event_columns(directory: str, rows: np.ndarray, namer: AccessNamer | None) -> dict:
    """The block_events table's columns of ``rows`` (BlockEventPlacer.rows' order)
    but ``pos``, which needs the accesses (BlockEventPlacer.before): named from the
    capture's tables alone, so that they are made beside the store's pass."""
    if not len(rows):
        return {}
    namer = namer or AccessNamer(directory)
    seqs = rows["seq"].astype(np.int64)
    codes, names = namer.code_names(rows["rip"])
    has_source = (rows["flags"] & BLOCK_EVENT_HAS_SOURCE) != 0
    data = namer.data_labels(rows["address"], rows["block"],
                             ((rows["flags"] & BLOCK_EVENT_FREED) != 0).astype(np.uint8))
    source_data = namer.data_labels(rows["source"], rows["source_block"],
                                    ((rows["flags"] & BLOCK_EVENT_SOURCE_FREED) != 0
                                     ).astype(np.uint8))
    return {
        "tid": rows["tid"].astype(np.int32), "seq": seqs, "order": rows["order"],
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
                                 zip(source_data, has_source.tolist())], type=pa.string())}


def write_block_events(directory: str, namer: AccessNamer | None,
                       placer: BlockEventPlacer | None = None,
                       columns: dict | None = None) -> int:
    """The block_events table; ``placer``: the counts of the accesses before each
    event, made by the store's pass (else the accesses are read here);
    ``columns``: block_event_columns of its rows, made before."""
    if placer is None:
        placer = BlockEventPlacer(directory)
        for tid, chunk in iter_access_chunks(directory):
            placer.see(tid, chunk["order"])
    rows = placer.rows
    writer = PartWriter(directory, "block_events")
    if len(rows):
        if columns is None:
            columns = block_event_columns(directory, rows, namer)
        writer.write(dict(columns, pos=columns["seq"] + placer.before))
    writer.close()
    writer.ensure_file()
    return writer.rows
