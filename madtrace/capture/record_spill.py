# SPDX-License-Identifier: GPL-2.0-or-later
"""The call records between the rings and ``calls/<tid>.rec``.

The drain thread (capture/rings.py) takes the records out of a ring by copying
them here (mt_drain_ring_take: TAIL and LIMIT are published at once); this
module's own thread writes them to their files, in order (mt_write_chunks),
and creates and closes the files.  The drain thread then never waits for the
disk: a file system that stalls for a second (ext4's journal under load:
creating a file, or writing one, took 0.66 s beside the test suite) would
keep a busy writer's ring full all that time, and its writer, whose wait is
bounded, dropped what followed (the file system frozen for 1.5 s during
test_live_threads' burst: 131072 calls counted of 3 M, the rest dropped, as
in its failures in loaded suite runs).  Up to LIMIT bytes wait here; beyond, the drain
takes nothing more until the disk catches up (the writers wait, and drop as
before, counted).

A write error is kept (``error``) and said by the drain thread, which stops
recording; what was queued after it is let go.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading

import numpy as np

from ..errors import OutputError, TracerInternalError
from ..trace.format import CALL_RECORDS

LIMIT = 512 << 20          # bytes of buffers waiting for the disk, at most (plus one)
SMALL = 64 << 10           # the smallest buffer kept; below, a take's buffer is its own
KEEP = 32 << 20            # bytes of written buffers kept for the next takes


def declare(lib) -> None:
    """The ctypes signatures of the C functions used here and by the drain."""
    U64 = ctypes.c_uint64
    lib.mt_drain_ring_take.restype = lib.mt_write_chunks.restype = ctypes.c_int
    lib.mt_drain_ring_take.argtypes = [ctypes.c_void_p, ctypes.c_void_p, U64, ctypes.c_void_p, U64,
                                       U64, ctypes.c_int, ctypes.POINTER(U64), U64]
    lib.mt_write_chunks.argtypes = [ctypes.c_int, ctypes.c_void_p, U64, ctypes.POINTER(U64)]


def create_file(path: str) -> int:
    """calls/<tid>.rec opened for appending chunks, its header written if it is new."""
    try:
        return CALL_RECORDS.create(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None


class RecordSpill:
    def __init__(self, lib, buffer_size: int, limit: int = LIMIT):
        """``buffer_size``: the bytes of one ring's records (the most a drain takes)."""
        self._lib = lib
        self.limit = limit
        self.buffer_size = buffer_size
        self._free: dict[int, list[np.ndarray]] = {}   # size -> written buffers, for the next takes
        self._kept = 0                       # bytes in self._free
        self.pending = 0                     # bytes of the buffers queued, not yet written
        self.error: OutputError | TracerInternalError | None = None
        # (path, (buffer, bytes of records in it)), or (path, None): close it
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._busy = False                   # the thread is writing an item it took
        self._fds: dict[str, int] = {}       # path -> descriptor (this module's thread only)
        self._thread: threading.Thread | None = None
        self._closing = False
        self._written = ctypes.c_uint64()

    def room(self, record_size: int) -> int:
        """Records the drain may take now (the bound counts the buffers' bytes)."""
        return max(0, min(self.limit - self.pending, self.buffer_size)) // record_size

    def buffer(self, size: int) -> np.ndarray:
        """Room for ``size`` bytes of records (at most ``buffer_size``): a buffer of the
        next power of two, one written before if there is one, whose pages are
        allocated already.  A new buffer's are not: the kernel zeroes each page its
        first write touches (a third of the drain's CPU on a first pass of 64 MB of
        records, when only the ring's size was kept)."""
        if size < SMALL:
            return np.empty(size, dtype=np.uint8)
        size = min(1 << (size - 1).bit_length(), self.buffer_size)
        with self._cv:
            free = self._free.get(size)
            if free:
                self._kept -= size
                return free.pop()
        return np.empty(size, dtype=np.uint8)

    def put(self, path: str, buffer: np.ndarray, size: int) -> None:
        """The first ``size`` bytes of ``buffer`` (records taken from a ring; the buffer
        is this module's from now on) to be appended to ``path``."""
        with self._cv:
            self.pending += len(buffer)
            self._queue.append((path, (buffer, size)))
            self._start()
            self._cv.notify()

    def close_file(self, path: str) -> None:
        """``path`` is closed once what is queued for it is written (its thread is gone)."""
        with self._cv:
            if self._thread is None:
                return
            self._queue.append((path, None))
            self._cv.notify()

    def flush(self) -> None:
        """Returns once everything queued is written (or let go after an error)."""
        with self._cv:
            while self._queue or self._busy:
                self._cv.wait()

    def stop(self) -> None:
        """Everything queued written, the thread ended, the files closed."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="madtrace-records",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                path, records = self._queue.popleft()
                self._busy = True
            try:
                if self.error is None:
                    self._write(path, records)
            except OutputError as exc:
                self.error = exc
            except OSError as exc:
                self.error = OutputError(f"cannot write {path}: {exc.strerror}")
            except Exception as exc:    # a bug: said, and nothing waits for this thread
                self.error = TracerInternalError(f"the record writer failed: {exc!r}")
            finally:
                with self._cv:
                    self._busy = False
                    if records is not None:
                        size = len(records[0])
                        self.pending -= size
                        if size >= SMALL and self._kept + size <= KEEP:
                            self._free.setdefault(size, []).append(records[0])
                            self._kept += size
                    self._cv.notify_all()

    def _write(self, path: str, records: tuple[np.ndarray, int] | None) -> None:
        if records is None:
            fd = self._fds.pop(path, None)
            if fd is not None:
                os.close(fd)
            return
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = create_file(path)
        err = self._lib.mt_write_chunks(fd, records[0].ctypes.data, records[1], self._written)
        if err:
            raise OutputError(f"cannot write {path}: {os.strerror(-err)}")
