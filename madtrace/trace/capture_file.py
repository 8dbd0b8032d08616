# SPDX-License-Identifier: GPL-2.0-or-later
"""Reading and writing the capture container (layout: trace/format.py).

``CaptureFormat(kind, record_size)`` is one kind of raw capture file:

* ``create(path)`` opens it for appending and writes its header if it is new;
  ``append(fd, rows)`` and ``append_payload(fd, payload)`` frame what they
  are given into chunks (header and payload in one ``writev``);
* ``payloads(path)`` yields every chunk's payload, checked; ``record_chunks``
  the records of each chunk as numpy arrays; ``read_rows(path, dtype, start,
  count)`` a range of records (through ``index``: where each chunk is, from
  its headers alone, kept per file and extended as the file grows).

Everything that is not what a writer wrote is CorruptTraceError (exit 18), in
one line naming the file and the byte offset.  A last chunk cut short is left
out: while the recording is unfinished (still running, or its tracer killed:
trace/partial.py) silently, in a finished trace with a one-line warning (the
complete chunks before it are intact: each is checked).
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np
import xxhash

from ..errors import CorruptTraceError
from .format import RECORD_DTYPE, unfinished
from .format import (CAPTURE_FORMAT_VERSION, CAPTURE_HEADER, CAPTURE_KINDS, CAPTURE_MAGIC,
                     CHUNK_HEADER, CHUNK_MAGIC, CHUNK_MAX_BYTES)

_HEADER = struct.Struct("<8sHHIII")          # CAPTURE_HEADER without its check
_CHUNK = struct.Struct("<IIQ")               # CHUNK_HEADER
assert _HEADER.size + 8 == CAPTURE_HEADER.itemsize and _CHUNK.size == CHUNK_HEADER.itemsize
HEADER_SIZE = CAPTURE_HEADER.itemsize
CHUNK_HEADER_SIZE = CHUNK_HEADER.itemsize
# (file, offset) of the cut-short files already reported
_CUT_SHORT: set[tuple[str, int]] = set()
READ_BUFFER = 1 << 16   # chunk headers and small chunks come from it; a large payload mostly not


def checksum(payload) -> int:
    """A chunk's check: XXH3-64 of the payload, seeded with its length."""
    return xxhash.xxh3_64_intdigest(payload, seed=len(payload))


def chunk_header(payload) -> bytes:
    return _CHUNK.pack(CHUNK_MAGIC, len(payload), checksum(payload))


def _unfinished(path: str) -> bool:
    return unfinished(os.path.dirname(os.path.dirname(os.path.abspath(path))))


@dataclass
class ChunkIndex:
    """Where the complete chunks of one file are (from their headers)."""

    ino: tuple[int, int]
    end: int = HEADER_SIZE                   # the offset after the last chunk indexed
    offsets: list[int] = field(default_factory=list)    # of each chunk's header
    lengths: list[int] = field(default_factory=list)
    rows: int = 0
    starts: np.ndarray | None = None        # first row of each chunk (built on demand)


_INDEXES: dict[str, ChunkIndex] = {}


@dataclass(frozen=True)
class CaptureFormat:
    kind: str
    record_size: int

    @property
    def kind_code(self) -> int:
        return CAPTURE_KINDS[self.kind]

    @property
    def records(self) -> bool:
        """Whether the payloads are whole records (else blocks: the compact kind)."""
        return self.kind != "compact"

    def header(self) -> bytes:
        head = _HEADER.pack(CAPTURE_MAGIC, CAPTURE_FORMAT_VERSION, self.kind_code,
                            self.record_size, CHUNK_MAX_BYTES, 0)
        return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))

    # ------------------------------------------------------------- writing
    def create(self, path: str, truncate: bool = False) -> int:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
        fd = os.open(path, flags, 0o644)
        try:
            if os.fstat(fd).st_size == 0:
                write_all(fd, [self.header()])
        except BaseException:
            os.close(fd)
            raise
        return fd

    def append(self, fd: int, rows: np.ndarray) -> int:
        """Frames ``rows`` (whole records) into chunks of at most CHUNK_MAX_BYTES."""
        data = memoryview(rows.view(np.uint8).reshape(-1).data)
        step = CHUNK_MAX_BYTES - CHUNK_MAX_BYTES % self.record_size
        written = 0
        for at in range(0, len(data), step):
            written += self.append_payload(fd, data[at:at + step])
        return written

    def append_payload(self, fd: int, payload) -> int:
        """One chunk (its header and ``payload`` in one write)."""
        if len(payload) > CHUNK_MAX_BYTES:
            raise ValueError(f"a chunk of {len(payload)} bytes, more than {CHUNK_MAX_BYTES}")
        return write_all(fd, [chunk_header(payload), payload])

    # ------------------------------------------------------------- reading
    def check_header(self, path: str, head: bytes, size: int) -> bool:
        """Whether the file has its header (False: shorter, left by a killed
        tracer); CorruptTraceError for a header that is not ours."""
        if len(head) < HEADER_SIZE:
            if head and not CAPTURE_MAGIC.startswith(head[:8]):
                raise CorruptTraceError(f"{path}: no capture header at offset 0 (a trace made by "
                                        f"an older madtrace, or not a capture file)")
            if _unfinished(path):
                return False
            raise CorruptTraceError(f"{path}: truncated at offset {len(head)} (in its header)")
        magic, version, kind, record_size, _max, _ = _HEADER.unpack_from(head)
        if magic != CAPTURE_MAGIC:
            raise CorruptTraceError(f"{path}: no capture header at offset 0 (a trace made by an "
                                    f"older madtrace, or not a capture file)")
        if version != CAPTURE_FORMAT_VERSION:
            raise CorruptTraceError(f"{path}: unsupported capture format version {version} at "
                                    f"offset 8 (this madtrace reads {CAPTURE_FORMAT_VERSION})")
        (check,) = struct.unpack_from("<Q", head, _HEADER.size)
        if check != xxhash.xxh3_64_intdigest(head[:_HEADER.size]):
            raise CorruptTraceError(f"{path}: corrupt capture header at offset 0 (checksum)")
        if kind != self.kind_code or record_size != self.record_size:
            raise CorruptTraceError(f"{path}: capture header at offset 0 says kind {kind}, "
                                    f"{record_size}-byte records; expected kind {self.kind_code}, "
                                    f"{self.record_size}")
        return True

    def _chunk_length(self, path: str, offset: int, head: bytes) -> int:
        magic, length, _check = _CHUNK.unpack(head)
        if magic != CHUNK_MAGIC:
            raise CorruptTraceError(f"{path}: corrupt at offset {offset} (no chunk header)")
        if length > CHUNK_MAX_BYTES or (self.records and length % self.record_size):
            raise CorruptTraceError(f"{path}: corrupt at offset {offset} (chunk length {length})")
        return length

    def _tail(self, path: str, offset: int) -> None:
        """A chunk cut short at ``offset``: the end of an unfinished recording's
        file, or of a file cut short since (a copy stopped half-way, a full
        disk): the complete chunks before it are read, and the loss is said
        once."""
        if not _unfinished(path) and (path, offset) not in _CUT_SHORT:
            _CUT_SHORT.add((path, offset))
            print(f"madtrace: {path}: truncated at offset {offset} (an incomplete chunk in a "
                  f"trace whose recording ended): read up to there, what followed is lost",
                  file=sys.stderr, flush=True)

    def index(self, path: str) -> ChunkIndex:
        """The chunks of ``path`` from their headers (kept, and extended as the file grows)."""
        st = os.stat(path)
        ino = (st.st_dev, st.st_ino)
        index = _INDEXES.get(path)
        if index is None or index.ino != ino or st.st_size < index.end:
            if len(_INDEXES) > 4096:
                _INDEXES.clear()
            index = _INDEXES[path] = ChunkIndex(ino)
            with open(path, "rb") as f:
                if not self.check_header(path, f.read(HEADER_SIZE), st.st_size):
                    index.end = 0
                    del _INDEXES[path]
                    return index
        if st.st_size == index.end:
            return index
        with open(path, "rb") as f:
            offset = index.end
            while offset < st.st_size:
                f.seek(offset)
                head = f.read(CHUNK_HEADER_SIZE)
                if len(head) < CHUNK_HEADER_SIZE:
                    self._tail(path, offset)
                    break
                length = self._chunk_length(path, offset, head)
                if offset + CHUNK_HEADER_SIZE + length > st.st_size:
                    self._tail(path, offset)
                    break
                index.offsets.append(offset)
                index.lengths.append(length)
                index.rows += length // self.record_size
                offset += CHUNK_HEADER_SIZE + length
            index.end = offset
            index.starts = None
        return index

    def _frames(self, f, path: str, start: int, read_into) -> Iterator[tuple[int, object]]:
        """Walks the chunks of open file ``f`` from ``start`` (0: the first):
        ``read_into(length)`` gives a writable buffer of ``length`` bytes for
        each payload; yields (offset after the chunk, that buffer), checked."""
        size = os.fstat(f.fileno()).st_size
        if start == 0:
            if not self.check_header(path, f.read(HEADER_SIZE), size):
                return
            start = HEADER_SIZE
        else:
            f.seek(start)
        offset = start
        while True:
            head = f.read(CHUNK_HEADER_SIZE)
            if len(head) < CHUNK_HEADER_SIZE:
                if head:
                    self._tail(path, offset)
                return
            length = self._chunk_length(path, offset, head)
            if offset + CHUNK_HEADER_SIZE + length > size:
                self._tail(path, offset)
                return
            payload = read_into(length, size - offset)
            if f.readinto(payload) < length:
                self._tail(path, offset)
                return
            if checksum(payload) != _CHUNK.unpack(head)[2]:
                raise CorruptTraceError(f"{path}: corrupt at offset {offset} (checksum of a "
                                        f"chunk of {length} bytes)")
            offset += CHUNK_HEADER_SIZE + length
            yield offset, payload

    def payloads(self, path: str, start: int = 0) -> Iterator[tuple[int, bytearray]]:
        """(offset after the chunk, payload) of every complete chunk from the
        chunk at ``start`` (0: the first), each checked."""
        with open(path, "rb", buffering=READ_BUFFER) as f:
            for end, payload in self._frames(f, path, start, lambda n, _left: bytearray(n)):
                yield end, payload  # type: ignore[misc]

    def record_chunks(self, path: str, dtype: np.dtype, chunk_rows: int) -> Iterator[np.ndarray]:
        """The records, at most ``chunk_rows`` an array: each chunk's payload is
        read straight into the array it is returned in (one copy, as a plain
        file of records is read)."""
        size = dtype.itemsize
        batch = _Batch(np.empty(0, dtype=dtype))
        ready: list[np.ndarray] = []

        def read_into(length: int, left: int):
            rows, out, filled = length // size, batch.out, batch.filled
            if filled + rows > len(out):            # a new array (the full one goes out)
                if filled:
                    ready.append(out[:filled])
                out = np.empty(max(rows, min(chunk_rows, left // size)), dtype=dtype)
                batch.out, filled = out, 0
            batch.filled = filled + rows
            return memoryview(out[filled:filled + rows].view(np.uint8).data)

        with open(path, "rb", buffering=READ_BUFFER) as f:
            for _end, _payload in self._frames(f, path, 0, read_into):
                yield from ready
                ready.clear()
            if batch.filled:
                ready.append(batch.out[:batch.filled])
            yield from ready

    def read_rows(self, path: str, dtype: np.dtype, start: int = 0, count: int = -1) -> np.ndarray:
        if not os.path.exists(path):
            return np.zeros(0, dtype=dtype)
        index = self.index(path)
        stop = index.rows if count < 0 else min(index.rows, start + count)
        if stop <= start:
            return np.zeros(0, dtype=dtype)
        if index.starts is None:
            index.starts = np.cumsum([0] + [n // self.record_size for n in index.lengths])
        first = int(np.searchsorted(index.starts, start, side="right")) - 1
        out = np.empty(stop - start, dtype=dtype)
        filled = 0
        with open(path, "rb") as f:
            chunk = first
            while filled < len(out):
                offset, length = index.offsets[chunk], index.lengths[chunk]
                f.seek(offset)
                head = f.read(CHUNK_HEADER_SIZE)
                skip = start + filled - int(index.starts[chunk])
                rows = length // self.record_size
                whole = skip == 0 and rows <= len(out) - filled     # read straight into out
                payload = memoryview(out[filled:filled + rows].view(np.uint8).data) if whole \
                    else memoryview(bytearray(length))
                if _CHUNK.unpack(head)[:2] != (CHUNK_MAGIC, length) or f.readinto(payload) < length:
                    raise CorruptTraceError(f"{path}: changed at offset {offset} while read")
                if checksum(payload) != _CHUNK.unpack(head)[2]:
                    raise CorruptTraceError(f"{path}: corrupt at offset {offset} (checksum of a "
                                            f"chunk of {length} bytes)")
                if not whole:
                    take = np.frombuffer(payload, dtype=dtype)[skip:skip + len(out) - filled]
                    out[filled:filled + len(take)] = take
                    rows = len(take)
                filled += rows
                chunk += 1
        return out


@dataclass
class _Batch:
    """The array chunks are read into, and how much of it is filled."""

    out: np.ndarray
    filled: int = 0


def rebatch(chunks: Iterable[np.ndarray], chunk_rows: int) -> Iterator[np.ndarray]:
    """The rows of ``chunks`` again, in arrays of at most ``chunk_rows`` (the
    small ones gathered, the large ones cut)."""
    pending: list[np.ndarray] = []
    size = 0
    for chunk in chunks:
        if size + len(chunk) > chunk_rows and pending:
            yield pending[0] if len(pending) == 1 else np.concatenate(pending)
            pending, size = [], 0
        if len(chunk) >= chunk_rows:
            whole = len(chunk) - len(chunk) % chunk_rows
            for at in range(0, whole, chunk_rows):
                yield chunk[at:at + chunk_rows]
            chunk = chunk[whole:]
        if len(chunk):
            pending.append(chunk)
            size += len(chunk)
    if pending:
        yield pending[0] if len(pending) == 1 else np.concatenate(pending)


def write_all(fd: int, parts: list) -> int:
    """Writes ``parts`` back to back (one writev while it writes them whole)."""
    total = sum(len(p) for p in parts)
    done = 0
    views = [memoryview(p).cast("B") for p in parts]
    while done < total:
        n = os.writev(fd, views)
        done += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
    return total


def c_header() -> str:
    """The container's constants for the C writers (build/native/capture_format.h),
    from the layout defined in trace/format.py."""
    lines = ["/* generated from madtrace/trace/format.py by the Makefile: do not edit */"]
    values = {
        "MT_CAPTURE_MAGIC": int.from_bytes(CAPTURE_MAGIC, "little"),
        "MT_CAPTURE_VERSION": CAPTURE_FORMAT_VERSION,
        "MT_CAPTURE_HEADER_SIZE": CAPTURE_HEADER.itemsize,
        "MT_CHUNK_HEADER_SIZE": CHUNK_HEADER.itemsize,
        "MT_CHUNK_MAGIC": CHUNK_MAGIC,
        "MT_CHUNK_MAX_BYTES": CHUNK_MAX_BYTES,
    }
    for name, offset in (("magic", 0), ("length", 4), ("check", 8)):
        assert CHUNK_HEADER.fields is not None and CHUNK_HEADER.fields[name][1] == offset
        values[f"MT_CHUNK_{name.upper()}_OFFSET"] = offset
    lines += [f"#define {name} {hex(value)}ULL" for name, value in values.items()]
    head = CaptureFormat("calls", RECORD_DTYPE.itemsize).header()   # a call file's, whole
    lines.append("#define MT_CALL_RECORDS_HEADER {" + ", ".join(hex(b) for b in head) + "}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # the Makefile: python -m madtrace.trace.capture_file > capture_format.h
    print(c_header(), end="")
