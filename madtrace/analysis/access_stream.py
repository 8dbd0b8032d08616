# SPDX-License-Identifier: GPL-2.0-or-later
"""The data accesses of a trace as one stream, in the order they happened,
each with what the memory analyses (cache, sharing, reuse) attribute to:
its data (the store's data id, named once per id), its instruction, its
function and call (the segmentation).

Within a thread the order is exact.  Across threads the accesses are merged
by ``order``, the tracer's event counter: exact under the fault engine,
where every access takes the next value; under the hybrid engine a thread's
accesses between two allocation events share the epoch of the first, so
threads' accesses within an epoch are interleaved by thread (lowest first).
docs/design/memory-analyses.md says what this means for each analysis.

A thread without call records is not segmented: its compact records are
decoded and named a tile at a time into the columns (no access row made).
The report kinds' counters of a pass shared with the stream's readers
(shared_pass.py) are fed each access as it is read (``counting``).

Memory: a chunk of columns per thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from ..trace.access_names import AccessDimensions
from ..trace.allocator_calls import AllocatorCalls
from ..trace.compact import compact_reader
from ..trace.naming import AccessNamer
from ..trace.read_ahead import read_ahead
from ..trace.record_files import ACCESS_RECORDS, CALL_RECORDS
from ..trace.segmentation import iter_thread_chunks, load_tables
from . import access_counters
from .trace_input import Progress, access_rows, require_accesses

CHUNK_ROWS = 1 << 19
COLUMNS = ("addr", "size", "kind", "rip", "did", "fid", "call_id", "order")
# the columns a thread without call records reads from its compact records (its
# fid and call_id: -1)
COMPACT_COLUMNS = {
    "addr": np.uint64,
    "size": np.uint16,
    "kind": np.uint8,
    "rip": np.uint64,
    "did": np.uint32,
    "order": np.uint64,
}


@dataclass
class StreamChunk:
    """Accesses in the order they happened: ``thread`` the thread's index in
    ``AccessStream.tids`` (one int when the chunk is one thread's, else an int32
    array), the columns of COLUMNS (``fid``/``call_id`` -1: outside every
    traced call)."""

    thread: int | np.ndarray
    columns: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["addr"])


class AccessStream:
    """See the module docstring.  ``label``: the analysis, for progress lines;
    ``counting(tid)``: called in the reading thread before the first access of
    each thread, the counters (access_counters.count's) to feed its accesses."""

    def __init__(self, directory: str, label: str, counting: Callable[[int], dict] | None = None):
        require_accesses(directory, label)
        self.directory = directory
        self.label = label
        self.counting = counting
        self.tables = load_tables(directory, required=False)
        self.function_names = list(self.tables.names)
        self.call_threads = {t for t, _ in CALL_RECORDS.files(directory)}
        self.has_calls = bool(self.call_threads)
        self.tids = sorted({t for t, _ in ACCESS_RECORDS.files(directory)})
        self.allocator = AllocatorCalls.load(directory)
        self.dimensions = AccessDimensions(AccessNamer(directory))
        self.total = access_rows(directory)
        engine = (require_accesses(directory, label).get("data_tracing") or {}).get("engine")
        # how threads' accesses are interleaved: "exact" (the fault engine: each
        # access takes the next order), "drain" (the order the rings were drained in)
        self.interleaving = "exact" if engine == "fault" or len(self.tids) < 2 else "drain"
        self._labels: tuple[list[str], list[str], list[str | None]] | None = None
        self._no_call: dict[str, np.ndarray] = {
            "fid": np.zeros(0, np.int32),
            "call_id": np.zeros(0, np.int64),
        }

    def close(self) -> None:
        self.dimensions.close()

    # ------------------------------------------------------------ the rows
    def _columns(self, tid: int, rows: np.ndarray, access_start: int, events) -> dict[str, np.ndarray]:
        """The COLUMNS of ``rows`` (the first of index ``access_start`` in the
        thread); ``events``: their segmentation's (None: no call records, every
        access outside every call)."""
        if events is None:
            ids = {"did": self.dimensions.data_ids(rows), **self._outside_calls(len(rows))}
        else:
            ids = self.dimensions.rows(rows, access_start, events, self.allocator.spans(tid))
        return {
            "addr": rows["addr"],
            "size": rows["size"],
            "kind": rows["kind"],
            "rip": rows["rip"],
            "did": ids["did"],
            "fid": ids["fid"],
            "call_id": ids["call_id"],
            "order": rows["order"],
        }

    def _outside_calls(self, n: int) -> dict[str, np.ndarray]:
        """``fid`` and ``call_id`` columns of ``n`` accesses outside every call (-1):
        views of arrays made once."""
        if len(self._no_call["fid"]) < n:
            self._no_call = {
                "fid": np.full(n, -1, dtype=np.int32),
                "call_id": np.full(n, -1, dtype=np.int64),
            }
        return {k: v[:n] for k, v in self._no_call.items()}

    def _thread(self, tid: int, first_call: int) -> Iterator[dict[str, np.ndarray]]:
        """The columns of each chunk of the thread's accesses, the counters fed
        its rows first; a thread without call records is not segmented (every
        access outside every call)."""
        counters = self.counting(tid) if self.counting is not None else {}
        if tid in self.call_threads:
            for chunk in iter_thread_chunks(
                self.directory, tables=self.tables, only=tid, first_call=first_call, chunk_rows=CHUNK_ROWS
            ):
                if len(chunk.accesses):
                    if counters:
                        access_counters.count(chunk.accesses, tid, **counters)
                    yield self._columns(tid, chunk.accesses, chunk.access_start, chunk.events)
            return
        for t, path in ACCESS_RECORDS.files(self.directory):
            if t != tid:
                continue
            if ACCESS_RECORDS.is_compact(path):
                for columns in compact_reader(path).column_chunks(
                    COMPACT_COLUMNS,
                    lambda raw, n, planes, table, state, out, at, _start: access_counters.stream_block(
                        raw, n, planes, table, state, tid, self.dimensions.ids, out, at, **counters
                    ),
                    CHUNK_ROWS,
                ):
                    yield {**columns, **self._outside_calls(len(columns["addr"]))}
                continue
            for rows in read_ahead(ACCESS_RECORDS.chunks(path, CHUNK_ROWS)):
                if counters:
                    access_counters.count(rows, tid, **counters)
                yield self._columns(tid, rows, 0, None)

    def _first_calls(self) -> dict[int, int]:
        """Each thread's first call id (the calls of the threads before it)."""
        first: dict[int, int] = {}
        total = 0
        if not self.has_calls:
            return {tid: 0 for tid in self.tids}
        counted: dict[int, int] = {}
        for chunk in iter_thread_chunks(self.directory, tables=self.tables, accesses=False):
            if chunk.last:
                counted[chunk.tid] = int(chunk.stats.get("calls", 0)) if chunk.stats else 0
        for tid in sorted(set(counted) | set(self.tids)):
            first[tid] = total
            total += counted.get(tid, 0)
        return first

    def threads(self) -> Iterator[tuple[int, StreamChunk]]:
        """(tid, chunk) of each thread in turn, each in its own order."""
        progress = Progress(self.label, self.total)
        first = self._first_calls() if len(self.tids) > 1 else {t: 0 for t in self.tids}
        for index, tid in enumerate(self.tids):
            for columns in self._thread(tid, first[tid]):
                progress.add(len(columns["addr"]))
                yield tid, StreamChunk(index, columns)

    def merged(self) -> Iterator[StreamChunk]:
        """Every thread's accesses in one stream, merged by order (see the
        module docstring); one thread's pass straight through."""
        if len(self.tids) == 1:
            for _tid, chunk in self.threads():
                yield chunk
            return
        progress = Progress(self.label, self.total)
        first = self._first_calls()
        sources = [self._thread(tid, first[tid]) for tid in self.tids]
        pending: list[dict[str, np.ndarray] | None] = [None] * len(sources)
        live = list(range(len(sources)))
        while live:
            for i in list(live):
                p = pending[i]
                if p is None or len(p["addr"]) == 0:
                    got = next(sources[i], None)
                    if got is None:
                        live.remove(i)
                        pending[i] = None
                    else:
                        pending[i] = got
            held = [i for i, p in enumerate(pending) if p is not None and len(p["addr"])]
            if not held:
                break
            # every row up to the lowest last order of a thread that may still
            # bring more: nothing later can come before them
            ends = [int(p["order"][-1]) for i in held if i in live for p in [pending[i]] if p is not None]
            horizon = min(ends) if ends else int(np.iinfo(np.uint64).max)
            parts, threads = [], []
            for i in held:
                cols = pending[i]
                assert cols is not None
                cut = int(
                    np.searchsorted(np.maximum.accumulate(cols["order"]), np.uint64(horizon), side="right")
                )
                if cut:
                    parts.append({k: v[:cut] for k, v in cols.items()})
                    threads.append(np.full(cut, i, dtype=np.int32))
                    pending[i] = {k: v[cut:] for k, v in cols.items()}
            thread = np.concatenate(threads)
            columns = {k: np.concatenate([p[k] for p in parts]) for k in COLUMNS}
            order = np.argsort(columns["order"], kind="stable")
            progress.add(len(order))
            yield StreamChunk(thread[order], {k: v[order] for k, v in columns.items()})

    # ----------------------------------------------------------- the names
    def data_labels(self) -> tuple[list[str], list[str], list[str | None]]:
        """Per data id: its name (variable and field, heap block, symbol or
        region), its region, and the allocation site of its heap block
        (``<malloc@main+107>``: the allocator and the call site; None: not a
        block).  After the stream was read (made once, for every analysis
        that read it)."""
        if self._labels is None:
            self._labels = self._make_labels()
        return self._labels

    def _make_labels(self) -> tuple[list[str], list[str], list[str | None]]:
        data = self.dimensions.new_data()
        names = [
            variable or symbol or region
            for variable, symbol, region in zip(data["variable"], data["symbol"], data["region"])
        ]
        blocks = self.dimensions.namer.blocks
        sites: list[str | None] = []
        for block in data["block"]:
            row = blocks.rows[int(block) - 1] if block else None
            sites.append(
                None
                if row is None
                else f"<{blocks.kinds[int(row['kind'])]}@{blocks.sites[int(row['site'])]}>"
            )
        return names, list(data["region"]), sites

    def function_name(self, fid: int) -> str:
        return self.function_names[fid] if 0 <= fid < len(self.function_names) else "(no traced call)"
