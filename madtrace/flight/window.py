# SPDX-License-Identifier: GPL-2.0-or-later
"""The window of one growing capture file of a flight recording.

A capture file (trace/capture_file.py) is a header and then chunks, each
complete in itself.  ``StreamWindow`` follows one file as the writers append
to it: ``scan(tick)`` indexes the chunks completed since the last scan from
their headers alone (the bytes before are never read again), each with the
tick that first saw it; ``drop_through(tick)`` forgets the chunks seen at or
before ``tick`` and gives their memory back (``fallocate`` punches a hole: the
file keeps its size and its offsets, so the writers append on undisturbed;
tmpfs and ext4 both free the pages); ``chunks(end)`` gives the chunks kept, up
to a scan's end, for a snapshot.

The file's first page (its header) is never punched.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import mmap
import os
import struct

from ..errors import CorruptTraceError
from ..trace.capture_file import CHUNK_HEADER_SIZE, HEADER_SIZE
from ..trace.format import CHUNK_MAGIC, CHUNK_MAX_BYTES

_CHUNK = struct.Struct("<IIQ")  # trace/format.py CHUNK_HEADER
PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_libc.fallocate.restype = ctypes.c_int


def punch(fd: int, start: int, end: int) -> None:
    """The whole pages of [start, end) given back (their bytes read as zeros)."""
    first = -(-start // PAGE) * PAGE
    last = end // PAGE * PAGE
    if last > first and _libc.fallocate(fd, PUNCH_HOLE, first, last - first) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot free the start of a flight recording file: {os.strerror(err)}")


class StreamWindow:
    """See the module docstring.  ``record_size``: the file's fixed record size
    (0: its chunks are blocks of their own, as data/<tid>.dat's), to count the
    records dropped (a thread's call records dropped shift its accesses' seqs)."""

    def __init__(self, path: str, record_size: int):
        self.path = path
        self.record_size = record_size
        self.end = HEADER_SIZE  # the offset after the last chunk indexed
        self.start = HEADER_SIZE  # of the first chunk kept
        # (offset, payload length, tick first seen) of the chunks kept, oldest first
        self.kept: collections.deque = collections.deque()
        self.kept_bytes = 0  # their bytes, headers included
        self.dropped_records = 0  # records of the chunks dropped (record_size > 0)
        self.dropped_bytes = 0
        self._fd = -1
        self._punched = HEADER_SIZE  # everything before this is given back already

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def scan(self, tick: int) -> int:
        """Index the chunks completed since the last scan; returns their bytes."""
        try:
            fd = self._open()
            size = os.fstat(fd).st_size
        except FileNotFoundError:
            return 0
        added = 0
        while self.end + CHUNK_HEADER_SIZE <= size:
            head = os.pread(fd, CHUNK_HEADER_SIZE, self.end)
            magic, length, _check = _CHUNK.unpack(head)
            if magic != CHUNK_MAGIC or length > CHUNK_MAX_BYTES:
                raise CorruptTraceError(f"{self.path}: no chunk header at offset {self.end}")
            total = CHUNK_HEADER_SIZE + length
            if self.end + total > size:
                break  # being written: the next scan takes it
            self.kept.append((self.end, length, tick))
            self.end += total
            added += total
        self.kept_bytes += added
        return added

    def oldest_tick(self) -> int | None:
        return self.kept[0][2] if self.kept else None

    def drop_through(self, tick: int, most: int | None = None) -> int:
        """Forget the chunks first seen at or before ``tick`` (``most`` of them at
        most); returns their bytes."""
        freed = dropped = 0
        while self.kept and self.kept[0][2] <= tick and (most is None or dropped < most):
            dropped += 1
            offset, length, _ = self.kept.popleft()
            freed += CHUNK_HEADER_SIZE + length
            if self.record_size:
                self.dropped_records += length // self.record_size
        if freed:
            self.kept_bytes -= freed
            self.dropped_bytes += freed
            self.start = self.kept[0][0] if self.kept else self.end
            punch(self._open(), self._punched, self.start)
            self._punched = max(self._punched, self.start // PAGE * PAGE)
        return freed

    def chunks(self, end: int | None = None) -> list[tuple[int, int]]:
        """(offset, payload length) of the chunks kept that end at or before ``end``
        (None: every chunk kept)."""
        return [
            (offset, length)
            for offset, length, _ in self.kept
            if end is None or offset + CHUNK_HEADER_SIZE + length <= end
        ]

    def header(self) -> bytes:
        return os.pread(self._open(), HEADER_SIZE, 0)

    def payload(self, offset: int, length: int) -> bytes:
        data = os.pread(self._open(), length, offset + CHUNK_HEADER_SIZE)
        if len(data) != length:
            raise CorruptTraceError(f"{self.path}: a chunk at offset {offset} is cut short")
        return data
