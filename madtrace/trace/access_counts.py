# SPDX-License-Identifier: GPL-2.0-or-later
"""The totals a summary shows, straight from the raw capture (no store): per
function its calls and the accesses and bytes made while it was the innermost
traced call (self) or on the stack (incl, a recursion counted once: the
outermost calls'), and per data id (access_names.py) its loads, stores, bytes
and accesses after free.

Without call records the accesses are counted as the compact blocks are
decoded, a tile at a time (access_pass.c: no access row is made); with call
records, the segmentation gives each access its call as it does for the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .access_names import AccessDimensions
from .allocator_calls import AllocatorCalls
from .compact import DATA_SUFFIX, compact_reader
from .naming import AccessNamer
from .record_files import ACCESS_RECORDS, CALL_RECORDS
from .segmentation import FATES, iter_thread_chunks, load_tables

CHUNK_ROWS = 1 << 20
_UNMATCHED = FATES.index("unmatched")


@dataclass
class AccessTotals:
    functions: dict[str, dict] = field(default_factory=dict)
    # the data table's rows (AccessDimensions.new_data) and their counts (n, 4)
    data: dict = field(default_factory=dict)
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.int64))


def access_totals(directory: str, progress=None) -> AccessTotals:
    """See the module docstring; ``progress(events_done)`` after each piece."""
    totals = AccessTotals()
    has_accesses = bool(ACCESS_RECORDS.files(directory))
    dimensions = AccessDimensions(AccessNamer(directory), whole_objects=True) if has_accesses else None
    allocator = AllocatorCalls.load(directory)
    try:
        if CALL_RECORDS.files(directory):
            _with_calls(directory, totals, dimensions, allocator, progress)
        elif dimensions is not None:
            done = 0

            def step(n: int) -> None:
                nonlocal done
                done += n
                if progress is not None:
                    progress(done)

            for tid, path in ACCESS_RECORDS.files(directory):
                if path.endswith(DATA_SUFFIX):
                    compact_reader(path).count(dimensions.ids, allocator.spans(tid), step)
                else:
                    for chunk in ACCESS_RECORDS.chunks(path, CHUNK_ROWS):
                        dimensions.ids.count_rows(chunk, allocator.spans(tid))
                        done += len(chunk)
                        if progress is not None:
                            progress(done)
        if dimensions is not None:
            totals.data = dimensions.new_data()
            totals.counts = dimensions.counts()
    finally:
        if dimensions is not None:
            dimensions.close()
    return totals


def _with_calls(directory, totals, dimensions, allocator, progress) -> None:
    tables = load_tables(directory, required=False)
    n = max(len(tables.names), 1)
    # calls, a_self, a_incl, b_self, b_incl, rows (unmatched exits included)
    sums = np.zeros((6, n), dtype=np.int64)
    done_before: int = 0
    for chunk in iter_thread_chunks(directory, tables=tables, chunk_rows=CHUNK_ROWS):
        s: np.ndarray
        s = chunk.segments
        if len(s):
            fids = s["fid"].astype(np.int64)
            outer = s["outer"] != 0
            for row, weights in enumerate((s["fate"] != _UNMATCHED, s["accesses_self"],
                                           np.where(outer, s["accesses_incl"], 0),
                                           s["bytes_self"], np.where(outer, s["bytes_incl"], 0),
                                           np.ones(len(s), dtype=np.int64))):
                sums[row] += np.bincount(fids, weights=weights, minlength=n)[:n].astype(np.int64)
        if len(chunk.accesses) and dimensions is not None:
            dimensions.ids.count_rows(chunk.accesses, allocator.spans(chunk.tid))
        done = int(chunk.record_start + len(chunk.records) + chunk.access_start +
                   len(chunk.accesses))
        if progress is not None:
            progress(done_before + done)
        if chunk.last:
            done_before += done
    for fid, name in sorted(enumerate(tables.names), key=lambda item: item[1]):
        if not sums[5, fid]:
            continue        # no call of it in the trace (by name, as the summary lists them)
        f = totals.functions.setdefault(name, {"calls": 0, "accesses_self": 0, "accesses_incl": 0,
                                               "bytes_self": 0, "bytes_incl": 0})
        for row, key in enumerate(("calls", "accesses_self", "accesses_incl", "bytes_self",
                                   "bytes_incl")):
            f[key] += int(sums[row, fid])
