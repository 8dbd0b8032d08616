# SPDX-License-Identifier: GPL-2.0-or-later
"""The drain's compressed blocks of access records (data/<tid>.dat), made and
appended in a thread of their own.

The hybrid engine's drain names every access and the program waits for it at
its system calls (an event's order comes after every access before it): zstd
took about 15% of the drain thread's time.  ``BlockWriter`` takes each block
as byte planes (records.py makes them in C), compresses it and appends it to
its file in another thread, in the order the blocks were handed over.  At
most ``DEPTH`` blocks wait; the drain waits when they do (memory stays
bounded: DEPTH + 1 buffers of planes).  ``flush`` returns once every block
handed over is in its file; a write error is raised there, or at the next
``submit``, as the drain's own write raised it before.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from ..errors import writing
from ..trace.compact import encode_planes
from ..trace.record_files import COMPACT_RECORDS

DEPTH = 2                 # blocks waiting for the writer at most
IDLE = 2.0                # seconds without a block before the thread leaves


class BlockWriter:
    def __init__(self):
        self._work: queue.Queue = queue.Queue(maxsize=DEPTH)
        self._free: queue.Queue = queue.Queue()
        for _ in range(DEPTH + 1):
            self._free.put(np.empty(0, dtype=np.uint8))
        self.bytes = 0                     # bytes appended so far
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()      # starting the thread, and its leaving when idle

    def buffer(self, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` for the next block's planes (waits while every
        buffer is in use: the writer is behind)."""
        self._raise()
        buf = self._free.get()
        if len(buf) < nbytes:
            buf = np.empty(max(nbytes, 2 * len(buf)), dtype=np.uint8)
        return buf

    def submit(self, fd: int, path: str, count: int, planes: np.ndarray, buf: np.ndarray) -> None:
        """Compress ``planes`` of ``count`` records (in ``buf``, taken from
        ``buffer``) and append the block to ``fd`` (``path``: its name, for errors)."""
        self._work.put((fd, path, count, planes, buf))     # waits while DEPTH wait: not locked
        with self._lock:          # a thread that left when idle found no block after it
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="madtrace-blocks",
                                                daemon=True)
                self._thread.start()

    def flush(self) -> None:
        self._work.join()
        self._raise()

    def close(self) -> None:
        self._work.join()
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._work.put(None)
        if thread is not None:
            thread.join()
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _run(self) -> None:
        """Until ``close``, or IDLE seconds without a block (a detached session's
        writer does not stay; the next block starts another)."""
        while True:
            try:
                item = self._work.get(timeout=IDLE)
            except queue.Empty:
                with self._lock:
                    if self._work.empty():
                        self._thread = None
                        return
                continue
            if item is None:
                self._work.task_done()
                return
            fd, path, count, planes, buf = item
            try:
                if self.error is None:
                    block = encode_planes(planes, count)
                    with writing(path):
                        self.bytes += COMPACT_RECORDS.container().append_payload(fd, block)
            except BaseException as exc:     # said by the drain at its next call
                self.error = self.error or exc
            finally:
                self._free.put(buf)
                self._work.task_done()

