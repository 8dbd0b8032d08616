# SPDX-License-Identifier: GPL-2.0-or-later
"""Arrays whose memory is used again once nothing refers to them any more.

A reader of a trace's accesses decodes them a chunk at a time into arrays of
48-byte rows, some 30 MB per chunk, on its read-ahead thread, and the chunk is
dropped by whoever used it last.  Freed, that memory went back to the kernel,
and the next chunk's array came as new pages that the kernel zeroed first: a
tenth of the store's build of a trace with calls.  ``ReusedArrays.empty`` gives
arrays whose memory returns to a free list when the last array or view on it is
gone (a ctypes object holds the lease; its finalizer runs when numpy drops it, on
whichever thread drops it last), so a reader that keeps a chunk keeps it safely:
its memory is reused only after.
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np


class ReusedArrays:
    """A free list of at most ``keep`` blocks of memory, each a power of two bytes
    long (so that a chunk a little larger than the last still finds one; the pages
    of a block's tail that no chunk reaches are never touched); the smallest block
    that holds a request serves it."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def empty(self, n: int, dtype) -> np.ndarray:
        """An uninitialized array of ``n`` items of ``dtype``."""
        dtype = np.dtype(dtype)
        size = max(n * dtype.itemsize, 1)
        memory = None
        with self._lock:
            fits = [i for i, block in enumerate(self._free) if len(block) >= size]
            if fits:
                memory = self._free.pop(min(fits, key=lambda i: len(self._free[i])))
        if memory is None:
            memory = np.empty(1 << (size - 1).bit_length(), dtype=np.uint8)
        lease = (ctypes.c_uint8 * size).from_buffer(memory)
        weakref.finalize(lease, self._give_back, memory)
        return np.frombuffer(lease, dtype=dtype, count=n)

    def _give_back(self, memory: np.ndarray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(memory)
