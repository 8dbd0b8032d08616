# SPDX-License-Identifier: GPL-2.0-or-later
"""The segmentation of a trace: every dynamic call (segment) and the call each
data access belongs to, exactly, in bounded memory.  Everything that needs
calls or per-call accesses uses this one replay: the call tree
(calltree.py), the segmented listing (segments.py), the trace store
(madtrace/trace/), the summary and the footprint analysis.

Input: the raw capture of a trace directory, ``calls/<tid>.rec`` (call
records) and ``data/<tid>.acc`` (accesses; an access with ``seq`` q lies
between the thread's records q-1 and q), read in chunks.  The frame rules
(tail calls, longjmp, unmatched exits after an attach, rsp ordering) are
those of calltree.py's docstring, implemented once in replay.c.

Identifiers and positions
-------------------------
* ``call_id``: unique in the trace; each thread's calls are numbered in the
  order they began, threads one after the other by tid (thread 1's calls are
  0..n1-1, the next thread's n1.., ...).  ``-1`` = outside every traced call.
* ``fid``: index into ``CallTables.names`` (``load_tables(directory).names``).
* record positions (``begin_seq``, ``end_seq``): the index of a record in its
  thread's record file.  A call begins at its entry record and ends at the
  record that ended it (its exit record, or the record that proved it over);
  a call still open at the end has ``end_seq`` = the thread's record count.
  An access with ``seq`` q is inside the call iff ``begin_seq < q <= end_seq``.
* ``depth``: 1 for a call with no traced caller; ``parent_id``: the caller's
  call_id (``-1``: none).
* ``fate``: 0 completed (its exit record, or a tail frame ending with its
  frame), 1 unwound (left by longjmp: no exit record), 2 open (the records
  ended first), 3 unmatched (an exit whose call began before tracing did:
  ``begin_seq`` -1, ``begin_tsc`` the thread's first record, no accesses).
  ``FATES`` names them.
* ``outer``: 1 when no call of the same function is open below it (the
  outermost activation of a recursion: sum inclusive counts over these).
* ``accesses_self``/``bytes_self``: accesses made while the call was the
  innermost traced call; ``accesses_incl``/``bytes_incl``: while it was open
  (its callees' included); ``accesses_before``: the thread's accesses
  before it began (so its first event in the merged stream of records and
  accesses is at ``begin_seq + accesses_before``).  Times ``begin_tsc``/``end_tsc`` are raw TSC ticks
  (0 with ``--no-time``; ``CallTables.tsc_hz`` converts).

API
---
``iter_thread_chunks(directory, accesses=True, chunk_rows=N)`` yields
:class:`SegmentChunk` objects, thread after thread (by tid), each thread's
chunks in exact order; memory is bounded by ``chunk_rows``.  A chunk holds:

* ``events`` (``EVENT_DTYPE``): the ordered stream of this part of the
  thread: ``type`` EVENT_BEGIN (a call began: ``call_id``, ``fid``,
  ``depth``, ``ref`` = its entry record's position, ``tsc``), EVENT_END (a
  call ended: ``fate``, ``ref`` = ``end_seq``, ``tsc``; innermost first when
  several end at once; an unmatched exit is an END without a BEGIN) and
  EVENT_ACCESS (``call_id`` of the innermost open call, ``depth``, ``fid``;
  ``ref`` = the access's index in its thread's file);
* ``segments`` (``SEGMENT_DTYPE``): one row per END event, in the same order;
* ``accesses`` (``ACCESS_DTYPE``), ``access_start``: the accesses of the
  ACCESS events, in order (``accesses[i]`` is the access with index
  ``access_start + i``), so ``accesses[ev["ref"] - access_start]`` is an
  access event's record; ``access_call_ids`` is aligned with ``accesses``;
* ``records``, ``record_start``: likewise for the call records;
* ``last``: the thread's final chunk; ``stats`` then holds its counters
  (records, entries, exits, unmatched_exits, unwound_frames, open_frames,
  first_tsc, last_tsc, accesses, bytes).

A footprint analysis keeps a stack: push at BEGIN, account each ACCESS to
the top (and, inclusively, to the frames below), pop at END.  Shortcuts:
``iter_segments(directory)`` (tid, segments) and
``iter_access_call_ids(directory, chunk_rows)`` (tid, call ids) in chunks
aligned with ``madtrace.trace.reader.iter_access_chunks(directory,
chunk_rows=chunk_rows)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..errors import CorruptTraceError
from .format import ACCESS_DTYPE, FUNCTIONS_FILE, RECORD_DTYPE, load_functions
from .record_files import ACCESS_RECORDS, CALL_RECORDS
from .reader import iter_access_chunks, iter_call_chunks
from .replay import (EVENT_ACCESS, EVENT_BEGIN, EVENT_DTYPE, EVENT_END, FATES, KIND_CALL,
                     KIND_ENTRY, KIND_ROOT, KIND_TAIL_ENCLOSED, KIND_TAIL_FREE, NO_EXIT,
                     SEGMENT_DTYPE, ThreadReplay)

__all__ = ["CallTables", "load_tables", "thread_files", "SegmentChunk", "iter_thread_chunks",
           "iter_segments", "iter_access_call_ids", "EVENT_BEGIN", "EVENT_END", "EVENT_ACCESS",
           "EVENT_DTYPE", "SEGMENT_DTYPE", "FATES", "KIND_CALL", "KIND_ENTRY", "KIND_ROOT",
           "KIND_TAIL_ENCLOSED", "KIND_TAIL_FREE", "NO_EXIT"]

DEFAULT_CHUNK_ROWS = 1 << 18
SITE_KINDS = {"call": KIND_CALL, "entry": KIND_ENTRY, "tail": KIND_TAIL_FREE}
_EMPTY_ACCESSES = np.zeros(0, dtype=ACCESS_DTYPE)
_EMPTY_RECORDS = np.zeros(0, dtype=RECORD_DTYPE)


# ------------------------------------------------------------------ input
@dataclass
class CallTables:
    """What functions.json says about the record codes."""

    names: list[str]            # function names; a fid indexes this list
    timestamps: bool
    tsc_hz: float | None
    code_fid: list[int]         # indexed by record code (entry and exit codes)
    code_kind: list[int]        # frame kind opened by an entry code
    code_exit: list[int]        # exit code expected by the frame an entry code opens
    code_valid: np.ndarray      # bool per code: does the site exist

    @property
    def n_codes(self) -> int:
        return len(self.code_fid)


def empty_tables() -> CallTables:
    return CallTables(names=[], timestamps=False, tsc_hz=None, code_fid=[], code_kind=[],
                      code_exit=[], code_valid=np.zeros(0, dtype=bool))


def load_tables(directory: str, required: bool = True) -> CallTables:
    """The tables of ``functions.json``.  ``required=False``: a trace recorded
    without function tracing (no functions.json and no record file) has empty
    tables instead of an error."""
    path = os.path.join(directory, FUNCTIONS_FILE)
    if not os.path.isdir(directory):
        raise CorruptTraceError(f"{directory}: no such trace directory")
    doc = load_functions(directory)
    if doc is None:
        if not required and not thread_files(directory):
            return empty_tables()
        raise CorruptTraceError(f"{directory}: no {FUNCTIONS_FILE} "
                                "(recorded without function tracing?)")
    try:
        names: list[str] = []
        fids: dict[str, int] = {}

        def fid_of(name: str) -> int:
            if not isinstance(name, str):
                raise TypeError(f"function name {name!r} is not a string")
            if name not in fids:
                fids[name] = len(names)
                names.append(name)
            return fids[name]

        for fn in doc.get("functions", []):
            if fn.get("method") != "skipped":
                fid_of(fn["name"])
        sites = doc["sites"]
        n_sites = max((int(s["sid"]) for s in sites), default=-1) + 1
        code_fid = [-1] * (2 * n_sites)
        code_kind = [KIND_CALL] * (2 * n_sites)
        code_exit = [NO_EXIT] * (2 * n_sites)
        code_valid = np.zeros(2 * n_sites, dtype=bool)
        for site in sites:
            sid, kind = int(site["sid"]), site["kind"]
            if sid < 0 or kind not in SITE_KINDS:
                raise ValueError(f"site {sid} has kind {kind!r}")
            entry = sid << 1
            fid = fid_of(site["function"])
            code_fid[entry] = code_fid[entry | 1] = fid
            code_kind[entry] = SITE_KINDS[kind]
            code_exit[entry] = NO_EXIT if kind == "tail" else entry | 1
            code_valid[entry] = True
            code_valid[entry | 1] = kind != "tail"
        tsc_hz = doc.get("tsc_hz")
        timestamps = bool(doc.get("timestamps", True))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptTraceError(f"{path}: corrupt ({type(exc).__name__}: {exc})") from None
    return CallTables(names=names, timestamps=timestamps,
                      tsc_hz=float(tsc_hz) if tsc_hz else None,
                      code_fid=code_fid, code_kind=code_kind, code_exit=code_exit,
                      code_valid=code_valid)


def thread_files(directory: str) -> list[tuple[int, str]]:
    """(tid, path) of every calls/<tid>.rec, by tid."""
    return CALL_RECORDS.files(directory)


def check_codes(tables: CallTables, chunk: np.ndarray, path: str, start: int) -> None:
    """CorruptTraceError for the first record whose code names no known site."""
    codes = chunk["code"]
    bad = codes >= tables.n_codes
    if not bad.any():
        bad = ~tables.code_valid[codes]
    if bad.any():
        i = int(np.argmax(bad))
        raise CorruptTraceError(f"{path}: record {start + i} has code {int(codes[i])}, "
                                "which names no known site")


# ---------------------------------------------------------------- chunks
@dataclass
class SegmentChunk:
    tid: int
    events: np.ndarray                 # EVENT_DTYPE, in exact order
    segments: np.ndarray               # SEGMENT_DTYPE, one per END event, same order
    records: np.ndarray                # RECORD_DTYPE consumed by this chunk
    record_start: int                  # position of records[0] in the thread
    accesses: np.ndarray               # ACCESS_DTYPE of the ACCESS events, in order
    access_start: int                  # index of accesses[0] in the thread
    last: bool = False                 # the thread's final chunk
    stats: dict = field(default_factory=dict)   # the thread's counters (final chunk)

    @property
    def access_call_ids(self) -> np.ndarray:
        """call_id of each of ``accesses`` (-1: outside every traced call)."""
        return self.events["call_id"][self.events["type"] == EVENT_ACCESS]


class _Stream:
    """A chunked array source with a read position (records or accesses of one thread)."""

    def __init__(self, chunks: Iterator[np.ndarray], empty: np.ndarray):
        self.chunks = chunks
        self.buffer = empty
        self.pos = 0          # in buffer
        self.start = 0        # thread index of buffer[0]
        self.done = False

    def refill(self) -> None:
        if self.pos < len(self.buffer) or self.done:
            return
        self.start += len(self.buffer)
        nxt = next(self.chunks, None)
        if nxt is None:
            self.done = True
            self.buffer = self.buffer[:0]
        else:
            self.buffer = nxt
        self.pos = 0

    @property
    def rest(self) -> np.ndarray:
        return self.buffer[self.pos:]


def _thread_records(directory: str, tid: int, path: str | None, tables: CallTables,
                    chunk_rows: int) -> Iterator[np.ndarray]:
    if path is None:
        return
    start = 0
    for _t, chunk in iter_call_chunks(directory, tid=tid, chunk_rows=chunk_rows):
        check_codes(tables, chunk, path, start)
        start += len(chunk)
        yield chunk


def iter_thread_chunks(directory: str, *, accesses: bool = True,
                       chunk_rows: int = DEFAULT_CHUNK_ROWS,
                       tables: CallTables | None = None,
                       skip: set[int] | None = None, only: int | None = None,
                       first_call: int = 0) -> Iterator[SegmentChunk]:
    """The segmented stream of every thread (see the module docstring).
    ``accesses=False``: calls only (the data files are not read); ``skip``:
    threads without call records the caller reads itself (they have no calls:
    the call ids of the others are the same); ``only``: that thread alone, its
    first call numbered ``first_call`` (the calls of the threads before it)."""
    if tables is None:
        tables = load_tables(directory, required=False)
    record_paths = dict(thread_files(directory))
    tids = set(record_paths)
    if accesses:
        tids |= {t for t, _ in ACCESS_RECORDS.files(directory)}
    if skip:
        if skip & set(record_paths):
            raise ValueError("only threads without call records can be skipped")
        tids -= skip
    if only is not None:
        tids &= {only}
    next_call = first_call
    for tid in sorted(tids):
        replay_first = next_call
        replay = ThreadReplay(tables.code_fid, tables.code_exit, tables.code_kind,
                              len(tables.names), next_call, chunk_rows)
        try:
            records = _Stream(_thread_records(directory, tid, record_paths.get(tid), tables,
                                              chunk_rows), _EMPTY_RECORDS)
            access_source = (chunk for _t, chunk in iter_access_chunks(
                directory, tid=tid, chunk_rows=chunk_rows)) if accesses else iter(())
            acc = _Stream(access_source, _EMPTY_ACCESSES)
            while True:
                records.refill()
                acc.refill()
                rec_rest, acc_rest = records.rest, acc.rest
                n_rec, n_acc, events, segments = replay.run(
                    rec_rest, acc_rest["seq"], acc_rest["size"], records.done, acc.done)
                if n_rec == n_acc == len(events) == 0:
                    if records.done and acc.done:
                        break
                    raise RuntimeError("segmentation made no progress")   # a bug
                chunk = SegmentChunk(tid, events, segments, rec_rest[:n_rec],
                                     records.start + records.pos, acc_rest[:n_acc],
                                     acc.start + acc.pos)
                records.pos += n_rec
                acc.pos += n_acc
                yield chunk
            stats = replay.stats()
            events, segments = replay.finish()
            stats["open_frames"] = stats.pop("depth")
            stats["calls"] = stats["next_call"] - replay_first
            next_call = stats.pop("next_call")
            stats.pop("closed")
            yield SegmentChunk(tid, events, segments, _EMPTY_RECORDS, stats["records"],
                               _EMPTY_ACCESSES, stats["accesses"], last=True, stats=stats)
        finally:
            replay.close()


def iter_segments(directory: str, chunk_rows: int = DEFAULT_CHUNK_ROWS
                  ) -> Iterator[tuple[int, np.ndarray]]:
    """(tid, SEGMENT_DTYPE rows) of every call, each thread's in the order the
    calls ended (accesses counted: accesses_self/incl, bytes_self/incl)."""
    for chunk in iter_thread_chunks(directory, chunk_rows=chunk_rows):
        if len(chunk.segments):
            yield chunk.tid, chunk.segments


def iter_access_call_ids(directory: str, chunk_rows: int = 1 << 20
                         ) -> Iterator[tuple[int, np.ndarray]]:
    """(tid, int64 call ids) in the same chunks as
    ``reader.iter_access_chunks(directory, chunk_rows=chunk_rows)``."""
    pending: list[np.ndarray] = []
    held = 0
    for chunk in iter_thread_chunks(directory, chunk_rows=min(chunk_rows, DEFAULT_CHUNK_ROWS)):
        ids = chunk.access_call_ids
        if len(ids):
            pending.append(ids)
            held += len(ids)
        while held >= chunk_rows:
            joined = np.concatenate(pending)
            yield chunk.tid, joined[:chunk_rows]
            rest = joined[chunk_rows:]
            pending, held = ([rest] if len(rest) else []), len(rest)
        if chunk.last and held:
            yield chunk.tid, np.concatenate(pending)
            pending, held = [], 0
