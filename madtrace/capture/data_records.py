# SPDX-License-Identifier: GPL-2.0-or-later
"""Data records into the trace's access rows (data/<tid>.acc, ACCESS_DTYPE).

``RingRecords``: the hybrid engine's data records, taken out of each
thread's ring by the drain (rings.py ``data_sink``, in the drain thread, the
ring lock held): each {address, seq, instruction id} becomes one access row
(two for a read-modify-write: the load, then the store) with what the id
stands for (instruction_table.py); accesses outside the traced byte ranges
(a page holds traced and untraced bytes), and those --loads-only /
--stores-only leave out, are dropped.  Every access gets the engine's next
event order: an allocation event first drains every ring (``_next_order``),
so the accesses made before it come before it.

``finish_rows(engine, tid, rows)``: what both engines do with new rows:
their heap block and whether it was freed, --only BLOCK, the per-instruction
counts, and the thread's spool.
"""

from __future__ import annotations

import numpy as np

from .instruction_table import KIND_BOTH, KIND_LOAD, KIND_STORE


def finish_rows(engine, tid: int, rows: np.ndarray) -> None:
    if engine.alloc is not None and engine.alloc.blocks:
        rows["block"], rows["freed"] = engine.alloc.blocks_of(rows["addr"])
    if engine.only_blocks is not None:
        keep = np.isin(rows["block"], np.array(sorted(engine.only_blocks), dtype=np.uint32))
        rows = rows[keep]
        if not len(rows):
            return
    engine.freed_accesses += int(np.count_nonzero(rows["freed"]))
    # per (instruction, kind) counts: one 64-bit key each (user addresses < 2**62)
    keys, n = np.unique((rows["rip"] << np.uint64(2)) | rows["kind"].astype(np.uint64),
                        return_counts=True)
    for key, count in zip(keys.tolist(), n.tolist()):
        engine.counts[(key >> 2, "L" if key & 3 == KIND_LOAD else "S")] += count
    engine._append(tid, rows)


class RingRecords:
    def __init__(self, engine, ids, access_dtype):
        self.engine = engine
        self.ids = ids
        self.dtype = access_dtype
        self.records = 0           # data records drained
        self.outside = 0           # on traced pages, outside the traced bytes
        self.by_path = np.zeros(2, dtype=np.int64)   # accesses recorded: probes, faults

    def __call__(self, tid: int, out: np.ndarray) -> None:
        engine = self.engine
        self.records += len(out)
        table = self.ids.arrays()
        ident = out["id"].astype(np.int64)
        kind = table["kind"][ident]
        idx = np.repeat(np.arange(len(out)), np.where(kind == KIND_BOTH, 2, 1))
        second = np.zeros(len(idx), dtype=bool)
        second[1:] = idx[1:] == idx[:-1]
        ident, kind = ident[idx], kind[idx]
        rows = np.zeros(len(idx), dtype=self.dtype)
        rows["seq"] = out["seq"][idx]
        rows["addr"] = out["addr"][idx]
        rows["rip"] = table["rip"][ident]
        rows["size"] = table["size"][ident]
        rows["ilen"] = table["ilen"][ident]
        rows["kind"] = np.where(kind == KIND_BOTH, np.where(second, KIND_STORE, KIND_LOAD), kind)
        rows["first"] = np.where(second, 0, table["first"][ident])
        keep = engine.regions.mask(rows["addr"])
        self.outside += int(len(keep) - np.count_nonzero(keep))
        if not engine.loads:
            keep &= rows["kind"] != KIND_LOAD
        if not engine.stores:
            keep &= rows["kind"] != KIND_STORE
        rows = rows[keep]
        if not len(rows):
            return
        self.by_path += np.bincount(table["path"][ident[keep]], minlength=2)[:2]
        rows["order"] = np.arange(engine._order + 1, engine._order + 1 + len(rows), dtype=np.uint64)
        engine._order += len(rows)
        finish_rows(engine, tid, rows)
