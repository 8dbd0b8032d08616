# SPDX-License-Identifier: GPL-2.0-or-later
"""Decoding the compact access records (data/<tid>.dat, hybrid data engine).

Their layout is defined in trace/format.py (COMPACT_DTYPE, COMPACT_BLOCK_HEADER,
the markers); this module writes the blocks (``encode_block``, for the
tracer's drain), reads them back and decodes them to access rows.

Each access record stands for one access row per kind it does among the
kinds recorded (``kinds`` of data/instructions.jsonl): a read-modify-write is
two rows, its load then its store, with consecutive orders.  A reader stops
at an incomplete last block (the file is being written, or its tracer was
killed); each block is one chunk of the capture container (trace/capture_file.py).

``CompactReader(path, table).chunks(chunk_records)`` yields the rows as
ACCESS_DTYPE arrays, as the fault engine writes them to data/<tid>.acc;
everyone else reads both kinds of file through record_files.ACCESS_RECORDS.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

import numpy as np

from ..errors import CorruptTraceError
from . import access_pass, zstd
from .read_ahead import read_ahead
from .reused_arrays import ReusedArrays
from .capture_file import CaptureFormat
from .format import (ACCESS_DTYPE, COMPACT_BLOCK_HEADER,
                     COMPACT_CODEC, COMPACT_DTYPE, COMPACT_EXTENSION, COMPACT_FREED_BIT,
                     COMPACT_MAGIC, COMPACT_MAGIC_PLANES,
                     COMPACT_MARK_ORDER, COMPACT_MARK_SEQ, INSTRUCTION_COLUMNS, INSTRUCTIONS_FILE,
                     INSTRUCTIONS_FILE_V1, INSTRUCTIONS_FORMAT)

# the names the tracer's side (data/records.py) writes with
DATA_SUFFIX = COMPACT_EXTENSION
BLOCK_HEADER = COMPACT_BLOCK_HEADER
MAGIC, MAGIC_PLANES, CODEC = COMPACT_MAGIC, COMPACT_MAGIC_PLANES, COMPACT_CODEC
MARK_SEQ, MARK_ORDER = COMPACT_MARK_SEQ, COMPACT_MARK_ORDER
FREED_BIT = COMPACT_FREED_BIT
FORMAT = INSTRUCTIONS_FORMAT


class InstructionColumns:
    """data/instructions.jsonl as numpy columns indexed by instruction id."""

    def __init__(self, rows: list, kinds: int):
        table = np.array(rows or [[0] * 6], dtype=np.uint64).reshape(-1, 6)
        # contiguous columns: the access pass (C) reads them
        self.rip = np.ascontiguousarray(table[:, 0])
        self.size = table[:, 1].astype(np.uint16)
        self.kind = (table[:, 2].astype(np.uint8) & kinds)
        self.ilen = table[:, 3].astype(np.uint8)
        self.first = table[:, 4].astype(np.uint8)
        self.path = table[:, 5].astype(np.uint8)

    @classmethod
    def load(cls, directory: str) -> "InstructionColumns":
        path = os.path.join(directory, INSTRUCTIONS_FILE)
        older = os.path.join(directory, INSTRUCTIONS_FILE_V1)
        if not os.path.exists(path) and os.path.exists(older):
            path = older                   # format 1: one object, written at the end
        try:
            with open(path, "rb") as f:
                text = f.read()
            if path == older:
                head = json.loads(text)
                rows, expected = head["rows"], 1
            else:
                lines = text.split(b"\n")[:-1]      # the last: empty, or being written
                head = json.loads(lines[0]) if lines else {}
                rows, expected = [json.loads(line) for line in lines[1:]], FORMAT
            if head.get("format") != expected:
                raise CorruptTraceError(f"{path}: format {head.get('format')}, expected {expected}")
            return cls(rows, int(head["kinds"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptTraceError(f"{path}: {exc}") from None


def encode_block(records: np.ndarray, planes: np.ndarray | None = None) -> bytes:
    """One block of ``records`` (COMPACT_DTYPE), header included, as byte planes
    ("MTZ2"); ``planes``: those planes already made (uint8, the drain's C does it
    in one pass), else they are made here."""
    if planes is None:
        planes = to_planes(records)
    return encode_planes(planes, len(records))


def encode_planes(planes: np.ndarray, count: int) -> bytes:
    """One block ("MTZ2") of ``count`` records given as their byte planes."""
    packed = zstd.compress(planes)
    header = np.array([(MAGIC_PLANES, count * COMPACT_DTYPE.itemsize, len(packed), count)],
                      dtype=BLOCK_HEADER)
    return header.tobytes() + packed


def to_planes(records: np.ndarray) -> np.ndarray:
    """The records' bytes as planes: byte 0 of every record, then byte 1..."""
    return np.ascontiguousarray(records).view(np.uint8).reshape(-1, COMPACT_DTYPE.itemsize).T.copy()


def from_planes(raw, n: int) -> np.ndarray:
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(COMPACT_DTYPE.itemsize, n)
    return np.ascontiguousarray(planes.T).view(COMPACT_DTYPE).reshape(n)


def iter_raw_blocks(path: str, start: int = 0) -> Iterator[tuple[int, np.ndarray, int, bool]]:
    """(offset after the block, its decompressed records (bytes), how many, whether as byte
    planes) of each complete block from ``start`` (0: the first); each block is one
    chunk of the capture container, checked."""
    for offset, payload in CaptureFormat("compact", COMPACT_DTYPE.itemsize).payloads(path, start):
        if len(payload) < BLOCK_HEADER.itemsize:
            raise CorruptTraceError(f"{path}: no block header in the chunk before offset {offset}")
        h = np.frombuffer(payload, dtype=BLOCK_HEADER, count=1)[0]
        magic = int(h["magic"])
        if magic not in (MAGIC, MAGIC_PLANES) \
                or int(h["raw"]) != int(h["records"]) * COMPACT_DTYPE.itemsize \
                or int(h["packed"]) != len(payload) - BLOCK_HEADER.itemsize:
            raise CorruptTraceError(f"{path}: no block header in the chunk before offset {offset}")
        try:
            raw = zstd.decompress_array(memoryview(payload)[BLOCK_HEADER.itemsize:], int(h["raw"]))
        except (OSError, ValueError) as exc:        # ZstdError is a ValueError
            raise CorruptTraceError(f"{path}: the block before offset {offset}: {exc}") from None
        yield offset, raw, int(h["records"]), magic == MAGIC_PLANES


def iter_blocks(path: str, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """(offset after the block, its records as COMPACT_DTYPE) of each complete block."""
    for offset, raw, n, planes in iter_raw_blocks(path, start):
        yield offset, (from_planes(raw, n) if planes else np.frombuffer(raw, dtype=COMPACT_DTYPE))


class InstructionFile:
    """data/instructions.jsonl as the tracer appends to it: ``append(rows)``
    writes rows from the next id on, before any record naming them is written
    (a recording cut short stays readable)."""

    def __init__(self, directory: str, kinds: int):
        self.path = os.path.join(directory, INSTRUCTIONS_FILE)
        self.rows = 0
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                          0o644)
        self._write(json.dumps({"format": FORMAT, "kinds": kinds,
                                "columns": list(INSTRUCTION_COLUMNS)}) + "\n")

    def append(self, rows: list) -> None:
        if rows:
            self._write("".join(json.dumps([int(v) for v in row]) + "\n" for row in rows))
            self.rows += len(rows)

    def _write(self, text: str) -> None:
        view = memoryview(text.encode())
        while view:
            view = view[os.write(self.fd, view):]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class CompactReader:
    """Decodes one thread's file, block after block (``offset``: where the next
    block starts; the seq and order reached carry over from block to block)."""

    def __init__(self, path: str, table: InstructionColumns, directory: str | None = None):
        self.path = path
        self.table = table
        self.directory = directory   # given: a file still being written (its table grows)
        self.seq = 0
        self.next_order = 0
        self.offset = 0

    def chunks(self, chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
        """The access rows (ACCESS_DTYPE) of the complete blocks not read yet, in
        chunks of about ``chunk_rows``."""
        out = np.empty(0, dtype=ACCESS_DTYPE)
        size = 0
        arrays = ReusedArrays()
        for offset, raw, n, planes in read_ahead(iter_raw_blocks(self.path, self.offset)):
            if size + 2 * n > len(out):
                if size:
                    yield out[:size]
                # a buffer of its own for each chunk (a reader may keep the chunks it was
                # given), whose memory is reused once no reader has it any more
                out = arrays.empty(max(chunk_rows, 2 * n) + 2 * n, ACCESS_DTYPE)
                size = 0
            size += self._decode_raw(raw, n, planes, out[size:])
            self.offset = offset
            if size >= chunk_rows:
                yield out[:size]
                out, size = np.empty(0, dtype=ACCESS_DTYPE), 0
        if size:
            yield out[:size]

    def _decode_raw(self, raw, n: int, planes: bool, out: np.ndarray) -> int:
        return self._with_state(lambda table, state:
                                access_pass.decode(raw, n, planes, table, state, out))

    def _with_state(self, work):
        """``work(table, state)`` on one block, from the seq and order reached; the
        instruction table read again once if the block names an id past it (appended
        to data/instructions.jsonl after this reader loaded it: the tracer writes
        every id before the first record naming it).  Returns what ``work`` does."""
        for attempt in (0, 1):
            state = access_pass.DecodeState(self.seq, self.next_order)
            try:
                result = work(self.table, state)
                break
            except access_pass.UnknownInstruction as exc:
                if attempt or self.directory is None:
                    raise CorruptTraceError(f"{self.path}: instruction id {exc.ident} unknown") \
                        from None
                self.table = InstructionColumns.load(self.directory)
        self.seq, self.next_order = int(state.seq), int(state.next_order)
        return result

    def column_chunks(self, columns: dict, fill, chunk_rows: int = 1 << 20) -> Iterator[dict]:
        """Columns (name -> dtype) of the access rows of the complete blocks not read
        yet, in chunks of about ``chunk_rows``, each block written by ``fill(raw, n,
        planes, table, state, out, at, start)`` (access_pass.decode's arguments; the
        columns ``out``, room for 2n rows from ``at``; ``start``: the index of the
        block's first row in the thread), which returns the rows it wrote."""
        def empty(n: int) -> dict:
            return {c: np.empty(n, dtype=t) for c, t in columns.items()}

        out, size, start = empty(0), 0, 0
        first = next(iter(columns))
        for offset, raw, n, planes in read_ahead(iter_raw_blocks(self.path, self.offset)):
            if size + 2 * n > len(out[first]):
                if size:
                    yield {c: v[:size] for c, v in out.items()}
                    start += size
                out, size = empty(max(chunk_rows, 2 * n) + 2 * n), 0
            got = self._with_state(
                lambda table, state, raw=raw, n=n, planes=planes, out=out, size=size, at=start + size:
                fill(raw, n, planes, table, state, out, size, at))
            self.offset = offset
            size += got
            if size >= chunk_rows:
                yield {c: v[:size] for c, v in out.items()}
                start += size
                out, size = empty(0), 0
        if size:
            yield {c: v[:size] for c, v in out.items()}

    def row_chunks(self, ids, spans, chunk_rows: int = 1 << 20) -> Iterator[dict]:
        """The store's access_rows columns (access_pass.ROW_COLUMNS) of the complete
        blocks not read yet, for a thread without call records (``ids``:
        access_pass.AccessIds; ``spans``: its allocator calls), in chunks of about
        ``chunk_rows``: decoded and named a tile at a time, no access row made."""
        yield from self.column_chunks(
            dict(zip(access_pass.ROW_COLUMNS, access_pass.ROW_TYPES)),
            lambda raw, n, planes, table, state, out, at, start:
            ids.rows_compact(raw, n, planes, table, state, start, spans, out, at), chunk_rows)

    def each_block(self, work, progress=None) -> None:
        """``work(raw, n, planes, table, state)`` (access_pass.decode's arguments) on
        each complete block not read yet, from the seq and order reached;
        ``progress(n, answer)`` after each block of n records."""
        for offset, raw, n, planes in read_ahead(iter_raw_blocks(self.path, self.offset)):
            answer = self._with_state(lambda table, state, raw=raw, n=n, planes=planes:
                                      work(raw, n, planes, table, state))
            self.offset = offset
            if progress is not None:
                progress(n, answer)

    def count(self, ids, spans, progress=None) -> None:
        """Count the access rows of the complete blocks not read yet in ``ids``
        (access_pass.AccessIds) without making them; ``spans``: the thread's
        allocator calls (AllocatorCalls.spans); ``progress(n)`` after each block of
        n records."""
        self.each_block(lambda raw, n, planes, table, state:
                        ids.count_compact(raw, n, planes, table, state, spans),
                        None if progress is None else lambda n, _answer: progress(n))

    def decode(self, r: np.ndarray) -> np.ndarray:
        """The access rows of records ``r`` (COMPACT_DTYPE) as they are."""
        r = np.ascontiguousarray(r, dtype=COMPACT_DTYPE)
        out = np.empty(2 * len(r), dtype=ACCESS_DTYPE)
        return out[:self._decode_raw(r.tobytes(), len(r), False, out)]


# ------------------------------------------------------- a trace's access files
def compact_reader(path: str) -> CompactReader:
    """The reader of one compact file data/<tid>.dat, from its start."""
    directory = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    return CompactReader(path, InstructionColumns.load(directory), directory)


def compact_chunks(path: str, chunk_rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """The access rows (ACCESS_DTYPE) of one compact file data/<tid>.dat, in
    order, in chunks (record_files.ACCESS_RECORDS.chunks reads a .dat file with it)."""
    yield from compact_reader(path).chunks(chunk_rows)
