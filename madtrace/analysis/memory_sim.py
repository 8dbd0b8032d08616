# SPDX-License-Identifier: GPL-2.0-or-later
"""The memory analyses' inner loops (memory_sim.c), through ctypes: a cache
hierarchy (:class:`CacheHierarchy`), the coherence traffic of lines shared by
threads (:class:`LineSharing`) and exact reuse distances
(:class:`ReuseDistances`).  This module only moves arrays; the rules are in
the C file."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..native import load

P, I64, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
LEVEL_STATS = (
    "loads",
    "stores",
    "writebacks_in",
    "load_misses",
    "store_misses",
    "writeback_misses",
    "writebacks",
    "invalidations",
)


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtmemsim.so", "the memory analyses", "analysis-native")
    sigs = {
        "cs_new": (P, [I, I, I, P, P, I]),
        "cs_free": (None, [P]),
        "cs_run": (I, [P, P, I64, P, I64, P, I64, P, I, I64, P]),
        "cs_stats": (None, [P, P]),
        "sh_new": (P, [I]),
        "sh_free": (None, [P]),
        "sh_run": (I, [P, P, P, P, P, I64]),
        "sh_shared": (I64, [P, P, P]),
        "ru_new": (P, [I]),
        "ru_free": (None, [P]),
        "ru_run": (I, [P, P, I64, P, I64, I64, P, P]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _arrays(addr, size, kind=None):
    out = [np.ascontiguousarray(addr, dtype=np.uint64), np.ascontiguousarray(size, dtype=np.uint16)]
    if kind is not None:
        out.append(np.ascontiguousarray(kind, dtype=np.uint8))
    return out


def _strided(column, dtype) -> tuple[np.ndarray, list]:
    """A column as the C side reads it: (the array to keep alive, [its address,
    the bytes between its elements]); a column of the access rows as it is."""
    a = np.asarray(column)
    if a.dtype != dtype or a.ndim != 1 or (len(a) and a.strides[0] <= 0):
        a = np.ascontiguousarray(a, dtype=dtype)
    return a, [a.ctypes.data, a.strides[0] if len(a) > 1 else a.itemsize]


class _Native:
    _free = ""
    _ctx = None

    def __init__(self, ctx):
        if not ctx:
            raise MemoryError(type(self).__name__)
        self._ctx = ctx

    def close(self) -> None:
        if self._ctx:
            getattr(_library(), self._free)(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()


class CacheHierarchy(_Native):
    """``levels``: (size, ways) of each level, first level first, all of lines
    of ``line`` bytes; the first ``private`` levels are each thread's own, the
    others shared by all threads; ``coherent``: a store takes the line out of
    the other threads' private levels (a modified copy written to the first
    shared level)."""

    _free = "cs_free"

    def __init__(self, levels: list[tuple[int, int]], line: int, private: int, coherent: bool = False):
        self.levels = len(levels)
        sizes = np.array([s for s, _ in levels], dtype=np.uint64)
        ways = np.array([w for _, w in levels], dtype=np.uint64)
        super().__init__(
            _library().cs_new(
                len(levels),
                private,
                line.bit_length() - 1,
                sizes.ctypes.data,
                ways.ctypes.data,
                int(coherent),
            )
        )

    def run(self, addr, size, kind, thread) -> np.ndarray:
        """The demand misses of each access (uint8: two bits per level, level 0
        lowest); ``thread``: the thread index of every access, or one int.  The
        columns may be views of the access rows."""
        a, a_at = _strided(addr, np.uint64)
        s, s_at = _strided(size, np.uint16)
        k, k_at = _strided(kind, np.uint8)
        out = np.empty(len(a), dtype=np.uint8)
        if isinstance(thread, (int, np.integer)):
            threads, one = None, int(thread)
        else:
            threads, one = np.ascontiguousarray(thread, dtype=np.int32), 0
            one = int(threads.max()) if len(threads) else 0
        if _library().cs_run(
            self._ctx,
            *a_at,
            *s_at,
            *k_at,
            None if threads is None else threads.ctypes.data,
            one,
            len(a),
            out.ctypes.data,
        ):
            raise MemoryError("cs_run")
        return out

    def stats(self) -> list[dict[str, int]]:
        """Per level (the private ones summed over threads): LEVEL_STATS."""
        out = np.zeros((self.levels, len(LEVEL_STATS)), dtype=np.int64)
        _library().cs_stats(self._ctx, out.ctypes.data)
        return [dict(zip(LEVEL_STATS, row)) for row in out.tolist()]


class LineSharing(_Native):
    """Per cache line of ``line`` bytes: the threads that touched it and the
    transfers a coherent cache would make between them."""

    _free = "sh_free"

    def __init__(self, line: int):
        super().__init__(_library().sh_new(line.bit_length() - 1))

    def run(self, addr, size, kind, thread) -> None:
        """``thread``: the thread index of every access, or one int."""
        a, s, k = _arrays(addr, size, kind)
        t = np.ascontiguousarray(np.broadcast_to(np.asarray(thread, dtype=np.int32), len(a)))
        if _library().sh_run(self._ctx, a.ctypes.data, s.ctypes.data, k.ctypes.data, t.ctypes.data, len(a)):
            raise MemoryError("sh_run")

    def shared(self) -> tuple[np.ndarray, np.ndarray]:
        """(line numbers, transfers) of the lines touched by more than one thread
        with at least one store, sorted by line."""
        lib = _library()
        n = lib.sh_shared(self._ctx, None, None)
        lines = np.empty(n, dtype=np.uint64)
        transfers = np.empty(n, dtype=np.int64)
        if n:
            lib.sh_shared(self._ctx, lines.ctypes.data, transfers.ctypes.data)
        order = np.argsort(lines)
        return lines[order], transfers[order]


class ReuseDistances(_Native):
    """Exact reuse distances of one thread's stream of cache lines."""

    _free = "ru_free"

    def __init__(self, line: int):
        super().__init__(_library().ru_new(line.bit_length() - 1))

    def run(self, addr, size) -> tuple[np.ndarray, np.ndarray]:
        """(first, second): the distance of each access's first line (-1: never
        used before) and of its second line when it spans two (else -2).  The
        columns may be views of the access rows."""
        a, a_at = _strided(addr, np.uint64)
        s, s_at = _strided(size, np.uint16)
        first = np.empty(len(a), dtype=np.int64)
        second = np.empty(len(a), dtype=np.int64)
        if _library().ru_run(self._ctx, *a_at, *s_at, len(a), first.ctypes.data, second.ctypes.data):
            raise MemoryError("ru_run")
        return first, second
