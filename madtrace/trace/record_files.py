# SPDX-License-Identifier: GPL-2.0-or-later
"""The per-thread record files of a trace directory, read and written through
one object per kind (``CALL_RECORDS``, ``ACCESS_RECORDS``...): ``files(directory)``
lists (tid, path), ``path(directory, tid)`` names one, ``rows(path)``,
``chunks(path, n)``, ``read(path, start, count)`` and ``map(path)`` read it,
``create(path)`` opens it for appending (header written) and ``append(fd, rows)``
frames rows into chunks.  Nobody else computes a record's offset or a file's row
count.  Their names and layouts are format.py's; the container capture_file.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .capture_file import CaptureFormat, rebatch
from .compact import BLOCK_HEADER, DATA_SUFFIX, compact_chunks
from .format import (ACCESS_DTYPE, ALLOCATOR_CALL_DTYPE, ALLOCATOR_CALLS_FILE, BLOCK_DTYPE,
                     BLOCK_EVENT_DTYPE, BLOCK_EVENTS_FILE,
                     BLOCKS_FILE, CALLS_DIR, CHUNK_HEADER, COMPACT_DTYPE, COMPACT_EXTENSION, DATA_DIR,
                     RECORD_DTYPE, STORE_FORMAT_VERSION, read_store_meta)


@dataclass(frozen=True)
class RecordFile:
    """One kind of per-thread record file: ``<folder>/<tid><extension>``, a
    capture container of ``dtype`` records (see the module docstring)."""

    folder: str
    extension: str
    dtype: np.dtype
    kind: str = "calls"

    def path(self, directory: str, tid: int) -> str:
        return os.path.join(directory, self.folder, f"{tid}{self.extension}")

    def files(self, directory: str) -> list[tuple[int, str]]:
        """(tid, path) of every file of this kind in a trace directory, by tid."""
        folder = os.path.join(directory, self.folder)
        if not os.path.isdir(folder):
            return []
        found = []
        for name in os.listdir(folder):
            stem, ext = os.path.splitext(name)
            if ext == self.extension and stem.isdigit():
                found.append((int(stem), os.path.join(folder, name)))
        return sorted(found)

    def container(self) -> CaptureFormat:
        return CaptureFormat(self.kind, self.dtype.itemsize)

    def create(self, path: str, truncate: bool = False) -> int:
        """A descriptor appending to ``path``, its header written if it is new."""
        return self.container().create(path, truncate)

    def append(self, fd: int, rows: np.ndarray) -> int:
        """Writes ``rows`` to a file opened by ``create``, framed; returns the bytes written."""
        return self.container().append(fd, np.ascontiguousarray(rows, dtype=self.dtype))

    def write(self, path: str, rows: np.ndarray) -> None:
        """A new file holding ``rows`` (tests, conversions)."""
        fd = self.create(path, truncate=True)
        try:
            self.append(fd, rows)
        finally:
            os.close(fd)

    def rows(self, path: str) -> int:
        """Records in the file's complete chunks (0 if it does not exist)."""
        if not os.path.exists(path):
            return 0
        return self.container().index(path).rows

    def total_rows(self, directory: str) -> int:
        return sum(self.rows(path) for _, path in self.files(directory))

    def chunks(self, path: str, chunk_rows: int) -> Iterator[np.ndarray]:
        """The records in order, ``chunk_rows`` at a time, each chunk checked
        (CorruptTraceError, exit 18, naming the file and offset)."""
        yield from rebatch(self.container().record_chunks(path, self.dtype, chunk_rows), chunk_rows)

    def read(self, path: str, start: int = 0, count: int = -1) -> np.ndarray:
        """Records ``start`` .. ``start + count`` (all of them from ``start``: -1)."""
        return self.container().read_rows(path, self.dtype, start, count)

    def map(self, path: str, rows: int | None = None) -> np.ndarray:
        """The file's first ``rows`` records (all of them: None), checked."""
        return self.read(path, 0, -1 if rows is None else rows)


class AccessRecordFile(RecordFile):
    """The access files: data/<tid>.acc (ACCESS_DTYPE rows, the fault engine's)
    and data/<tid>.dat (compact records, the hybrid engine's), read alike: a
    compact file's rows are decoded to ACCESS_DTYPE on the fly (trace/compact.py),
    so ``rows``, ``read`` and ``map`` decode it whole (``chunks`` in bounded memory)."""

    def files(self, directory: str) -> list[tuple[int, str]]:
        return sorted(super().files(directory) + COMPACT_RECORDS.files(directory))

    @staticmethod
    def is_compact(path: str) -> bool:
        return path.endswith(COMPACT_EXTENSION)

    def compact_path(self, directory: str, tid: int) -> str:
        return COMPACT_RECORDS.path(directory, tid)

    def thread_rows(self, directory: str, tid: int) -> int:
        """The access rows of one thread, whichever engine wrote them."""
        return sum(self.rows(path) for t, path in self.files(directory) if t == tid)

    def rows(self, path: str) -> int:
        if not self.is_compact(path):
            return super().rows(path)
        if not os.path.exists(path):
            return 0
        return sum(len(chunk) for chunk in self.chunks(path, 1 << 20))

    def chunks(self, path: str, chunk_rows: int) -> Iterator[np.ndarray]:
        if not self.is_compact(path):
            yield from super().chunks(path, chunk_rows)
            return
        yield from compact_chunks(path, chunk_rows)

    def read(self, path: str, start: int = 0, count: int = -1) -> np.ndarray:
        if not self.is_compact(path):
            return super().read(path, start, count)
        parts = list(self.chunks(path, 1 << 20))
        rows = np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)
        return rows[start:] if count < 0 else rows[start : start + count]


CALL_RECORDS = RecordFile(CALLS_DIR, ".rec", RECORD_DTYPE, "calls")
ACCESS_RECORDS = AccessRecordFile(DATA_DIR, ".acc", ACCESS_DTYPE, "accesses")
# the compact files as containers (their chunks are blocks: trace/compact.py)
COMPACT_RECORDS = RecordFile(DATA_DIR, COMPACT_EXTENSION, COMPACT_DTYPE, "compact")
RECORD_FILES = (CALL_RECORDS, ACCESS_RECORDS)
# data/allocator_calls.bin (one file, not per thread: read with the path ALLOCATOR_CALLS_FILE)
ALLOCATOR_CALL_RECORDS = RecordFile(DATA_DIR, ".bin", ALLOCATOR_CALL_DTYPE, "allocator calls")
# data/block_events.bin (one file: read with the path BLOCK_EVENTS_FILE)
BLOCK_EVENT_RECORDS = RecordFile(DATA_DIR, ".bin", BLOCK_EVENT_DTYPE, "block events")
# data/blocks.bin: rows written in place while recording (a flat file), sealed
# into the container when the recording ends (trace/blocks.py)
BLOCK_RECORDS = RecordFile(DATA_DIR, ".bin", BLOCK_DTYPE, "blocks")


# ------------------------------------------------- a thread's access files
def record_count(path: str) -> int:
    """Access records (compact) or rows (.acc) of a file, from its chunk and
    block headers: a cheap estimate of its rows (a read-modify-write record is two)."""
    if not path.endswith(DATA_SUFFIX):
        return ACCESS_RECORDS.rows(path)
    container = COMPACT_RECORDS.container()
    index = container.index(path)
    total = 0
    with open(path, "rb") as f:
        for offset in index.offsets:
            f.seek(offset + CHUNK_HEADER.itemsize)
            head = f.read(BLOCK_HEADER.itemsize)
            if len(head) == BLOCK_HEADER.itemsize:
                total += int(np.frombuffer(head, dtype=BLOCK_HEADER)[0]["records"])
    return total


# ------------------------------------------------- what the store was built from
def capture_sources(directory: str) -> dict[str, list[int]]:
    """{path in the directory: [bytes, mtime in ns]} of its raw capture files:
    the store records what it was built from, and is rebuilt (the files read
    and checked again) when one of them changed or a new one came; one that
    is gone leaves the store as it is (it holds what the file held)."""
    out = {}
    names = [os.path.relpath(p, directory) for r in RECORD_FILES for _, p in r.files(directory)]
    for name in {*names, ALLOCATOR_CALLS_FILE, BLOCKS_FILE, BLOCK_EVENTS_FILE}:
        try:
            st = os.stat(os.path.join(directory, name))
        except OSError:
            continue
        out[name] = [st.st_size, st.st_mtime_ns]
    return out


def store_is_complete(directory: str) -> bool:
    meta = read_store_meta(directory)
    return bool(
        meta
        and meta.get("format_version") == STORE_FORMAT_VERSION
        and meta.get("complete")
        and isinstance(meta.get("sources"), dict)
        and all(meta["sources"].get(name) == now for name, now in capture_sources(directory).items())
    )
