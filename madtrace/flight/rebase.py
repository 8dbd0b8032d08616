# SPDX-License-Identifier: GPL-2.0-or-later
"""A flight window's files made into those of an ordinary trace directory.

Everything that refers to a thread's call records does so by position: an
access's, a block event's and a heap block's ``seq`` is the number of call
records the thread had written before it.  A window starts after some of
those records were dropped, so each such seq is moved back by the thread's
records dropped (``bases``: tid -> records); what happened before the
window's first record gets seq 0, "before the first record", as an access
before any call does in an ordinary trace.  Orders (the tracer's event
counter) and block ids are kept as they are.

A snapshot of a trigger on a call ends at that call: the call records after
its record (by time stamp) are left out, and so are the thread's accesses
and block events after its last record kept (``Rebase.cut_tsc``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace import zstd
from ..trace.capture_file import chunk_header
from ..trace.compact import BLOCK_HEADER, MAGIC_PLANES, MARK_SEQ, encode_block, from_planes
from ..trace.format import ACCESS_DTYPE, BLOCK_EVENT_DTYPE, COMPACT_DTYPE, RECORD_DTYPE


def _moved_back(seqs: np.ndarray, base) -> np.ndarray:
    return np.where(seqs > base, seqs - base, 0).astype(seqs.dtype)


@dataclass
class Rebase:
    """How a window's chunks change: ``bases`` (tid -> call records dropped
    before the window), ``cut_tsc`` (None: no cut).  ``calls`` must see every
    thread's call chunks, in order, before its other chunks are transformed."""

    bases: dict[int, int]
    cut_tsc: int | None = None
    kept: dict[int, int] = field(default_factory=dict)  # tid -> call records kept
    ended: set[int] = field(default_factory=set)  # tids whose records reach the cut

    def limit(self, tid: int) -> int | None:
        """The last seq a thread cut by ``cut_tsc`` keeps (None: no limit)."""
        return self.kept.get(tid, 0) if tid in self.ended else None

    def transform(self, kind: str, payload: bytes, tid: int | None) -> bytes | None:
        """A chunk's payload made the window's (None: nothing of it is in the window)."""
        if kind == "calls":
            return self._calls(payload, tid or 0)
        if kind == "compact":
            return self._compact(payload, tid or 0)
        if kind == "accesses":
            return self._rows(payload, ACCESS_DTYPE, tid)
        if kind == "block events":
            return self._rows(payload, BLOCK_EVENT_DTYPE, None)
        return payload

    def _calls(self, payload: bytes, tid: int) -> bytes | None:
        if tid in self.ended:
            return None
        rows = np.frombuffer(payload, dtype=RECORD_DTYPE)
        if self.cut_tsc is not None:
            after = np.flatnonzero(rows["tsc"] > self.cut_tsc)
            if len(after):
                rows = rows[: int(after[0])]
                self.ended.add(tid)
        self.kept[tid] = self.kept.get(tid, 0) + len(rows)
        if not len(rows):
            return None
        return payload if len(rows) * RECORD_DTYPE.itemsize == len(payload) else rows.tobytes()

    def _compact(self, payload: bytes, tid: int) -> bytes | None:
        """A block of data/<tid>.dat with its seq markers moved back; None for a
        block wholly before the window or after the cut (each block starts with
        its seq: data_expand.c).  A block across either edge is kept whole: its
        accesses before the window's first record count as outside any call,
        those after a cut as after the last record."""
        base, limit = self.bases.get(tid, 0), self.limit(tid)
        if not base and limit is None:
            return payload
        head = np.frombuffer(payload, dtype=BLOCK_HEADER, count=1)[0]
        n = int(head["records"])
        raw = zstd.decompress(memoryview(payload)[BLOCK_HEADER.itemsize :], int(head["raw"]))
        if int(head["magic"]) == MAGIC_PLANES:
            records = from_planes(raw, n)
        else:
            records = np.frombuffer(raw, dtype=COMPACT_DTYPE).copy()
        marks = (records["id"] == 0) & (records["b"] == MARK_SEQ)
        seqs = records["a"][marks]
        if len(seqs) and int(seqs.max()) < base:
            return None
        seqs = _moved_back(seqs, base)
        if limit is not None and len(seqs):
            if int(seqs.min()) > limit:
                return None
            seqs = np.minimum(seqs, limit)
        records["a"][marks] = seqs
        return encode_block(records)

    def _rows(self, payload: bytes, dtype: np.dtype, tid: int | None) -> bytes | None:
        """Records of ``dtype`` (a ``seq`` field; a ``tid`` field when ``tid`` is
        None): those before their thread's first call record kept, or after a
        cut, left out; the others' seqs moved back."""
        rows = np.frombuffer(payload, dtype=dtype)
        threads = rows["tid"] if tid is None else np.full(len(rows), tid, dtype=np.uint32)
        base = np.zeros(len(rows), dtype=np.uint64)
        limit = np.full(len(rows), np.iinfo(np.uint64).max, dtype=np.uint64)
        for thread in np.unique(threads).tolist():
            mine = threads == thread
            base[mine] = self.bases.get(thread, 0)
            last = self.limit(thread)
            if last is not None:
                limit[mine] = base[mine] + np.uint64(last)
        keep = (rows["seq"] >= base) & (rows["seq"] <= limit)
        if not keep.any():
            return None
        if keep.all() and not base.any():
            return payload
        rows, base = rows[keep].copy(), base[keep]
        rows["seq"] -= base
        return rows.tobytes()


def rebase_blocks(rows: np.ndarray, bases: dict[int, int]) -> None:
    """The heap block table (BLOCK_DTYPE rows, changed in place): allocation and
    release seqs moved back by the thread's base that made each."""
    for tid, base in bases.items():
        if not base:
            continue
        mine = rows["tid"] == tid
        rows["seq"][mine] = _moved_back(rows["seq"][mine], base)
        freed = (rows["freed_tid"] == tid) & (rows["freed"] != 0)
        rows["freed_seq"][freed] = _moved_back(rows["freed_seq"][freed], base)


def framed(payload: bytes) -> list:
    """A chunk as written (its header, then the payload)."""
    return [chunk_header(payload), payload]
