# SPDX-License-Identifier: GPL-2.0-or-later
"""Data records into the trace's access rows (data/<tid>.acc, ACCESS_DTYPE, or
compact records in data/<tid>.dat).

``RingRecords``: the hybrid engine's data records, taken out of each
thread's ring by the drain (ring_split.py, in the drain thread, the ring lock
held) with the hook groups between them (``hook_sink``: hook_events.py, each
applied after the data records before it are named, before those after it):
each {address, seq, instruction id} becomes one access row
(two for a read-modify-write: the load, then the store) with what the id
stands for (instruction_table.py); accesses outside the traced byte ranges
(a page holds traced and untraced bytes), and those --loads-only /
--stores-only leave out, are dropped.  Every access gets the engine's next
event order: an allocation event first drains every ring (``next_order``),
so the accesses made before it come before it.

``finish_rows(engine, tid, rows)``: what both engines do with new rows:
their heap block and whether it was freed, --only BLOCK, the per-instruction
counts, and the thread's spool.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable, Protocol
import os

import numpy as np

from ..errors import TracerInternalError, writing
from ..native import load
from ..trace.compact import InstructionFile
from ..trace.record_files import ACCESS_RECORDS, COMPACT_RECORDS
from ..trace.format import COMPACT_DTYPE, INSTRUCTIONS_FILE
from .block_writer import BlockWriter
from .instruction_table import KIND_LOAD


class EventOrder:
    """The tracer's event counter: a total order of what it saw, accesses and
    allocation events alike, shared by the data engine's parts (the engine, its
    hybrid paths, the hook events, the C writer of the access rows)."""

    def __init__(self) -> None:
        self.value = 0

    def tick(self) -> int:
        """The next order."""
        self.value += 1
        return self.value


def finish_rows(engine, tid: int, rows: np.ndarray) -> None:
    if engine.alloc is not None and engine.alloc.count:
        rows["block"], rows["freed"] = engine.alloc.blocks_of(rows["addr"])
    if engine.only_blocks is not None:
        keep = np.isin(rows["block"], np.array(sorted(engine.only_blocks), dtype=np.uint32))
        rows = rows[keep]
        if not len(rows):
            return
    engine.count_freed(rows["freed"] != 0, np.full(len(rows), tid))   # program / allocator
    # per (instruction, kind) counts: one 64-bit key each (user addresses < 2**62)
    keys, n = np.unique((rows["rip"] << np.uint64(2)) | rows["kind"].astype(np.uint64),
                        return_counts=True)
    for key, count in zip(keys.tolist(), n.tolist()):
        engine.counts[(key >> 2, "L" if key & 3 == KIND_LOAD else "S")] += count
    append_rows(engine, tid, rows)


def append_rows(engine, tid: int, chunk: np.ndarray) -> None:
    """Access rows (ACCESS_DTYPE) of a thread into its spool, written out to
    data/<tid>.acc every SPOOL_ROWS rows and at the end (``spool_rows``)."""
    engine.chunks.setdefault(tid, []).append(chunk)
    engine.rows[tid] = engine.rows.get(tid, 0) + len(chunk)
    if engine.rows[tid] >= SPOOL_ROWS:
        spool_rows(engine, tid)


def spool_rows(engine, tid: int) -> None:
    chunks = engine.chunks.pop(tid, [])
    engine.rows[tid] = 0
    if chunks:
        path = ACCESS_RECORDS.path(engine.out_dir, tid)
        with writing(path):
            fd = ACCESS_RECORDS.create(path)     # chunks of the capture container
            try:
                ACCESS_RECORDS.append(fd, np.concatenate(chunks))
            finally:
                os.close(fd)


class _IdTable(ctypes.Structure):
    _fields_ = [("rip", ctypes.c_void_p), ("size", ctypes.c_void_p), ("kind", ctypes.c_void_p),
                ("ilen", ctypes.c_void_p), ("first", ctypes.c_void_p), ("path", ctypes.c_void_p),
                ("n", ctypes.c_uint64)]


class _Segment(ctypes.Structure):
    """data_expand.c struct mt_segment."""
    P, U64 = ctypes.c_void_p, ctypes.c_uint64
    _fields_ = [("input", P), ("addresses", P), ("blocks", P), ("freed", P), ("ids", P),
                ("traced", P), ("kinds", U64), ("order", P), ("only", P), ("n_only", U64),
                ("only_on", U64), ("out", P), ("seq", P), ("id_counts", P), ("stats", P),
                ("lookup", P), ("live", P), ("freed_index", P)]


class _Ranges(ctypes.Structure):
    _fields_ = [("starts", ctypes.c_void_p), ("ends", ctypes.c_void_p), ("ids", ctypes.c_void_p),
                ("n", ctypes.c_uint64)]


class HookBatch(Protocol):
    """Hook groups taken many at a time (hook_events.py): a memcpy's or memset's
    entry is an event that needs no ptrace stop and does not change the heap."""

    def batched(self, groups: np.ndarray) -> np.ndarray:
        """Which of ``groups`` (HOOK_OUT_DTYPE) are taken in batches (bool)."""

    def recorded(self, tid: int, groups: np.ndarray) -> np.ndarray:
        """Which of those batched ``groups`` become events (each takes an order)."""

    def take(self, tid: int, groups: np.ndarray, events: np.ndarray, orders: np.ndarray) -> None:
        """The batched ``groups``; ``orders``: those of the ones ``events`` selects."""


DATA_BEFORE = 5          # ring_split.HOOK_OUT_DTYPE's field: data records before the group
BATCH_MIN = 8            # batched hook groups in a span worth one call for all
SPOOL_ROWS = 1 << 18     # accesses a thread buffers before they go to its file
STAT_OUTSIDE, STAT_PROBE, STAT_FAULT, STAT_FREED, STAT_UNKNOWN_ID = range(5)


@functools.lru_cache(maxsize=None)
def _library():
    lib = load("libmtloop.so", "the data engine's native part")
    P, U64 = ctypes.c_void_p, ctypes.c_uint64
    lib.mt_compact_size.restype, lib.mt_compact_size.argtypes = ctypes.c_size_t, []
    lib.mt_compact_data.restype = U64
    lib.mt_compact_data.argtypes = [P, U64, P, P, ctypes.c_int, P, P, P, P, U64, ctypes.c_int,
                                    P, P, P, P]
    lib.mt_compact_planes.restype, lib.mt_compact_planes.argtypes = None, [P, U64, P]
    lib.mt_segment_size.restype, lib.mt_segment_size.argtypes = ctypes.c_size_t, []
    lib.mt_compact_segment.restype = U64
    lib.mt_compact_segment.argtypes = [P, U64, U64, U64, P, U64, P]
    if lib.mt_segment_size() != ctypes.sizeof(_Segment):
        raise TracerInternalError("libmtloop.so does not match data_records.py: run `make native`")
    return lib


def _ranges(starts: np.ndarray, ends: np.ndarray, ids: np.ndarray | None, keep: list) -> _Ranges:
    arrays = [np.ascontiguousarray(starts, dtype=np.uint64), np.ascontiguousarray(ends, dtype=np.uint64)]
    if ids is not None:
        arrays.append(np.ascontiguousarray(ids, dtype=np.uint32))
    keep.extend(arrays)
    return _Ranges(arrays[0].ctypes.data, arrays[1].ctypes.data,
                   arrays[2].ctypes.data if ids is not None else None, len(arrays[0]))


class RingRecords:
    def __init__(self, engine, ids, out_dir: str):
        self.engine = engine
        self.ids = ids
        self.out_dir = out_dir
        self.lib = _library()
        if self.lib.mt_compact_size() != COMPACT_DTYPE.itemsize:
            raise TracerInternalError("libmtloop.so does not match COMPACT_DTYPE: rebuild it")
        self.records = 0                            # data records drained
        self.written = 0                            # compact records written
        self.writer = BlockWriter()                 # compresses and appends the blocks
        self.stats = np.zeros(5, dtype=np.uint64)
        self.id_counts = np.zeros(0, dtype=np.uint64)   # [2 * id + (store)] accesses kept
        self.files: dict[int, int] = {}             # tid -> data/<tid>.dat
        self.last_seq: dict[int, ctypes.c_uint64] = {}
        self._order = ctypes.c_uint64(0)
        # reused from batch to batch (a fresh megabyte per batch costs page faults)
        self._records = np.empty(0, dtype=COMPACT_DTYPE)
        self._blocks = np.empty(0, dtype=np.uint32)
        self._freed = np.empty(0, dtype=np.uint8)
        self._addresses = np.empty(0, dtype=np.uint64)
        kinds = (1 if engine.loads else 0) | (2 if engine.stores else 0)
        self.table = self._guarded(lambda: InstructionFile(out_dir, kinds))
        # hook_sink(tid, group): the hook groups (hook_events.py); hook_batch: the groups
        # that can be taken many at a time (a memcpy's: they do not change the heap)
        self.hook_sink: Callable[[int, tuple], None] | None = None
        self.hook_batch: HookBatch | None = None
        self._id_table: tuple | None = None   # (rows, _IdTable, arrays it points into)
        self._traced: tuple | None = None     # (starts, _Ranges, arrays it points into)
        self._only: tuple | None = None       # (--only blocks, their array)
        self._seg = _Segment()
        self._seg_ref = ctypes.byref(self._seg)

    @property
    def outside(self) -> int:
        return int(self.stats[STAT_OUTSIDE])

    @property
    def by_path(self) -> tuple[int, int]:
        return int(self.stats[STAT_PROBE]), int(self.stats[STAT_FAULT])

    def __call__(self, tid: int, out: np.ndarray, hooks: np.ndarray | None = None) -> None:
        """A batch of thread ``tid``'s data records (DATA_OUT_DTYPE) and hook groups
        (HOOK_OUT_DTYPE, each after ``data_before`` of the data records), in order."""
        self.records += len(out)
        size = 2 * len(out) + 2 * len(hooks if hooks is not None else ()) + 1
        if len(self._records) < size:
            self._records = np.empty(size, dtype=COMPACT_DTYPE)
        if len(self._blocks) < len(out):
            self._blocks = np.empty(len(out), dtype=np.uint32)
            self._freed = np.empty(len(out), dtype=np.uint8)
            self._addresses = np.empty(len(out), dtype=np.uint64)
        self._addresses[:len(out)] = out["addr"]      # contiguous, for the block lookups
        self._batch(tid, out)
        if hooks is not None and len(hooks) and self.hook_sink is None:
            raise TracerInternalError("hook groups drained without a hook sink")
        if hooks is None or not len(hooks):
            written = self._segment(tid, out, 0, len(out), 0) if len(out) else 0
        else:
            written = self._with_groups(tid, out, hooks)
        if written:
            self.write_table()          # every id these records name is on disk before them
            path = ACCESS_RECORDS.compact_path(self.out_dir, tid)
            with writing(path):
                self._write(tid, path, self._records[:written])

    def _ids(self) -> _IdTable:
        """The instruction table as C reads it (made again when ids were added)."""
        n = len(self.ids)
        if self._id_table is None or self._id_table[0] != n:
            table = self.ids.arrays()
            cols = [np.ascontiguousarray(table[k]) for k in ("rip", "size", "kind", "ilen", "first",
                                                             "path")]
            self._id_table = (n, _IdTable(*(c.ctypes.data for c in cols), n), cols)
            if len(self.id_counts) < 2 * n:
                grown = np.zeros(2 * n + 1024, dtype=np.uint64)
                grown[:len(self.id_counts)] = self.id_counts
                self.id_counts = grown
        return self._id_table[1]

    def _with_groups(self, tid: int, out: np.ndarray, hooks: np.ndarray) -> int:
        """The batch's data records and hook groups: each group that changes the
        heap (an allocator's) alone, in its place; those between two such, with
        the data records around them, in one span (``_span``)."""
        if self.hook_batch is None:
            one_by_one = list(range(len(hooks)))
        else:
            one_by_one = np.flatnonzero(~self.hook_batch.batched(hooks)).tolist()
        written, start, first = 0, 0, 0      # first: the first group not taken yet
        for k in one_by_one:
            group = hooks[k]
            end = int(group["data_before"])
            written += self._span(tid, out, start, end, hooks[first:k], written)
            self.hook_sink(tid, group.item())   # type: ignore[misc]
            start, first = end, k + 1
        if start < len(out) or first < len(hooks):
            written += self._span(tid, out, start, len(out), hooks[first:], written)
        return written

    def _span(self, tid: int, out: np.ndarray, start: int, end: int, groups, at: int) -> int:
        """Data records [start, end) with the batched hook groups among them
        (``groups``: none of them changes the heap): the records named and
        compacted as one segment, each group that is an event taking its order
        at its place among them; returns the compact records written."""
        if len(groups) < BATCH_MIN:              # one by one costs less
            written = 0
            for group in groups.tolist():
                before = group[DATA_BEFORE]
                if before > start:
                    written += self._segment(tid, out, start, before, at + written)
                self.hook_sink(tid, group)       # type: ignore[misc]
                start = before
            if end > start:
                written += self._segment(tid, out, start, end, at + written)
            return written
        assert self.hook_batch is not None
        events = self.hook_batch.recorded(tid, groups)
        gaps = np.ascontiguousarray(groups["data_before"][events] - np.uint64(start))
        orders = np.zeros(len(gaps), dtype=np.uint64)
        written = self._segment(tid, out, start, end, at, gaps, orders)
        self.hook_batch.take(tid, groups, events, orders)
        return written

    def _segment(self, tid: int, out: np.ndarray, start: int, end: int, at: int,
                 gaps: np.ndarray | None = None, orders: np.ndarray | None = None) -> int:
        """Data records [start, end) of the batch into compact records from ``at`` on,
        named with the heap as it is now; returns how many were written (one C call:
        a segment can be a few records long).  ``gaps``: events among them, each
        before the record at its offset from ``start``, given their orders in
        ``orders``."""
        engine = self.engine
        segment = self._seg
        alloc = engine.alloc
        if alloc is not None and alloc.count and not segment.lookup:
            segment.lookup = alloc.live.lookup_function()
            segment.live, segment.freed_index = alloc.live.handle, alloc.freed.handle
        before = int(self.stats[STAT_FREED])
        self._order.value = engine.order.value
        if gaps is None or orders is None:
            written = self.lib.mt_compact_segment(self._seg_ref, start, end, at, None, 0, None)
        else:
            written = self.lib.mt_compact_segment(self._seg_ref, start, end, at, gaps.ctypes.data,
                                                  len(gaps), orders.ctypes.data)
        engine.order.value = self._order.value
        freed = int(self.stats[STAT_FREED]) - before     # all of thread tid: program / allocator
        if freed and alloc is not None:
            program, allocator = alloc.split_thread_freed(tid, freed)
            engine.freed_accesses += program
            engine.allocator_freed_accesses += allocator
        return written

    def _batch(self, tid: int, out: np.ndarray) -> None:
        """What every segment of a batch shares (``_Segment``), set once a batch."""
        engine = self.engine
        ids = self._ids()
        starts, ends = engine.regions.arrays()
        if self._traced is None or self._traced[0] is not starts:
            keep: list = []
            self._traced = (starts, _ranges(starts, ends, None, keep), keep)
        only = self._only_array()
        seq = self.last_seq.get(tid)
        if seq is None:
            seq = self.last_seq[tid] = ctypes.c_uint64(2**64 - 1)
        # each block (one a batch) starts with its seq, as with its order: a block
        # reads without the ones before it (a flight recorder's window starts anywhere)
        seq.value = 2**64 - 1
        s = self._seg
        s.input, s.addresses = out.ctypes.data, self._addresses.ctypes.data
        s.blocks, s.freed = self._blocks.ctypes.data, self._freed.ctypes.data
        s.ids, s.traced = ctypes.addressof(ids), ctypes.addressof(self._traced[1])
        s.kinds = (1 if engine.loads else 0) | (2 if engine.stores else 0)
        s.order = ctypes.addressof(self._order)
        s.only, s.n_only = only.ctypes.data, len(only)
        s.only_on = int(engine.only_blocks is not None)
        s.out, s.seq = self._records.ctypes.data, ctypes.addressof(seq)
        s.id_counts, s.stats = self.id_counts.ctypes.data, self.stats.ctypes.data
        alloc = engine.alloc
        if alloc is not None and alloc.count:
            s.lookup = alloc.live.lookup_function()
            s.live, s.freed_index = alloc.live.handle, alloc.freed.handle
        else:
            s.lookup = s.live = s.freed_index = None

    def _only_array(self) -> np.ndarray:
        only = self.engine.only_blocks
        if self._only is None or self._only[0] != only:
            self._only = (set(only) if only is not None else None,
                          np.array(sorted(only or ()), dtype=np.uint32))
        return self._only[1]

    def _write(self, tid: int, path: str, records: np.ndarray) -> None:
        """The records as byte planes (C), compressed and appended as one chunk of
        the capture container by the block writer's thread (block_writer.py)."""
        fd = self.files.get(tid)
        if fd is None:
            fd = self.files[tid] = COMPACT_RECORDS.create(path)
        buf = self.writer.buffer(records.nbytes)
        planes = buf[:records.nbytes]
        self.lib.mt_compact_planes(records.ctypes.data, len(records), planes.ctypes.data)
        self.writer.submit(fd, path, len(records), planes, buf)
        self.written += len(records)

    @property
    def bytes(self) -> int:
        """Bytes of data/<tid>.dat written so far (the blocks still waiting for the
        writer not counted)."""
        return self.writer.bytes

    def flush(self) -> None:
        """Every block taken so far is in its file (the ring lock held, or the
        drain stopped)."""
        self.writer.flush()

    def _guarded(self, make):
        path = os.path.join(self.out_dir, INSTRUCTIONS_FILE)
        with writing(path):
            return make()

    def write_table(self) -> None:
        """data/instructions.jsonl: the ids given since the last call appended
        (the ring lock held, or the drain stopped)."""
        if self.table.rows < len(self.ids):
            self._guarded(lambda: self.table.append(self.ids.rows_from(self.table.rows)))

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            for fd in self.files.values():
                os.close(fd)
        self.files.clear()
        self.table.close()

    def counts(self) -> dict[tuple[int, str], int]:
        """{(instruction, "L"/"S"): accesses} of everything recorded so far."""
        out: dict[tuple[int, str], int] = {}
        rips = self.ids.arrays()["rip"]
        for index in np.nonzero(self.id_counts)[0].tolist():
            key = (int(rips[index // 2]), "LS"[index % 2])
            out[key] = out.get(key, 0) + int(self.id_counts[index])
        return out
