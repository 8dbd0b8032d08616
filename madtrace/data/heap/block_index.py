# SPDX-License-Identifier: GPL-2.0-or-later
"""The allocation tracker's interval index (block_index.c through ctypes):
[start, end) -> block id, updated in place at every allocation event; a
batch of addresses is named in C.  Costs per event and per address are
O(log blocks): nothing is rebuilt when a block comes or goes."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ...errors import TracerInternalError
from ...native import load


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtblocks.so", "the allocation tracker's block index")
    P, U64, SZ, U32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint32
    sigs = {
        "bi_new": (P, []), "bi_free": (None, [P]), "bi_count": (SZ, [P]),
        "bi_entry_size": (SZ, []),
        "bi_insert": (ctypes.c_int, [P, U64, U64, U32, ctypes.POINTER(U32)]),
        "bi_remove": (U32, [P, U64, ctypes.POINTER(U64)]),
        "bi_lookup": (SZ, [P, P, SZ, P, P, ctypes.c_uint8]),
        "bi_lookup_cached": (SZ, [P, P, SZ, P, P, ctypes.c_uint8]),
        "bi_range": (SZ, [P, U64, U64, P, P, P, SZ]),
        "bi_block_added": (ctypes.c_int, [P, P, U64, U64, U32, ctypes.POINTER(U32)]),
        "bi_block_released": (U32, [P, P, U64, ctypes.POINTER(U64)]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.bi_entry_size() != 24:
        raise TracerInternalError("libmtblocks.so is out of date: run `make native`")
    return lib


class BlockIndex:
    """Non-overlapping or nested [start, end) intervals keyed by start."""

    def __init__(self):
        self._lib = _library()
        self._bi = self._lib.bi_new()
        if not self._bi:
            raise MemoryError("block index")
        self._old = ctypes.c_uint32()
        self._end = ctypes.c_uint64()
        self._old_ref, self._end_ref = ctypes.byref(self._old), ctypes.byref(self._end)
        # one address and its id, for ``find`` (called per block event: no arrays made)
        self._one_address, self._one_id = ctypes.c_uint64(), ctypes.c_uint32()
        self._one_address_ref, self._one_id_ref = ctypes.byref(self._one_address), \
            ctypes.byref(self._one_id)

    def __del__(self):
        bi, self._bi = getattr(self, "_bi", None), None
        if bi:
            self._lib.bi_free(bi)

    def __len__(self) -> int:
        return self._lib.bi_count(self._bi)

    def insert(self, start: int, end: int, block_id: int) -> int:
        """Adds the interval; returns the id it replaced at the same start (0: none)."""
        if self._lib.bi_insert(self._bi, start, end, block_id, ctypes.byref(self._old)):
            raise MemoryError("block index")
        return self._old.value

    def remove(self, start: int) -> tuple[int, int]:
        """Removes the interval starting at ``start``: (its id, its end); (0, 0) if none."""
        block_id = self._lib.bi_remove(self._bi, start, ctypes.byref(self._end))
        return (block_id, self._end.value) if block_id else (0, 0)

    def find(self, address: int) -> int:
        """The id of the interval holding ``address`` (0: none)."""
        self._one_address.value, self._one_id.value = address, 0
        self._lib.bi_lookup(self._bi, self._one_address_ref, 1, self._one_id_ref, None, 0)
        return self._one_id.value

    def fill(self, addresses: np.ndarray, ids: np.ndarray, flags: np.ndarray, flag: int,
             cached: bool = False) -> None:
        """For each address whose ``ids`` entry is still 0: the id of the interval
        holding it, and ``flags`` = ``flag`` (in place).  ``cached``: through the
        index's cache of answers (one thread only: the hybrid engine's drain)."""
        addresses = np.ascontiguousarray(addresses, dtype=np.uint64)
        assert ids.dtype == np.uint32 and flags.dtype == np.uint8 and ids.flags.c_contiguous
        lookup = self._lib.bi_lookup_cached if cached else self._lib.bi_lookup
        lookup(self._bi, addresses.ctypes.data, len(addresses), ids.ctypes.data, flags.ctypes.data,
               flag)

    @property
    def handle(self) -> int:
        """The index itself, for C code that looks up through ``lookup_function``."""
        return self._bi

    @staticmethod
    def lookup_function() -> int:
        """The address of bi_lookup_cached (``fill`` with the cache), for C callers."""
        return ctypes.cast(_library().bi_lookup_cached, ctypes.c_void_p).value or 0

    def block_added(self, freed: "BlockIndex", start: int, end: int, block_id: int) -> int:
        """``insert`` here and ``remove(start)`` from ``freed`` (the address is reused),
        in one call; returns the id it replaced at the same start (0: none)."""
        if self._lib.bi_block_added(self._bi, freed.handle, start, end, block_id, self._old_ref):
            raise MemoryError("block index")
        return self._old.value

    def block_released(self, freed: "BlockIndex", start: int) -> tuple[int, int]:
        """``remove(start)`` here and, if it was there, ``insert`` it into ``freed``, in
        one call: (its id, its end); (0, 0) if none."""
        block_id = self._lib.bi_block_released(self._bi, freed.handle, start, self._end_ref)
        return (block_id, self._end.value) if block_id else (0, 0)

    def in_range(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """(start, end, id) of the intervals starting in [lo, hi), by start."""
        n = self._lib.bi_range(self._bi, lo, hi, None, None, None, 0)
        if not n:
            return []
        starts, ends = np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=np.uint64)
        ids = np.zeros(n, dtype=np.uint32)
        self._lib.bi_range(self._bi, lo, hi, starts.ctypes.data, ends.ctypes.data,
                           ids.ctypes.data, n)
        return list(zip(starts.tolist(), ends.tolist(), ids.tolist()))
