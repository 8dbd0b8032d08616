# SPDX-License-Identifier: GPL-2.0-or-later
"""Skadu's poly-scopic footprint analysis (madtrace report DIR --kind footprint):
the distinct bytes, 64-byte cache lines and 4 KiB pages each dynamic call
touched, inclusive of its callees (everything touched while it was open)
and exclusive (what its own instructions touched), per call and per
function, in bounded memory.

Design: Skadu's SlimTV for the footprint profiler, in C (footprint.c, built
by ``make`` into build/native/libmtfootprint.so, driven through ctypes).
Calls are numbered in the order they begin (segmentation.py's call ids), so
the open calls have increasing ids; the shadow memory keeps one value per
unit, the id of the last call that touched it as the innermost call, and the
first-touch check against every enclosing call is a binary search of the
stack (the deepest open call with an id <= that value already has the unit;
the deeper ones do not): O(log depth) per unit, no version vector.  The
inclusion property (touched in a call => touched in its callers) turns the
per-level increments into one +1 at the innermost call and one -1 at that
deepest level, summed into each caller when a call ends.  For the exclusive
counts a call that overwrites the value of a still-open caller logs the old
value and puts it back when it ends (see footprint.c).  Skadu's BulkTV (one
version per shadow page) is not needed: the shadow holds no versions at all.
Block events (memcpy/memset/system calls moving memory as one event) count
as the bytes they read and wrote (clipped to the traced regions), in the
call they happened in: each is placed in the event stream by its position
among the thread's call records (``seq``) and accesses (``order``).
Memory: 4 bytes per distinct byte a thread touched (in 256-unit blocks) plus
lines and pages, per open call a few counters and its undo log; output
aggregated per function, with the ``top`` calls of largest inclusive byte
footprint kept (all with ``keep_calls``).  Threads are analysed one after
the other, each with its own shadow (a call's accesses are its thread's).
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import NoDataError, TracerInternalError
from ..native import load
from ..trace.format import FUNCTIONS_FILE, PAGE
from ..trace.meta import read_meta
from ..trace.segmentation import EVENT_ACCESS, iter_thread_chunks, load_tables
from .trace_input import Progress, access_rows, require_accesses, thread_block_ranges

GRANULARITIES = ("bytes", "lines", "pages")
ROW_DTYPE = np.dtype([("call_id", "<i8"), ("fid", "<i8"), ("depth", "<i8"),
                      ("incl", "<i8", (3,)), ("self", "<i8", (3,))])
DEFAULT_TOP_CALLS = 100
_ERRORS = {1: "out of memory", 2: "a thread has more than 2**31 calls",
           3: "more ended calls than END events (a bug)"}


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtfootprint.so", "the footprint analysis", "analysis-native")
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    for name, restype, argtypes in (
            ("fp_new", P, []), ("fp_free", None, [P]), ("fp_reset", None, [P]),
            ("fp_row_size", ctypes.c_size_t, []),
            ("fp_run", I64, [P, I64, P, P, P, P, P, P, P, I64]),
            ("fp_finish", I64, [P, P, I64]), ("fp_error", I64, [P]),
            ("fp_memory", I64, [P]), ("fp_peak_log", I64, [P])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.fp_row_size() != ROW_DTYPE.itemsize:
        raise TracerInternalError("footprint.c and footprint.py disagree on the row layout")
    return lib


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


class FootprintCore:
    """One thread at a time: ``run(events, accesses, access_start)`` -> rows of the
    calls that ended, ``finish()`` -> the rest and the thread's root row."""

    def __init__(self):
        self.lib = _library()
        self.handle = self.lib.fp_new()
        if not self.handle:
            raise MemoryError("footprint analysis: out of memory")
        self.peak_memory = 0

    def close(self) -> None:
        if self.handle:
            self.lib.fp_free(self.handle)
            self.handle = None

    def reset(self) -> None:
        self.lib.fp_reset(self.handle)

    def _check(self, n: int) -> None:
        self.peak_memory = max(self.peak_memory, self.lib.fp_memory(self.handle))
        if n < 0:
            code = self.lib.fp_error(self.handle)
            raise MemoryError(f"footprint analysis: {_ERRORS.get(code, code)}")

    def run(self, events: np.ndarray, accesses: np.ndarray, access_start: int,
            blocks: list[tuple[int, int]] | None = None) -> np.ndarray:
        """``blocks``: (event position, (address, size)) ranges inserted before the
        event at that position (len(events): at the end), in order."""
        types = np.ascontiguousarray(events["type"])
        call_ids = np.ascontiguousarray(events["call_id"], dtype=np.int64)
        fids = np.ascontiguousarray(events["fid"], dtype=np.int32)
        depths = np.ascontiguousarray(events["depth"], dtype=np.int32)
        addrs = np.zeros(len(events), dtype=np.uint64)
        sizes = np.zeros(len(events), dtype=np.uint64)
        is_access = types == EVENT_ACCESS
        if is_access.any():
            refs = events["ref"][is_access] - access_start
            addrs[is_access] = accesses["addr"][refs]
            sizes[is_access] = accesses["size"][refs]
        ends = int(np.count_nonzero(~is_access))
        if blocks:
            where = np.array([p for p, _ in blocks], dtype=np.int64)
            types = np.insert(types, where, EVENT_ACCESS)
            call_ids = np.insert(call_ids, where, -1)
            fids = np.insert(fids, where, -1)
            depths = np.insert(depths, where, 0)
            addrs = np.insert(addrs, where, np.array([a for _, (a, _n) in blocks], np.uint64))
            sizes = np.insert(sizes, where, np.array([n for _, (_a, n) in blocks], np.uint64))
        n = len(types)
        out = np.zeros(max(1, ends), dtype=ROW_DTYPE)
        written = self.lib.fp_run(self.handle, n, _ptr(types), _ptr(call_ids), _ptr(fids),
                                  _ptr(depths), _ptr(addrs), _ptr(sizes), _ptr(out), len(out))
        self._check(written)
        return out[:written]

    def finish(self, open_frames: int) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros(open_frames + 2, dtype=ROW_DTYPE)
        written = self.lib.fp_finish(self.handle, _ptr(out), len(out))
        self._check(written)
        return out[:written - 1], out[written - 1]


@dataclass
class FootprintReport:
    directory: str
    names: list[str]
    functions: dict[int, dict] = field(default_factory=dict)     # fid -> aggregates
    top_calls: np.ndarray | None = None                           # ROW_DTYPE + tid
    threads: list[dict] = field(default_factory=list)
    calls: int = 0
    peak_memory: int = 0
    all_calls: dict[int, np.ndarray] | None = None               # tid -> rows (keep_calls)
    top: int = DEFAULT_TOP_CALLS

    def function_rows(self) -> list[dict]:
        out = []
        for fid, agg in self.functions.items():
            name = self.names[fid] if 0 <= fid < len(self.names) else f"<fid {fid}>"
            entry = {"function": name, "calls": int(agg["calls"])}
            for scope in ("incl", "self"):
                for k, gran in enumerate(GRANULARITIES):
                    entry[f"{scope}_{gran}_sum"] = int(agg[f"{scope}_sum"][k])
                    entry[f"{scope}_{gran}_max"] = int(agg[f"{scope}_max"][k])
                    entry[f"{scope}_{gran}_mean"] = round(float(agg[f"{scope}_sum"][k]) / agg["calls"], 2)
            out.append(entry)
        out.sort(key=lambda e: (-e["incl_bytes_max"], e["function"]))
        return out

    def call_rows(self) -> list[dict]:
        rows = [] if self.top_calls is None else self.top_calls
        out = []
        for r in rows:
            fid = int(r["fid"])
            entry = {"call_id": int(r["call_id"]), "tid": int(r["tid"]), "depth": int(r["depth"]),
                     "function": self.names[fid] if 0 <= fid < len(self.names) else f"<fid {fid}>"}
            for k, gran in enumerate(GRANULARITIES):
                entry[f"incl_{gran}"] = int(r["incl"][k])
                entry[f"self_{gran}"] = int(r["self"][k])
            out.append(entry)
        return out

    def to_dict(self) -> dict:
        return {"kind": "footprint", "directory": self.directory,
                "design": "Skadu SlimTV: one last-toucher call id per unit, binary search "
                          "of the open calls; undo log for exclusive counts",
                "granularities": {"bytes": 1, "lines": 64, "pages": PAGE},
                "calls": self.calls, "calls_listed": len(self.call_rows()),
                "analysis_peak_bytes": self.peak_memory, "threads": self.threads,
                "functions": self.function_rows(), "top_calls": self.call_rows()}


RECORD_KEY = np.iinfo(np.uint64).max   # a call record comes after the accesses of its seq


def event_keys(chunk) -> tuple[np.ndarray, np.ndarray]:
    """(k1, k2) of each event: an access with seq q and order o is (q, o), a
    BEGIN/END at record position r is (r, max): the stream is sorted by them."""
    events = chunk.events
    is_access = events["type"] == EVENT_ACCESS
    k1 = events["ref"].astype(np.int64)
    k2 = np.full(len(events), RECORD_KEY, dtype=np.uint64)
    if is_access.any():
        refs = events["ref"][is_access] - chunk.access_start
        k1[is_access] = chunk.accesses["seq"][refs].astype(np.int64)
        k2[is_access] = chunk.accesses["order"][refs]
    return k1, k2


def place_blocks(chunk, pending: list) -> list[tuple[int, tuple[int, int]]]:
    """The block ranges (seq, order, address, size) of ``pending`` (reversed:
    next one last) that fall in this chunk (all that are left in the thread's
    last chunk), with the position of the event they come before."""
    k1, k2 = event_keys(chunk)
    out = []
    while pending:
        seq, order, address, size = pending[-1]
        if not chunk.last and (not len(k1) or (seq, order) > (int(k1[-1]), int(k2[-1]))):
            break
        pending.pop()
        lo = int(np.searchsorted(k1, seq, side="left"))
        hi = int(np.searchsorted(k1, seq, side="right"))
        out.append((lo + int(np.searchsorted(k2[lo:hi], np.uint64(order), side="right")),
                    (address, size)))
    return out


TOP_DTYPE = np.dtype(ROW_DTYPE.descr + [("tid", "<i8")])


def _merge_top(current: np.ndarray | None, rows: np.ndarray, tid: int, top: int) -> np.ndarray:
    extra = np.zeros(len(rows), dtype=TOP_DTYPE)
    for name in ROW_DTYPE.names:
        extra[name] = rows[name]
    extra["tid"] = tid
    merged = extra if current is None else np.concatenate([current, extra])
    if len(merged) > top:
        keep = np.argsort(-merged["incl"][:, 0], kind="stable")[:top]
        merged = merged[np.sort(keep)]
    return merged


def _aggregate(report: FootprintReport, rows: np.ndarray) -> None:
    if not len(rows):
        return
    report.calls += len(rows)
    for fid in np.unique(rows["fid"]).tolist():
        part = rows[rows["fid"] == fid]
        agg = report.functions.get(fid)
        if agg is None:
            agg = report.functions[fid] = {"calls": 0, "incl_sum": np.zeros(3, np.int64),
                                           "self_sum": np.zeros(3, np.int64),
                                           "incl_max": np.zeros(3, np.int64),
                                           "self_max": np.zeros(3, np.int64)}
        agg["calls"] += len(part)
        for scope in ("incl", "self"):
            agg[f"{scope}_sum"] += part[scope].sum(axis=0)
            agg[f"{scope}_max"] = np.maximum(agg[f"{scope}_max"], part[scope].max(axis=0))


def footprint(directory: str, keep_calls: bool = False, top: int = DEFAULT_TOP_CALLS,
              chunk_rows: int | None = None) -> FootprintReport:
    require_accesses(directory, "footprint")
    if not os.path.exists(os.path.join(directory, FUNCTIONS_FILE)):
        raise NoDataError(f"{directory} has no call records: --kind footprint needs a trace "
                          "recorded with function tracing and --data")
    tables = load_tables(directory)
    report = FootprintReport(directory, tables.names, top=top)
    report.all_calls = {} if keep_calls else None
    progress = Progress("footprint", access_rows(directory))
    core = FootprintCore()
    kwargs = {"chunk_rows": chunk_rows} if chunk_rows else {}
    try:
        current = None
        block_ranges = thread_block_ranges(directory, read_meta(directory))
        pending: list[tuple[int, int, int, int]] = []
        for chunk in iter_thread_chunks(directory, tables=tables, **kwargs):
            if chunk.tid != current:
                core.reset()
                current = chunk.tid
                pending = block_ranges.get(chunk.tid, [])[::-1]    # popped from the end
            progress.add(len(chunk.accesses))
            blocks = place_blocks(chunk, pending) if pending else None
            rows = core.run(chunk.events, chunk.accesses, chunk.access_start, blocks)
            if chunk.last:
                rest, root = core.finish(int(chunk.stats.get("open_frames", 0) or 0))
                rows = np.concatenate([rows, rest]) if len(rest) else rows
                report.threads.append({"tid": chunk.tid, **{
                    f"{scope}_{gran}": int(root[scope][k]) for scope in ("incl", "self")
                    for k, gran in enumerate(GRANULARITIES)}})
            _aggregate(report, rows)
            if len(rows):
                report.top_calls = _merge_top(report.top_calls, rows, chunk.tid, top)
            if keep_calls and len(rows):
                report.all_calls.setdefault(chunk.tid, []).append(rows)
        if keep_calls:
            report.all_calls = {tid: np.concatenate(parts)
                                for tid, parts in report.all_calls.items()}
    finally:
        report.peak_memory = core.peak_memory
        core.close()
    if report.top_calls is not None:
        order = np.argsort(-report.top_calls["incl"][:, 0], kind="stable")
        report.top_calls = report.top_calls[order]
    return report
