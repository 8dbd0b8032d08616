# SPDX-License-Identifier: GPL-2.0-or-later
"""The frame rules of the call records (madtrace/trace/replay.c), through ctypes.

``ThreadReplay`` replays one thread: call records and data accesses go in (in
chunks, in any sizes), an ordered stream of events (``EVENT_DTYPE``: BEGIN,
END, ACCESS) and one segment row per ended call (``SEGMENT_DTYPE``) come out.
The rules themselves are described in replay.c and in calltree.py's
docstring; this module only moves arrays.  Use
:mod:`madtrace.trace.segmentation`, which drives it over a trace directory.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..errors import TracerInternalError
from ..native import load
from .reused_arrays import ReusedArrays

EVENT_BEGIN, EVENT_END, EVENT_ACCESS = 0, 1, 2
FATE_COMPLETED, FATE_UNWOUND, FATE_OPEN, FATE_UNMATCHED = 0, 1, 2, 3
FATES = ("completed", "unwound", "open", "unmatched")
KIND_CALL, KIND_ENTRY, KIND_TAIL_ENCLOSED, KIND_TAIL_FREE, KIND_ROOT = range(5)
NO_EXIT = -1

EVENT_DTYPE = np.dtype([("call_id", "<i8"), ("ref", "<i8"), ("tsc", "<u8"), ("fid", "<i4"),
                        ("depth", "<i4"), ("type", "u1"), ("fate", "u1"), ("pad", "u1", 6)])
SEGMENT_DTYPE = np.dtype([("call_id", "<i8"), ("parent_id", "<i8"), ("begin_seq", "<i8"),
                          ("end_seq", "<i8"), ("begin_tsc", "<u8"), ("end_tsc", "<u8"),
                          ("accesses_self", "<i8"), ("accesses_incl", "<i8"),
                          ("bytes_self", "<i8"), ("bytes_incl", "<i8"),
                          ("accesses_before", "<i8"), ("fid", "<i4"),
                          ("depth", "<i4"), ("fate", "u1"), ("outer", "u1"), ("pad", "u1", 6)])
# the columns rp_segment_columns makes of segment rows, in its order
SEGMENT_COLUMNS = (("call_id", np.int64), ("parent_id", np.int64), ("begin_seq", np.int64),
                   ("end_seq", np.int64), ("begin_pos", np.int64), ("end_pos", np.int64),
                   ("begin_tsc", np.uint64), ("end_tsc", np.uint64),
                   ("accesses_self", np.int64), ("accesses_incl", np.int64),
                   ("bytes_self", np.int64), ("bytes_incl", np.int64), ("fid", np.int32),
                   ("depth", np.int32), ("fate", np.int32), ("outermost", np.bool_))
STAT_NAMES = ("records", "entries", "exits", "unmatched_exits", "unwound_frames", "depth",
              "first_tsc", "last_tsc", "next_call", "accesses", "bytes", "closed")


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtreplay.so", "the call replay")
    P, I64, I, SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "rp_event_size": (SZ, []), "rp_segment_size": (SZ, []),
        "rp_new": (P, [P, P, P, I64, I64, I64]), "rp_free": (None, [P]),
        "rp_stats": (None, [P, P]), "rp_depth": (I64, [P]),
        "rp_run": (I, [P, P, I64, P, I64, P, I64, I64, I, I, P, I64, P, I64, P]),
        "rp_finish": (I64, [P, P, I64, P, I64]),
        "rp_segment_columns": (None, [P, I64, P]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.rp_event_size() != EVENT_DTYPE.itemsize or \
            lib.rp_segment_size() != SEGMENT_DTYPE.itemsize:
        raise TracerInternalError("libmtreplay.so does not match EVENT_DTYPE/SEGMENT_DTYPE: "
                                  "rebuild it (make native)")
    return lib


class ThreadReplay:
    """One thread's replay state (C).  ``code_fid``/``code_exit``/``code_kind``
    describe the record codes (segmentation.CallTables); call ids start at
    ``first_call``."""

    def __init__(self, code_fid, code_exit, code_kind, n_fids: int, first_call: int,
                 chunk_events: int):
        self.lib = _library()
        self._tables = (np.ascontiguousarray(code_fid, dtype=np.int32),
                        np.ascontiguousarray(code_exit, dtype=np.int32),
                        np.ascontiguousarray(code_kind, dtype=np.uint8))
        fid, exit_, kind = self._tables
        self._ctx = self.lib.rp_new(fid.ctypes.data, exit_.ctypes.data, kind.ctypes.data,
                                    len(fid), n_fids, first_call)
        if not self._ctx:
            raise MemoryError("rp_new")
        self.chunk_events = max(int(chunk_events), 64)
        self._out = np.zeros(4, dtype=np.int64)
        self._stats = np.zeros(len(STAT_NAMES), dtype=np.int64)
        # each chunk's events and segments: memory reused once no reader holds them
        self._arrays = ReusedArrays()

    def close(self) -> None:
        if self._ctx:
            self.lib.rp_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()

    def _buffers(self) -> tuple[np.ndarray, np.ndarray]:
        cap = max(self.chunk_events, int(self.lib.rp_depth(self._ctx)) + 16)
        return self._arrays.empty(cap, EVENT_DTYPE), self._arrays.empty(cap, SEGMENT_DTYPE)

    def run(self, records: np.ndarray, seq: np.ndarray, size: np.ndarray, records_final: bool,
            accesses_final: bool) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Replay as much of ``records`` and of the accesses (``seq``, ``size``)
        as their order allows.  Returns (records used, accesses used, events,
        segments)."""
        records = np.ascontiguousarray(records)
        # the accesses' seq and size as they are (fields of the access rows: no copy)
        if seq.dtype != np.uint64 or seq.ndim != 1:
            seq = np.ascontiguousarray(seq, dtype=np.uint64)
        if size.dtype != np.uint16 or size.ndim != 1:
            size = np.ascontiguousarray(size, dtype=np.uint16)
        events, segments = self._buffers()
        rc = self.lib.rp_run(self._ctx, records.ctypes.data, len(records), seq.ctypes.data,
                             seq.strides[0] if len(seq) else 8, size.ctypes.data,
                             size.strides[0] if len(size) else 2, len(seq), int(records_final),
                             int(accesses_final), events.ctypes.data, len(events),
                             segments.ctypes.data, len(segments), self._out.ctypes.data)
        if rc:
            raise MemoryError("rp_run: the call stack could not grow")
        used_records, used_accesses, n_events, n_segments = self._out.tolist()
        return used_records, used_accesses, events[:n_events], segments[:n_segments]

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """The thread is over: END events (and segments) of the calls still open."""
        events, segments = self._buffers()
        n = self.lib.rp_finish(self._ctx, events.ctypes.data, len(events),
                               segments.ctypes.data, len(segments))
        if n < 0:
            raise TracerInternalError("rp_finish: output too small")
        return events[:n], segments[:n]

    def stats(self) -> dict[str, int]:
        self.lib.rp_stats(self._ctx, self._stats.ctypes.data)
        return dict(zip(STAT_NAMES, self._stats.tolist()))


def segment_columns(segments: np.ndarray) -> dict[str, np.ndarray]:
    """SEGMENT_COLUMNS of SEGMENT_DTYPE rows, one contiguous array each, made in
    one pass (rp_segment_columns)."""
    segments = np.ascontiguousarray(segments, dtype=SEGMENT_DTYPE)
    n = len(segments)
    columns = {name: np.empty(n, dtype=dtype) for name, dtype in SEGMENT_COLUMNS}
    pointers = (ctypes.c_void_p * len(columns))(*(a.ctypes.data for a in columns.values()))
    if n:
        _library().rp_segment_columns(segments.ctypes.data, n, pointers)
    return columns
