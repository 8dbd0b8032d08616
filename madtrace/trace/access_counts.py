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

import os
from dataclasses import dataclass, field

import numpy as np

from .access_names import AccessDimensions
from ..errors import CorruptTraceError
from .allocator_calls import AllocatorCalls
from . import access_pass
from .compact import COMPACT_DTYPE, DATA_SUFFIX, MARK_ORDER, InstructionColumns, compact_reader, \
    from_planes
from .naming import AccessNamer
from .record_files import ACCESS_RECORDS, CALL_RECORDS
from .segmentation import FATES, iter_thread_chunks, load_tables

CHUNK_ROWS = 1 << 20
# threads that count a data file's blocks side by side (the summary of a trace
# without calls); each has its own namer
COUNTERS = max(1, min(4, os.cpu_count() or 1))
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

            files = ACCESS_RECORDS.files(directory)
            compact = [(tid, path) for tid, path in files if path.endswith(DATA_SUFFIX)]
            helpers = _count_blocks(compact, dimensions, allocator, step) if compact else []
            try:
                for tid, path in files:
                    if not path.endswith(DATA_SUFFIX):
                        for chunk in ACCESS_RECORDS.chunks(path, CHUNK_ROWS):
                            dimensions.ids.count_rows(chunk, allocator.spans(tid))
                            step(len(chunk))
                for helper in helpers:   # their own dense ids: the rows are added up by name
                    _append(totals, helper)
            finally:
                for helper in helpers:
                    helper.close()
        if dimensions is not None:
            _append(totals, dimensions)
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


def _append(totals: AccessTotals, dimensions: AccessDimensions) -> None:
    """The data rows and counts of ``dimensions`` after those already in ``totals``."""
    data, counts = dimensions.new_data(), dimensions.counts()
    if not totals.data:
        totals.data, totals.counts = data, counts
        return
    first = len(totals.counts)
    for key, values in data.items():
        totals.data[key] = list(totals.data[key]) + list(
            values + first if key == "did" else values)
    totals.counts = np.concatenate([totals.counts, counts])


def _count_blocks(files, dimensions: AccessDimensions, allocator, step) -> list[AccessDimensions]:
    """The compact files' blocks counted by COUNTERS threads side by side (the C
    pass releases the GIL), each block by whichever thread is free, each thread
    into its own AccessDimensions (``dimensions``, then new ones returned: their
    ids are their own; the summary adds the rows up by name).  A block that
    starts with its order marker (every block the drain writes: one batch each,
    data/records.py) counts without the blocks before it; one that does not
    waits for the block before it and takes the order it ended with."""
    import queue
    import threading

    from .compact import iter_raw_blocks
    from .read_ahead import read_ahead

    jobs: queue.Queue = queue.Queue(maxsize=2 * COUNTERS)
    counters = [dimensions] + [AccessDimensions(dimensions.namer, whole_objects=True)
                               for _ in range(COUNTERS - 1)]
    errors: list[BaseException] = []
    lock = threading.Lock()
    ends: dict[int, tuple[int, int]] = {}      # block -> (seq, next order) after it

    def count(ids, index: int, start: tuple[int, int], tid: int, reader, raw, n: int,
              planes: bool) -> None:
        for attempt in (0, 1):
            state = access_pass.DecodeState(*start)
            try:
                ids.count_compact(raw, n, planes, reader.table, state, allocator.spans(tid))
                break
            except access_pass.UnknownInstruction as exc:
                with lock:          # appended since the table was read: read it again
                    if attempt or reader.directory is None:
                        raise CorruptTraceError(f"{reader.path}: instruction id {exc.ident} "
                                                "unknown") from None
                    reader.table = InstructionColumns.load(reader.directory)
        with lock:
            ends[index] = (int(state.seq), int(state.next_order))
            step(n)

    def work(ids) -> None:
        while True:
            job = jobs.get()
            try:
                if job is None:
                    return
                if not errors:
                    count(ids, *job)
            except BaseException as exc:     # the first error is raised by the caller
                errors.append(exc)
            finally:
                jobs.task_done()

    threads = [threading.Thread(target=work, args=(c.ids,), name="madtrace-count", daemon=True)
               for c in counters]
    for thread in threads:
        thread.start()
    index = 0
    try:
        for tid, path in files:
            reader = compact_reader(path)
            first = index
            for _offset, raw, n, planes in read_ahead(iter_raw_blocks(path)):
                if errors:
                    break
                if _starts_with_order(raw, n, planes) or index == first:
                    jobs.put((index, (0, 0), tid, reader, raw, n, planes))
                else:           # the order the block before it ended with
                    jobs.join()
                    if errors:
                        break
                    count(dimensions.ids, index, ends[index - 1], tid, reader, raw, n, planes)
                index += 1
            if errors:
                break
    finally:
        for _ in threads:
            jobs.put(None)
        for thread in threads:
            thread.join()
    if errors:
        for helper in counters[1:]:
            helper.close()
        raise errors[0]
    return counters[1:]


def _starts_with_order(raw, n: int, planes: bool) -> bool:
    """Whether a block's order marker comes before its first access (so that it
    decodes without the blocks before it)."""
    head = min(n, 2)
    if planes:
        records = from_planes(np.concatenate([np.frombuffer(raw, dtype=np.uint8)[k * n:k * n + head]
                                              for k in range(COMPACT_DTYPE.itemsize)]), head)
    else:
        records = np.frombuffer(raw, dtype=COMPACT_DTYPE, count=head)
    for ident, b in zip(records["id"].tolist(), records["b"].tolist()):
        if ident != 0:
            return False
        if b == MARK_ORDER:
            return True
    return False
