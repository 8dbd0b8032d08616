# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's own Parquet writer, for its tables of integer columns (the access
rows, the call records): the file format of Apache Parquet, written from numpy
columns without building Arrow tables.

Why not pyarrow's writer: it encodes the access rows' nine columns at about
12 M rows per second per core, which bounded the store to a third of the rate
the access pass feeds it.  These columns need little of what a general writer
does: no nulls, no nesting, no strings, integers only, most of them sorted or
constant over long runs.  Here a column chunk's pages are encoded in C
(``parquet_pages.c``: PLAIN or DELTA_BINARY_PACKED, the definition levels as
one run) and compressed with zstd (``trace/zstd.py``), both without the GIL;
this module writes the Thrift structures around them (the compact protocol,
``_Thrift``) once per page and per column chunk.

What the files hold, as any Parquet reader (DuckDB, pyarrow, Spark) sees them:
format version 1 data pages; every column OPTIONAL (as pyarrow writes an Arrow
schema's nullable fields, so files of either writer have one schema) with the
logical integer type of its Arrow type (``uint64``: INT64 annotated unsigned,
``uint8``: INT32 annotated 8-bit unsigned, ...); one row group per ``write``;
min/max statistics on the columns asked for (signed integers only).
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .. import __version__
from ..errors import TracerInternalError
from ..native import load
from . import zstd

MAGIC = b"PAR1"
PAGE_ROWS = 1 << 17          # rows per data page
ZSTD_LEVEL = 1
# parquet.thrift's enums
INT32, INT64 = 1, 2
OPTIONAL = 1
PLAIN, RLE, DELTA_BINARY_PACKED = 0, 3, 5
ZSTD = 6
DATA_PAGE = 0
_UNSIGNED_CONVERTED = {8: 11, 16: 12, 32: 13, 64: 14}      # UINT_8 ... UINT_64
# pq_page's value kinds
_PLAIN_I64, _PLAIN_I32, _PLAIN_U8, _PLAIN_U16, _DELTA_I64, _DELTA_I32, _DELTA_U8 = range(7)
_DELTA_KINDS = (_DELTA_I64, _DELTA_I32, _DELTA_U8)


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtreplay.so", "the store's Parquet writer")
    P, I64 = ctypes.c_void_p, ctypes.c_int64
    lib.pq_page.restype, lib.pq_page.argtypes = I64, [ctypes.c_int, P, I64, P, P]
    lib.pq_page_bound.restype, lib.pq_page_bound.argtypes = I64, [I64]
    return lib


class _Thrift:
    """Thrift's compact protocol, the parts Parquet's footer and page headers use:
    ``struct(fields)`` with fields ``(id, kind, value)``, kind one of "i32", "i64",
    "i8", "bool", "binary", "struct" (value: fields), "list:i32", "list:binary",
    "list:struct"."""

    _TYPES = {"bool": 1, "i8": 3, "i16": 4, "i32": 5, "i64": 6, "binary": 8, "list": 9,
              "struct": 12}

    @staticmethod
    def varint(v: int) -> bytes:
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        return bytes(out)

    @classmethod
    def zigzag(cls, v: int) -> bytes:
        return cls.varint((v << 1) ^ (v >> 63) if v < 0 else v << 1)

    @classmethod
    def struct(cls, fields: list) -> bytes:
        out = bytearray()
        last = 0
        for ident, kind, value in fields:
            if value is None:
                continue
            base = kind.split(":")[0]
            code = cls._TYPES[base] if base != "bool" else (1 if value else 2)
            delta = ident - last
            if 0 < delta <= 15:
                out.append((delta << 4) | code)
            else:
                out.append(code)
                out += cls.zigzag(ident)
            last = ident
            if base != "bool":
                out += cls._value(kind, value)
        out.append(0)
        return bytes(out)

    @classmethod
    def _value(cls, kind: str, value) -> bytes:
        if kind in ("i32", "i64", "i16"):
            return cls.zigzag(value)
        if kind == "i8":
            return bytes([value & 0xFF])
        if kind == "binary":
            data = value.encode() if isinstance(value, str) else value
            return cls.varint(len(data)) + data
        if kind == "struct":
            return cls.struct(value)
        element = kind.split(":")[1]
        head = cls._TYPES[element]
        size = len(value)
        out = bytearray([(size << 4) | head] if size < 15 else [0xF0 | head])
        if size >= 15:
            out += cls.varint(size)
        for item in value:
            out += cls._value(element, item)
        return bytes(out)


def _column_kind(field: pa.Field, encoding: str) -> tuple[int, int, list]:
    """(physical type, pq_page's kind, the schema element's annotation fields)."""
    t = field.type
    if not pa.types.is_integer(t):
        raise TracerInternalError(f"the store's Parquet writer has no column of {t}")
    width, signed = t.bit_width, pa.types.is_signed_integer(t)
    physical = INT64 if width == 64 else INT32
    delta = encoding == "DELTA_BINARY_PACKED"
    if delta and width == 16:
        raise TracerInternalError(f"no delta encoding for {t}")
    kind = {64: _DELTA_I64, 32: _DELTA_I32, 8: _DELTA_U8}[width] if delta else \
        {64: _PLAIN_I64, 32: _PLAIN_I32, 16: _PLAIN_U16, 8: _PLAIN_U8}[width]
    if signed and width < 32:       # would need sign extension, which the kinds lack
        raise TracerInternalError(f"the store's Parquet writer has no column of {t}")
    annotation: list = []
    if not signed:
        annotation = [(6, "i32", _UNSIGNED_CONVERTED[width]),
                      (10, "struct", [(10, "struct", [(1, "i8", width), (2, "bool", False)])])]
    return physical, kind, annotation


def _encoding(kind: int) -> int:
    """The Parquet encoding of pq_page's value kind."""
    return DELTA_BINARY_PACKED if kind in _DELTA_KINDS else PLAIN


_SCRATCH = threading.local()


def _scratch(size: int) -> np.ndarray:
    """A page body's buffer, kept per thread (a new one for each column chunk
    came as new pages the kernel zeroed)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < size:
        buf = _SCRATCH.buf = np.empty(size, dtype=np.uint8)
    return buf


class EncodedRowGroup(NamedTuple):
    """A row group encoded (``RowGroupEncoder.encode``), not yet in a file: its
    bytes (page headers and pages), and per column chunk its place in them."""
    rows: int
    pieces: list
    chunks: list          # (field, physical, encoding, offset in pieces, size, compressed, stats)
    size: int             # uncompressed, page headers included
    compressed: int


class RowGroupEncoder:
    """Encodes row groups of integer columns (name -> numpy array, every column of
    ``schema``, as many rows each) into pages; holds no file, so that several
    threads encode the row groups of one file side by side (ParquetFileWriter
    appends them in order).  ``encodings``: column -> "DELTA_BINARY_PACKED" (the
    others PLAIN); ``statistics``: the columns whose min/max are kept."""

    def __init__(self, schema: pa.Schema, encodings: dict | None = None,
                 statistics: set | frozenset = frozenset()):
        self.lib = _library()
        self.schema = schema
        self.columns = []
        for field in schema:
            physical, kind, annotation = _column_kind(field, (encodings or {}).get(field.name, ""))
            self.columns.append((field, physical, kind, annotation,
                                 field.name in statistics and pa.types.is_signed_integer(field.type)))

    def encode(self, columns: dict | list[dict]) -> EncodedRowGroup | None:
        """One row group of ``columns``, or of a list of such dicts one after the
        other (pages do not cross from one to the next: nothing is copied to join
        them); None for no rows."""
        parts = [columns] if isinstance(columns, dict) else columns
        first = self.schema[0].name
        n = sum(len(part[first]) for part in parts)
        if n == 0:
            return None
        pieces: list = []
        chunks, offset, size, compressed = [], 0, 0, 0
        for field, physical, kind, _annotation, stats in self.columns:
            chunk_size = chunk_compressed = 0
            lo = hi = None
            for part in parts:
                values = np.ascontiguousarray(part[field.name])
                if len(values) != len(part[first]):
                    raise TracerInternalError(f"column {field.name}: {len(values)} rows, "
                                              f"not {len(part[first])}")
                if not len(values):
                    continue
                got_size, got_compressed, minmax = self._pages(kind, values, stats, pieces)
                chunk_size += got_size
                chunk_compressed += got_compressed
                if minmax is not None:
                    lo = minmax[0] if lo is None else min(lo, minmax[0])
                    hi = minmax[1] if hi is None else max(hi, minmax[1])
            chunks.append((field, physical, _encoding(kind), offset, chunk_size, chunk_compressed,
                           (lo, hi) if stats else None))
            offset += chunk_compressed
            size += chunk_size
            compressed += chunk_compressed
        return EncodedRowGroup(n, pieces, chunks, size, compressed)

    def _pages(self, kind: int, values: np.ndarray, stats: bool, pieces: list
               ) -> tuple[int, int, tuple | None]:
        """A column chunk's pages appended to ``pieces``: (size, compressed size,
        (min, max) or None)."""
        lib = self.lib
        n = len(values)
        body = _scratch(lib.pq_page_bound(min(n, PAGE_ROWS)))
        minmax = np.empty(2, dtype=np.int64)
        lo, hi = None, None
        size = compressed = 0
        encoding = _encoding(kind)
        for at in range(0, n, PAGE_ROWS):
            page = values[at:at + PAGE_ROWS]
            got = lib.pq_page(kind, page.ctypes.data, len(page), body.ctypes.data,
                              minmax.ctypes.data if stats else None)
            if got < 0:
                raise TracerInternalError(f"pq_page refused kind {kind}")
            if stats:
                lo = int(minmax[0]) if lo is None else min(lo, int(minmax[0]))
                hi = int(minmax[1]) if hi is None else max(hi, int(minmax[1]))
            data = zstd.compress(body[:got], ZSTD_LEVEL)
            header = _Thrift.struct([
                (1, "i32", DATA_PAGE), (2, "i32", got), (3, "i32", len(data)),
                (5, "struct", [(1, "i32", len(page)), (2, "i32", encoding), (3, "i32", RLE),
                               (4, "i32", RLE)])])
            pieces += (header, data)
            size += len(header) + got
            compressed += len(header) + len(data)
        return size, compressed, (lo, hi) if stats else None


class ParquetFileWriter:
    """One Parquet file: ``append(group)`` writes a row group that ``encoder``
    encoded (in the order appended), ``write(columns)`` encodes and appends one,
    ``close()`` writes the footer."""

    def __init__(self, path: str, encoder: RowGroupEncoder):
        self.encoder = encoder
        self.file = open(path, "wb")
        self.file.write(MAGIC)
        self.offset = len(MAGIC)
        self.row_groups: list[list] = []
        self.rows = 0

    def write(self, columns: dict) -> None:
        self.append(self.encoder.encode(columns))

    def append(self, group: EncodedRowGroup | None) -> None:
        if group is None:
            return
        start = self.offset
        for piece in group.pieces:
            self.file.write(piece)
        self.offset += group.compressed
        chunks = []
        for field, physical, encoding, offset, size, compressed, minmax in group.chunks:
            statistics = None
            if minmax is not None:
                pack = "<q" if physical == INT64 else "<i"
                statistics = [(3, "i64", 0), (5, "binary", struct.pack(pack, minmax[1])),
                              (6, "binary", struct.pack(pack, minmax[0]))]
            first = start + offset
            meta = [(1, "i32", physical), (2, "list:i32", [RLE, encoding]),
                    (3, "list:binary", [field.name]), (4, "i32", ZSTD), (5, "i64", group.rows),
                    (6, "i64", size), (7, "i64", compressed), (9, "i64", first),
                    (12, "struct", statistics)]
            chunks.append([(2, "i64", first), (3, "struct", meta)])
        self.row_groups.append([(1, "list:struct", chunks), (2, "i64", group.size),
                                (3, "i64", group.rows), (5, "i64", start),
                                (6, "i64", group.compressed), (7, "i16", len(self.row_groups))])
        self.rows += group.rows

    def close(self) -> None:
        if self.file.closed:
            return
        columns = self.encoder.columns
        elements = [[(4, "binary", "schema"), (5, "i32", len(columns))]]
        for field, physical, _kind, annotation, _stats in columns:
            elements.append([(1, "i32", physical), (3, "i32", OPTIONAL),
                             (4, "binary", field.name), *annotation])
        footer = _Thrift.struct([
            (1, "i32", 1), (2, "list:struct", elements), (3, "i64", self.rows),
            (4, "list:struct", self.row_groups),
            (6, "binary", f"madtrace version {__version__}"),
            # every column sorts as its type says (signed or not): readers use min/max_value
            (7, "list:struct", [[(1, "struct", [])] for _ in columns])])
        self.file.write(footer)
        self.file.write(struct.pack("<I", len(footer)))
        self.file.write(MAGIC)
        self.file.close()

    def __del__(self):
        file = getattr(self, "file", None)
        if file is not None and not file.closed:
            file.close()
