# SPDX-License-Identifier: GPL-2.0-or-later
"""The call records' way from the rings to ``calls/<tid>.rec``: a drain
thread and a writer thread in C (rings/drain_thread.c), which never wait
for Python's GIL.  This module is their one door: RingSet (rings/rings.py)
tells it which ring goes to which file, with which LIMIT, and takes a ring
itself where the C thread must not (a ring whose owner changed: ring_pool.py).

The writer opens a file at its first records (a thread that wrote none has
none) and closes it after the last one queued for it.  Up to LIMIT bytes of
records wait for the disk; beyond, nothing more is taken until it catches up
(the writers in the target wait, then drop, counted).  A file system that
stalls for a second (ext4's journal under load) then costs no record: the
drain never waits for the disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

import numpy as np

from ..errors import OutputError, TracerInternalError

LIMIT = 512 << 20          # bytes of buffers waiting for the disk, at most (plus one)
KEEP = 64 << 20            # bytes of written buffers kept for the next takes
INTERVAL_NS = 200_000      # the C thread drains every 0.2 ms while records come,
IDLE_MAX_NS = 4_000_000    # backing off to 4 ms while none do (again at once: a ring fills)


def declare(lib) -> None:
    """The ctypes signatures of drain_thread.c."""
    P, U64, I = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int
    sigs = {
        "mt_drainer_new": (P, [P, U64, U64]),
        "mt_drainer_lock": (None, [P]), "mt_drainer_unlock": (None, [P]),
        "mt_drainer_set_counts": (None, [P, P, U64, U64]),
        "mt_drainer_set_ring": (None, [P, I, P, P, I]),
        "mt_drainer_set_limit": (None, [P, I, P, I]),
        "mt_drainer_take": (I, [P, I, U64, ctypes.POINTER(U64)]),
        "mt_drainer_pass": (ctypes.c_int64, [P, ctypes.POINTER(I)]),
        "mt_drainer_collect": (None, [P, P, P]),
        "mt_drainer_set_active": (None, [P, I]), "mt_drainer_active": (I, [P]),
        "mt_drainer_start": (I, [P, U64, U64]), "mt_drainer_stop": (None, [P]),
        "mt_drainer_failed": (I, [P, ctypes.POINTER(I)]),
        "mt_drainer_file": (P, [P, ctypes.c_char_p]), "mt_drainer_close_file": (I, [P, P]),
        "mt_drainer_flush": (None, [P]), "mt_drainer_pending": (U64, [P]),
        "mt_drainer_error": (I, [P, ctypes.c_char_p, U64]),
        "mt_drainer_free": (None, [P]),
    }
    for name, (restype, argtypes) in sigs.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes


class NativeDrain:
    def __init__(self, lib, nowait_address: int, rings: int, limit: int = LIMIT,
                 keep: int = KEEP):
        """``nowait_address``: the tracer's address of the control block's NOWAIT
        byte (cleared by each pass); ``rings``: entries of the table (MT_SLOTS)."""
        self._lib = lib
        self._d = lib.mt_drainer_new(nowait_address, limit, keep)
        if not self._d:
            raise TracerInternalError("cannot start the record writer (no memory, or threads)")
        self._files: dict[str, int] = {}       # path -> the C side's file
        self._moved = ctypes.c_uint64()
        self._index = ctypes.c_int()
        self._collected = (np.zeros(rings, dtype=np.uint64), np.zeros(rings, dtype=np.uint64))
        self.running = False
        self._last_error: OutputError | None = None    # the writer's, once it is gone

    # ------------------------------------------------------------ the table
    @contextlib.contextmanager
    def held(self):
        """No take (the C thread's or another's) while the block runs."""
        self._lib.mt_drainer_lock(self._d)
        try:
            yield
        finally:
            self._lib.mt_drainer_unlock(self._d)

    def set_counts(self, counts: np.ndarray, first: int) -> None:
        """The drain counts codes from ``first`` on in ``counts`` (kept alive by the caller)."""
        if self._d is None:
            return
        self._lib.mt_drainer_set_counts(self._d, counts.ctypes.data, first, first + len(counts) - 1)

    def set_ring(self, index: int, ring_local: int, path: str, recording: bool) -> None:
        """Ring ``index`` (the tracer's address of its block) goes to ``path``."""
        if self._d is None:
            return
        self._lib.mt_drainer_set_ring(self._d, index, ring_local, self._file(path), int(recording))

    def clear_ring(self, index: int) -> None:
        if self._d is None:
            return
        self._lib.mt_drainer_set_ring(self._d, index, None, None, 0)

    def set_limit(self, index: int, ring_local: int, recording: bool) -> None:
        """LIMIT of ring ``index``: TAIL + its size while recording, else 0."""
        if self._d is None:
            return
        self._lib.mt_drainer_set_limit(self._d, index, ring_local, int(recording))

    def _file(self, path: str) -> int:
        handle = self._files.get(path)
        if handle is None:
            handle = self._lib.mt_drainer_file(self._d, os.fsencode(path))
            if not handle:
                raise TracerInternalError("no memory for a record file")
            self._files[path] = handle
        return handle

    def close_file(self, path: str) -> None:
        """``path`` is closed once what is queued for it is written (no ring goes there)."""
        if self._d is None:
            return
        handle = self._files.pop(path, None)
        if handle is not None and self._lib.mt_drainer_close_file(self._d, handle):
            raise TracerInternalError("no memory to close a record file")

    # ------------------------------------------------------------- takes
    def take(self, index: int, upto: int) -> int:
        """Ring ``index``'s records below record number ``upto``, now."""
        self._check(self._lib.mt_drainer_take(self._d, index, upto, self._moved), index)
        return self._moved.value

    def pass_now(self) -> int:
        """Every ring whose owner did not change, now, in this thread."""
        moved = self._lib.mt_drainer_pass(self._d, self._index)
        if moved < 0:
            self._check(moved, self._index.value)
        return moved

    def _check(self, err: int, index: int) -> None:
        if err == -errno.EPROTO:
            raise TracerInternalError(f"ring {index}: head more than one ring ahead of tail")
        if err:
            raise TracerInternalError(f"the record drain failed: {os.strerror(-err)}")

    def collect(self) -> tuple[np.ndarray, np.ndarray]:
        """Per ring: records moved, and the most that waited at a take, since the last call."""
        moved, peak = self._collected
        self._lib.mt_drainer_collect(self._d, moved.ctypes.data, peak.ctypes.data)
        return moved, peak

    # --------------------------------------------------------- the thread
    def start(self) -> None:
        if self.running or self._d is None:
            return
        err = self._lib.mt_drainer_start(self._d, INTERVAL_NS, IDLE_MAX_NS)
        if err:
            raise TracerInternalError(f"cannot start the drain thread: {os.strerror(-err)}")
        self.running = True
        self.set_active(True)

    def set_active(self, active: bool) -> None:
        """The C thread takes records, or leaves every ring alone (returns after its pass)."""
        if self._d is not None:
            self._lib.mt_drainer_set_active(self._d, int(active))

    @property
    def active(self) -> bool:
        return self.running and self._d is not None and bool(self._lib.mt_drainer_active(self._d))

    def stop(self) -> None:
        """The C thread ends (the writer goes on)."""
        if self._d is None:
            return
        self._lib.mt_drainer_stop(self._d)
        self.running = False

    def failure(self) -> TracerInternalError | None:
        """Why the C thread stopped taking, if a pass failed."""
        if self._d is None:
            return None
        err = self._lib.mt_drainer_failed(self._d, self._index)
        if not err:
            return None
        try:
            self._check(err, self._index.value)
        except TracerInternalError as exc:
            return exc
        return None

    # -------------------------------------------------------- the writer
    @property
    def pending(self) -> int:
        """Bytes of buffers waiting for the disk."""
        return self._lib.mt_drainer_pending(self._d)

    def flush(self) -> None:
        """Returns once everything queued is written (or let go after an error)."""
        if self._d is not None:
            self._lib.mt_drainer_flush(self._d)

    @property
    def error(self) -> OutputError | None:
        if self._d is None:
            return self._last_error
        path = ctypes.create_string_buffer(4096)
        err = self._lib.mt_drainer_error(self._d, path, len(path))
        if not err:
            return None
        return OutputError(f"cannot write {os.fsdecode(path.value)}: {os.strerror(-err)}")

    def close(self) -> None:
        """Both threads ended, everything written, every file closed."""
        if self._d is None:
            return
        self.stop()
        for path in list(self._files):
            self.close_file(path)
        self.flush()
        self._last_error = self.error
        self._lib.mt_drainer_free(self._d)
        self._d = None
        self.running = False
