# SPDX-License-Identifier: GPL-2.0-or-later
"""The access pass (madtrace/trace/access_pass.c), through ctypes.

* :func:`decode` turns one block of compact access records into access rows
  (``ACCESS_DTYPE``): what compact.py's reader does for every block;
* :class:`AccessIds` gives each access row the dense ids of the store: its
  instruction (rip and size) and its data (access_names.py says what a data
  key means), and counts loads, stores and bytes per data id as it goes.

This module only moves arrays; the rules are in the C file.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..errors import TracerInternalError
from ..native import load
from .format import ACCESS_DTYPE, COMPACT_DTYPE

P, I64, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtreplay.so", "the access pass")
    sigs = {
        "ap_access_size": (ctypes.c_size_t, []),
        "ap_decode": (I64, [P, I64, I, P, P, P, P, P, I64, P, P, P]),
        "ap_namer_new": (P, [P, P, P, I64, P, P, P, P, I64, P, P, P, I64, I64, P, P, I64,
                             P, P, P, P, P, P, I64]),
        "ap_namer_free": (None, [P]),
        "ap_keys": (I64, [P, I, I64, P]),
        "ap_count_rows": (I, [P, P, I64, P, P, I64]),
        "ap_count_compact": (I, [P, P, I64, I, P, P, P, P, P, I64, P, P, P, I64, P]),
        "ap_whole_objects": (None, [P, I]),
        "ap_rows_compact": (I64, [P, P, I64, I, P, P, P, P, P, I64, P, I64, P, P, I64,
                                  P, P, P, P, P, P, P, P, P, P]),
        "tl_new": (P, [I64]), "tl_free": (None, [P]),
        "tl_add": (I, [P, P, I64, P, I64, I64]), "tl_dump": (I64, [P, P, P, P]),
        "ap_rows": (I, [P, P, I64, I64, P, I64, P, P, I64, P, P, P, P, P, P, P, P, P]),
        "ap_data_ids": (I, [P, P, I64, P]),
        "ap_counts": (I64, [P, P]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.ap_access_size() != ACCESS_DTYPE.itemsize:
        raise TracerInternalError("libmtreplay.so does not match ACCESS_DTYPE: rebuild it "
                                  "(make native)")
    return lib


class DecodeState(ctypes.Structure):
    """The seq and the next order a thread's decoding carries from block to block."""
    _fields_ = [("seq", ctypes.c_uint64), ("next_order", ctypes.c_int64)]


class UnknownInstruction(Exception):
    """A record names an instruction id the table does not have (yet)."""

    def __init__(self, ident: int):
        super().__init__(ident)
        self.ident = ident


def block_arguments(raw, n: int, planes: bool, table) -> tuple[np.ndarray, list]:
    """The first arguments of every C function that reads a block of compact
    records: the records, how many, their layout, the instruction columns.  The
    array returned must live as long as the call."""
    buf = np.frombuffer(raw, dtype=np.uint8, count=n * COMPACT_DTYPE.itemsize)
    return buf, [buf.ctypes.data, n, int(planes), table.rip.ctypes.data, table.size.ctypes.data,
                 table.kind.ctypes.data, table.ilen.ctypes.data, table.first.ctypes.data,
                 len(table.rip)]


def decode(raw, n: int, planes: bool, table, state: DecodeState, out: np.ndarray) -> int:
    """Writes the access rows of ``n`` compact records ``raw`` (bytes: byte planes
    when ``planes``) to ``out`` (ACCESS_DTYPE, contiguous, room for 2n rows);
    returns how many.  ``table``: compact.InstructionColumns.  UnknownInstruction
    when a record names an id past the table (``state`` is then unchanged)."""
    lib = _library()
    if len(out) < 2 * n or not out.flags.c_contiguous:
        raise TracerInternalError("decode: the output has no room for the rows")
    _buf, block = block_arguments(raw, n, planes, table)
    bad = ctypes.c_int64(0)
    m = lib.ap_decode(*block, ctypes.byref(state), out.ctypes.data, ctypes.byref(bad))
    if m < 0:
        raise UnknownInstruction(bad.value)
    return m


def _u64(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.uint64)


def _spans(spans) -> tuple[np.ndarray, np.ndarray]:
    if spans is None:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    return _u64(spans[0]), _u64(spans[1])


# the store's access_rows columns (columnar.py), in the order the C side takes them
ROW_COLUMNS = ("pos", "seq", "order", "call_id", "fid", "iid", "did", "addr", "flags")
ROW_TYPES = (np.int64, np.int64, np.uint64, np.int64, np.int32, np.uint32, np.uint32,
             np.uint64, np.uint8)


def row_columns(n: int) -> dict[str, np.ndarray]:
    """Empty access_rows columns of ``n`` rows."""
    return {c: np.empty(n, dtype=t) for c, t in zip(ROW_COLUMNS, ROW_TYPES)}


class AccessIds:
    """Dense instruction and data ids for access rows (C state).  ``objects``,
    ``sections``, ``maps``: (starts, ends, payloads) sorted by start;
    ``object_is_variable``: per object payload; ``block_address``, ``block_order``:
    per block id - 1; ``history``: (starts, ends, froms, tos, payloads) of the
    traced regions' versions, sorted by start."""

    def __init__(self, objects, object_is_variable, sections, maps, unmapped: int,
                 block_address, block_order, history):
        self.lib = _library()
        # the C side keeps pointers into these: they live as long as it does
        self._keep: list[np.ndarray] = []

        def triple(t):
            starts, ends, payloads = (_u64(t[0]), _u64(t[1]),
                                      np.ascontiguousarray(t[2], dtype=np.int64))
            self._keep.extend((starts, ends, payloads))
            return [starts.ctypes.data, ends.ctypes.data, payloads.ctypes.data, len(starts)]

        # one byte per object (and one more: never empty)
        variable = np.zeros(len(object_is_variable) + 1, dtype=np.uint8)
        variable[:len(object_is_variable)] = np.asarray(object_is_variable, dtype=bool)
        blocks = _u64(block_address) if len(block_address) else np.zeros(1, dtype=np.uint64)
        orders = _u64(block_order) if len(block_order) else np.zeros(1, dtype=np.uint64)
        h_start, h_end, h_from, h_to = (_u64(c) for c in history[:4])
        h_payload = np.ascontiguousarray(history[4], dtype=np.int64)
        h_max_end = np.maximum.accumulate(h_end) if len(h_end) else h_end
        self._keep.extend((variable, blocks, orders, h_start, h_end, h_from, h_to, h_payload,
                           h_max_end))
        self._ctx = self.lib.ap_namer_new(*triple(objects), variable.ctypes.data,
                                          *triple(sections), *triple(maps), unmapped,
                                          blocks.ctypes.data, orders.ctypes.data,
                                          len(block_address), h_start.ctypes.data,
                                          h_end.ctypes.data, h_from.ctypes.data,
                                          h_to.ctypes.data, h_max_end.ctypes.data,
                                          h_payload.ctypes.data, len(h_start))
        if not self._ctx:
            raise MemoryError("ap_namer_new")

    def whole_objects(self) -> None:
        """From now on a variable's accesses have one data id whatever their
        offset (counts per variable, not per field: a summary's)."""
        self.lib.ap_whole_objects(self._ctx, 1)

    @property
    def handle(self) -> int:
        """The C namer, for the C passes that name rows (access_pass.h)."""
        return self._ctx

    def close(self) -> None:
        if self._ctx:
            self.lib.ap_namer_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()

    def rows(self, rows: np.ndarray, access_start: int, events: np.ndarray,
             spans: tuple[np.ndarray, np.ndarray] | None) -> dict:
        """The store's access_rows columns (columnar.py) of ``rows`` (ACCESS_DTYPE, the
        first of index ``access_start`` in its thread), their calls from the ACCESS
        events of ``events`` (EVENT_DTYPE), their allocator flags from ``spans``
        (the thread's allocator calls: sorted begin and end orders)."""
        rows = np.ascontiguousarray(rows)
        events = np.ascontiguousarray(events)
        n = len(rows)
        out = row_columns(n)
        begins, ends = _spans(spans)
        rc = self.lib.ap_rows(self._ctx, rows.ctypes.data, n, access_start, events.ctypes.data,
                              len(events), begins.ctypes.data, ends.ctypes.data, len(begins),
                              *(out[c].ctypes.data for c in ROW_COLUMNS))
        if rc == -1:
            raise MemoryError("ap_rows")
        if rc:
            raise TracerInternalError("ap_rows: the chunk's events do not match its accesses")
        return out

    def data_ids(self, rows: np.ndarray) -> np.ndarray:
        """The data id of each access row (ACCESS_DTYPE), as ``rows`` gives them."""
        rows = np.ascontiguousarray(rows)
        out = np.empty(len(rows), dtype=np.uint32)
        if self.lib.ap_data_ids(self._ctx, rows.ctypes.data, len(rows), out.ctypes.data):
            raise MemoryError("ap_data_ids")
        return out

    def rows_compact(self, raw, n: int, planes: bool, table, state: DecodeState,
                     access_start: int, spans, out: dict, at: int) -> int:
        """AccessIds.rows for ``n`` compact records of a thread without call records
        (decode's arguments), into the columns ``out`` (access_rows' columns, room
        for 2n rows from ``at``); returns the rows written.  UnknownInstruction as
        decode (nothing written)."""
        _buf, block = block_arguments(raw, n, planes, table)
        begins, ends = _spans(spans)
        bad = ctypes.c_int64(0)
        columns = [out[c][at:] for c in ROW_COLUMNS]
        if any(len(c) < 2 * n for c in columns):
            raise TracerInternalError("rows_compact: the columns have no room for the rows")
        got = self.lib.ap_rows_compact(self._ctx, *block, ctypes.byref(state), access_start,
                                       begins.ctypes.data, ends.ctypes.data, len(begins),
                                       *(c.ctypes.data for c in columns), ctypes.byref(bad))
        if got == -2:
            raise UnknownInstruction(bad.value)
        if got < 0:
            raise MemoryError("ap_rows_compact")
        return got

    def keys(self, which: int, first: int = 0) -> np.ndarray:
        """The keys of the ids from ``first`` on (``which`` 0: data, 1: instructions)."""
        n = self.lib.ap_keys(self._ctx, which, 0, None)
        out = np.empty(max(n - first, 0), dtype=np.uint64)
        if len(out):
            self.lib.ap_keys(self._ctx, which, first, out.ctypes.data)
        return out

    def count_rows(self, rows: np.ndarray, spans) -> None:
        """Count access rows (ACCESS_DTYPE) in counts(); ``spans``: the thread's
        allocator calls (sorted begin and end orders), or None."""
        rows = np.ascontiguousarray(rows)
        begins, ends = _spans(spans)
        if self.lib.ap_count_rows(self._ctx, rows.ctypes.data, len(rows), begins.ctypes.data,
                                  ends.ctypes.data, len(begins)):
            raise MemoryError("ap_count_rows")

    def count_compact(self, raw, n: int, planes: bool, table, state: DecodeState,
                      spans) -> None:
        """Count the access rows of ``n`` compact records (decode's arguments)
        without making them; UnknownInstruction as decode (nothing counted)."""
        _buf, block = block_arguments(raw, n, planes, table)
        begins, ends = _spans(spans)
        bad = ctypes.c_int64(0)
        rc = self.lib.ap_count_compact(self._ctx, *block, ctypes.byref(state), begins.ctypes.data,
                                       ends.ctypes.data, len(begins), ctypes.byref(bad))
        if rc == -2:
            raise UnknownInstruction(bad.value)
        if rc:
            raise MemoryError("ap_count_compact")

    def counts(self) -> np.ndarray:
        """Per data id: loads, stores, bytes, after_free (accesses to a freed block
        not made by the allocator, counted by count_rows and count_compact only):
        an (n, 4) int64 array."""
        n = self.lib.ap_keys(self._ctx, 0, 0, None)
        out = np.zeros((n, 4), dtype=np.int64)
        if n:
            self.lib.ap_counts(self._ctx, out.ctypes.data)
        return out


class Tally:
    """Per distinct uint64 key: the sums of ``width`` int64 columns and the
    position where the key was first met (C: one hashed pass, no sort)."""

    def __init__(self, width: int):
        self.lib = _library()
        self.width = width
        self._ctx = self.lib.tl_new(width)
        if not self._ctx:
            raise MemoryError("tl_new")
        self.rows = 0          # positions given so far (the next add's base)

    @property
    def handle(self) -> int:
        """The C tally, for the C passes that add to it (access_pass.h)."""
        return self._ctx

    def close(self) -> None:
        if self._ctx:
            self.lib.tl_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()

    def add(self, keys: np.ndarray, columns: list) -> None:
        """``keys`` (uint64), one entry per column: an int64 array, or None to
        count the rows."""
        keys = _u64(keys)
        if len(columns) > self.width:
            raise TracerInternalError("Tally.add: more columns than the tally's width")
        arrays = [None if c is None else np.ascontiguousarray(c, dtype=np.int64) for c in columns]
        pointers = (ctypes.c_void_p * max(len(arrays), 1))(
            *[None if a is None else a.ctypes.data for a in arrays])
        if self.lib.tl_add(self._ctx, keys.ctypes.data, len(keys), pointers, len(arrays),
                           self.rows):
            raise MemoryError("tl_add")
        self.rows += len(keys)

    def size(self) -> int:
        """How many distinct keys so far."""
        return self.lib.tl_dump(self._ctx, None, None, None)

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys in the order first met, sums (n, width), first positions)."""
        n = self.lib.tl_dump(self._ctx, None, None, None)
        keys = np.empty(n, dtype=np.uint64)
        sums = np.empty((n, self.width), dtype=np.int64)
        first = np.empty(n, dtype=np.int64)
        if n:
            self.lib.tl_dump(self._ctx, keys.ctypes.data, sums.ctypes.data, first.ctypes.data)
        return keys, sums, first
