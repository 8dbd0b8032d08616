# SPDX-License-Identifier: GPL-2.0-or-later
"""The allocator's own calls (``data/allocator_calls.bin``): when each thread
was inside malloc, calloc, realloc, free, operator new or delete.

The allocator reads and writes its bookkeeping inside the heap: chunk
headers, the free lists it keeps in released chunks (glibc's tcache writes
its next pointer and key into the block being freed, and reads them in the
blocks freed before).  Those accesses are exact, but they are not the
program's: an access made while its thread is inside an allocator call is
the allocator's, and a use after free is only ever one of the program's
(MadT left its allocation wrappers unprofiled for the same reason).

A row per allocator call (``ALLOCATOR_CALL_DTYPE``): the thread, and the
tracer's event order at the call's entry and at its return (the ``order``
of the access records, trace/blocks.py); an access of that thread with an
order between the two was made by the allocator.  A call still running at
the end of the recording has ``end`` = ``OPEN``.  Rows are appended as
calls return; nested calls (operator new calling malloc) are rows of their
own, inside their caller's.
"""

from __future__ import annotations

import os

import numpy as np

from .format import ALLOCATOR_CALL_DTYPE, ALLOCATOR_CALL_OPEN, ALLOCATOR_CALLS_FILE, DATA_DIR
from .record_files import ALLOCATOR_CALL_RECORDS

OPEN = ALLOCATOR_CALL_OPEN     # the end of a call still running when the recording ended


class AllocatorCallWriter:
    """Appends rows as allocator calls return (a buffer, written when full and at
    ``flush``).  Memory: the buffer, whatever the number of calls."""

    BUFFER_ROWS = 8192

    def __init__(self, directory: str):
        os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=True)
        self.fd = ALLOCATOR_CALL_RECORDS.create(os.path.join(directory, ALLOCATOR_CALLS_FILE),
                                                truncate=True)
        self.buffer: list[tuple[int, int, int, int]] = []
        self.rows = 0

    def add(self, tid: int, begin: int, end: int) -> None:
        self.buffer.append((tid, 0, begin, end))
        self.rows += 1
        if len(self.buffer) == self.BUFFER_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.buffer and self.fd >= 0:
            ALLOCATOR_CALL_RECORDS.append(self.fd, np.array(self.buffer, dtype=ALLOCATOR_CALL_DTYPE))
            self.buffer = []

    def close(self) -> None:
        if self.fd >= 0:
            self.flush()
            os.close(self.fd)
            self.fd = -1


class AllocatorCalls:
    """The allocator calls of a trace directory, per thread as disjoint order
    intervals (nested calls merged into their callers)."""

    def __init__(self, rows: np.ndarray):
        self._spans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for tid in np.unique(rows["tid"]).tolist():
            mine = rows[rows["tid"] == tid]
            mine = mine[np.argsort(mine["begin"], kind="stable")]
            begins, ends = mine["begin"], np.maximum.accumulate(mine["end"])
            # a row starts a new span when it begins after every earlier row ended
            starts = np.ones(len(mine), dtype=bool)
            starts[1:] = begins[1:] > ends[:-1]
            first = np.flatnonzero(starts)
            last = np.append(first[1:], len(mine)) - 1
            self._spans[tid] = (begins[first], ends[last])

    @classmethod
    def load(cls, directory: str) -> "AllocatorCalls":
        """The directory's calls; none for a trace written without the file
        (older traces, or no allocation tracking)."""
        path = os.path.join(directory, ALLOCATOR_CALLS_FILE)
        if not os.path.exists(path):
            return cls(np.zeros(0, dtype=ALLOCATOR_CALL_DTYPE))
        return cls(ALLOCATOR_CALL_RECORDS.read(path))   # a killed tracer's: its complete chunks

    def spans(self, tid: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(begin orders, end orders) of thread ``tid``'s allocator calls, sorted; None: none."""
        return self._spans.get(int(tid))

    def inside(self, tid: int, orders: np.ndarray) -> np.ndarray:
        """Per order (accesses of thread ``tid``): made inside an allocator call."""
        spans = self._spans.get(int(tid))
        if spans is None:
            return np.zeros(len(orders), dtype=bool)
        begins, ends = spans
        orders = np.asarray(orders, dtype=np.uint64)
        i = np.searchsorted(begins, orders, side="right") - 1
        ok = i >= 0
        out = np.zeros(len(orders), dtype=bool)
        out[ok] = orders[ok] <= ends[i[ok]]
        return out
