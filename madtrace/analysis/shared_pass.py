# SPDX-License-Identifier: GPL-2.0-or-later
"""One pass over a trace's data accesses, shared by the report kinds that
read them all: a report of several kinds (``report all``, the HTML page)
reads, decodes and names each access once, not once per kind.

Each kind brings a :class:`Part`: a C counter (access_counters.py: one loop
over a tile of rows feeds every counter of the pass), or work of its own per
chunk (``add``: the memory analyses' simulations, on the stream's named
columns, access_stream.py), and makes its result from what it counted
(``result``).  Threads come one after the other, each in its own order; each
part is told which thread comes next (``thread``).  The stream (segmentation
and names) is read only when a part needs it (``names``); else the records
go straight to the counters.  A kind that needs every thread's accesses
merged in one order (cache and sharing, of more than one thread) is no part:
it reads the trace alone.

With more than one part, each part with work of its own runs it in a thread
of its own (a :class:`_Lane`, fed the chunks in order), beside the reading
and the counters: that work is C (a simulation and its tallies), which runs
without the GIL.  Memory: a few chunks in flight per lane.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from ..trace.compact import compact_reader
from ..trace.read_ahead import read_ahead
from ..trace.record_files import ACCESS_RECORDS
from . import access_counters
from .access_stream import AccessStream, StreamChunk
from .trace_input import Progress, access_rows

# rows per chunk of the fault engine's files (and of numa's first touches): small enough
# (12 MB) that the memory of a chunk is reused for the next (glibc maps larger blocks
# afresh, each page zeroed)
CHUNK_ROWS = 1 << 18


def trace_threads(directory: str) -> list[int]:
    """The threads with data accesses, in order."""
    return sorted({t for t, _ in ACCESS_RECORDS.files(directory)})


class Part:
    """A kind's share of the pass (see the module docstring)."""

    label = ""  # the kind, for progress lines
    # its C counter: (its keyword in access_counters.count: heatmap, alloc, numa or
    # source; the counter object)
    counter: tuple[str, Any] | None = None
    names = False  # add() reads the stream's names

    def prepare(self, shared: "SharedPass") -> None:
        """Before the accesses: ``shared`` says the threads and has the stream."""

    def thread(self, tid: int) -> None:
        """The accesses of ``tid`` come next (a counter's part: told in the thread
        that reads the accesses)."""

    def add(self, tid: int, chunk: StreamChunk) -> None:
        """A chunk of the thread's accesses (parts with ``names``)."""

    def result(self) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """The part's C objects freed (also after an error)."""


class _Lane:
    """A part's ``thread`` and ``add`` calls, in order, in a thread of its own.
    Its first error is raised in the pass (``put``, ``finish``)."""

    def __init__(self, part: Part, depth: int = 2):
        self.part = part
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.worker = threading.Thread(target=self._work, name=f"madtrace-{part.label}", daemon=True)
        self.worker.start()

    def _work(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue  # what is left is dropped
            tid, chunk = item
            try:
                if chunk is None:
                    self.part.thread(tid)
                else:
                    self.part.add(tid, chunk)
            except BaseException as exc:  # raised in the pass
                self.error = exc

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, tid: int, chunk: StreamChunk | None) -> None:
        """``chunk`` None: the thread ``tid`` comes next."""
        self._raise()
        self.queue.put((tid, chunk))

    def finish(self) -> None:
        """Waits for the work put so far (the end of the pass, or an error)."""
        self.queue.put(None)
        self.worker.join()
        self._raise()


class SharedPass:
    """The pass of ``parts`` over ``directory``'s accesses; ``run()`` gives
    their results, in order.  The counters are fed as the accesses are read
    (by the stream, in its reading thread, when there is one)."""

    def __init__(self, directory: str, parts: list[Part]):
        self.directory = directory
        self.parts = parts
        self.tids = trace_threads(directory)
        self.label = ", ".join(p.label for p in parts)
        self.counting = [p for p in parts if p.counter is not None]
        self.counters = dict(p.counter for p in self.counting if p.counter is not None)
        self.stream = (
            AccessStream(directory, self.label, self._counters_for if self.counting else None)
            if any(p.names for p in parts)
            else None
        )

    def _counters_for(self, tid: int) -> dict:
        """The counters, each told that the accesses of ``tid`` come next."""
        for part in self.counting:
            part.thread(tid)
        return self.counters

    def _count_records(self) -> None:
        """Without the stream: each thread's records straight to the counters (a
        block of compact records decoded a tile at a time, no row made)."""
        progress = Progress(self.label, access_rows(self.directory))
        current, counters = None, {}
        for tid, path in ACCESS_RECORDS.files(self.directory):
            if tid != current:
                current, counters = tid, self._counters_for(tid)
            if ACCESS_RECORDS.is_compact(path):
                compact_reader(path).each_block(
                    lambda raw, n, planes, table, state, tid=tid, counters=counters: (
                        access_counters.count_block(raw, n, planes, table, state, tid, **counters)
                    ),
                    lambda _n, rows: progress.add(rows),
                )
                continue
            for rows in read_ahead(ACCESS_RECORDS.chunks(path, CHUNK_ROWS)):
                progress.add(len(rows))
                access_counters.count(rows, tid, **counters)

    def _read_stream(self, lanes: list[_Lane]) -> None:
        """The stream's chunks, thread after thread, to the parts that read it."""
        assert self.stream is not None
        named = [p for p in self.parts if p.names] if not lanes else []
        current = None
        for tid, chunk in read_ahead(self.stream.threads()):
            if tid != current:
                current = tid
                for part in named:
                    part.thread(tid)
                for lane in lanes:
                    lane.put(tid, None)
            for lane in lanes:
                lane.put(tid, chunk)
            for part in named:
                part.add(tid, chunk)

    def run(self) -> list:
        lanes = [_Lane(p) for p in self.parts if p.names] if len(self.parts) > 1 else []
        try:
            for part in self.parts:
                part.prepare(self)
            if self.stream is None:
                self._count_records()
            else:
                self._read_stream(lanes)
            for lane in lanes:
                lane.finish()
            return [part.result() for part in self.parts]
        finally:
            for lane in lanes:
                if lane.worker.is_alive():
                    lane.queue.put(None)
                    lane.worker.join()
            for part in self.parts:
                part.close()
            if self.stream is not None:
                self.stream.close()


def run_parts(directory: str, parts: list[Part]) -> list:
    """The results of ``parts`` after one pass over the accesses."""
    return SharedPass(directory, parts).run()
