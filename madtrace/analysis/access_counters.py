# SPDX-License-Identifier: GPL-2.0-or-later
"""The report kinds' counters over access rows (access_counters.c, built into
libmtreplay.so), through ctypes: the heat map's pages (:class:`HeatmapCounter`),
the heap blocks' use (:class:`AllocCounter`), the NUMA metrics
(:class:`NumaCounter`) and the accesses per instruction (a :class:`Tally` of
width 2); :func:`count` feeds a chunk of rows to every one given, in one
loop; the memory analyses' tallies after their simulation (:func:`cache_misses`,
:func:`reuse_uses`).
This module only moves arrays; the rules are in the C file, the meaning of
what they count in each kind's module."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..native import load
from ..trace.access_pass import AccessIds, DecodeState, Tally, UnknownInstruction, block_arguments
from ..trace.format import ACCESS_DTYPE

P, I64, I, U64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint64

ALLOC_COLUMNS = 9  # alloc_usage.COLUMNS: the counters per block


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = load("libmtreplay.so", "the report kinds' counters")
    sigs = {
        "hm_new": (P, [P, P, P, P, I64, P, P, P]),
        "hm_free": (None, [P]),
        "hm_block_range": (I, [P, U64, U64]),
        "al_new": (P, [I64, P, P]),
        "al_free": (None, [P]),
        "al_thread": (None, [P, P, P, I64]),
        "nu_new": (P, [P, P, P, I64, P, P, I64, I, P, P, P, P]),
        "nu_free": (None, [P]),
        "nu_thread": (None, [P, I64, P, P, I64]),
        "nu_first_touches": (I, [P, P, I64]),
        "nu_classify": (None, [P]),
        "nu_pages": (I64, [P, P]),
        "ac_count": (I, [P, I64, I64, P, P, P, P]),
        "ac_count_compact": (I64, [P, I64, I, P, P, P, P, P, I64, P, P, I64, P, P, P, P]),
        "ac_stream_compact": (
            I64,
            [P, I64, I, P, P, P, P, P, I64, P, P, I64, P, P, P, P, P, P, P, P, P, P, P],
        ),
        "ac_cache": (I, [P, P, P, I, P, P, P, I64, P, P, I64]),
        "ac_reuse": (I, [P, P, P, P, P, P, P, I64]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _rows(rows: np.ndarray) -> np.ndarray:
    if rows.dtype != ACCESS_DTYPE or not rows.flags.c_contiguous:
        rows = np.ascontiguousarray(rows, dtype=ACCESS_DTYPE)
    return rows


class _Counter:
    """A C counter object; ``_keep``: the arrays it points into."""

    _free = ""

    def __init__(self, ctx, keep: list):
        if not ctx:
            raise MemoryError(type(self).__name__)
        self._ctx = ctx
        self._keep = keep

    @property
    def handle(self) -> int:
        return self._ctx

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            getattr(_library(), self._free)(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close()


def _u64(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.uint64)


def _i64(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


class HeatmapCounter(_Counter):
    """Counts per page of regions (sorted by start, exact bytes [start, end),
    ``pages`` rows each): ``counts`` (rows x 3: loads, stores, block events, the
    regions' rows one after the other), ``outside`` (a Tally: page << 2 |
    column -> count, for accesses in no region), ``once`` (loads, stores:
    each access once)."""

    _free = "hm_free"

    def __init__(self, starts, ends, pages):
        starts, ends, pages = _u64(starts), _u64(ends), _i64(pages)
        first_row = _i64(np.concatenate([[0], np.cumsum(pages)[:-1]]) if len(pages) else [])
        self.first_row = first_row
        self.counts = np.zeros((int(pages.sum()), 3), dtype=np.int64)
        self.outside = Tally(1)
        self.once = np.zeros(2, dtype=np.int64)
        ctx = _library().hm_new(
            starts.ctypes.data,
            ends.ctypes.data,
            first_row.ctypes.data,
            pages.ctypes.data,
            len(starts),
            self.counts.ctypes.data,
            self.outside.handle,
            self.once.ctypes.data,
        )
        super().__init__(ctx, [starts, ends, first_row, pages])

    def block_range(self, address: int, size: int) -> None:
        """A block event's range: one count of column 2 on each of its pages."""
        if _library().hm_block_range(self._ctx, address, size):
            raise MemoryError("hm_block_range")

    def region_counts(self, index: int, pages: int) -> np.ndarray:
        """The counts of region ``index`` (its ``pages`` rows)."""
        first = int(self.first_row[index])
        return self.counts[first : first + pages]

    def close(self) -> None:
        super().close()
        if hasattr(self, "outside"):
            self.outside.close()


class AllocCounter(_Counter):
    """Per block id below ``size``: ``table`` (size x ALLOC_COLUMNS counters) and
    ``first_freed`` (size x 4: order, rip, address, tid of the first access after
    free; order NO_ORDER: none)."""

    _free = "al_free"
    NO_ORDER = np.iinfo(np.uint64).max

    def __init__(self, size: int):
        self.table = np.zeros((size, ALLOC_COLUMNS), dtype=np.int64)
        self.first_freed = np.zeros((size, 4), dtype=np.uint64)
        self.first_freed[:, 0] = self.NO_ORDER
        super().__init__(_library().al_new(size, self.table.ctypes.data, self.first_freed.ctypes.data), [])
        self._spans: tuple = ()

    def thread(self, spans) -> None:
        """The allocator calls (sorted begin and end orders, or None) of the thread
        whose rows come next."""
        begins, ends = (
            (_u64(spans[0]), _u64(spans[1]))
            if spans is not None
            else (np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        )
        self._spans = (begins, ends)
        _library().al_thread(self._ctx, begins.ctypes.data, ends.ctypes.data, len(begins))


class NumaCounter(_Counter):
    """The NUMA tallies (numa.py says what they hold): ``bound`` (starts, ends,
    nodes) the topology's page ranges in its order; ``observed`` (pages sorted,
    nodes) the observed node of each page; ``first_touch``: the policy."""

    _free = "nu_free"

    def __init__(self, bound, observed, first_touch: bool):
        self.by_rip, self.by_group, self.by_thread = Tally(3), Tally(3), Tally(3)
        self.matrix = Tally(1)  # tid << 32 | page node + 1 -> accesses
        b_start, b_end, b_node = _u64(bound[0]), _u64(bound[1]), _i64(bound[2])
        o_page, o_node = _u64(observed[0]), _i64(observed[1])
        ctx = _library().nu_new(
            b_start.ctypes.data,
            b_end.ctypes.data,
            b_node.ctypes.data,
            len(b_start),
            o_page.ctypes.data,
            o_node.ctypes.data,
            len(o_page),
            int(first_touch),
            self.by_rip.handle,
            self.by_group.handle,
            self.by_thread.handle,
            self.matrix.handle,
        )
        super().__init__(ctx, [b_start, b_end, b_node, o_page, o_node])
        self._binding: tuple = ()

    def thread(self, tid: int, orders: np.ndarray, nodes: np.ndarray) -> None:
        """The thread whose rows come next and its binding changes (sorted orders,
        the node from each on)."""
        orders, nodes = _u64(orders), _i64(nodes)
        self._binding = (orders, nodes)
        _library().nu_thread(self._ctx, tid, orders.ctypes.data, nodes.ctypes.data, len(orders))

    def first_touches(self, rows: np.ndarray) -> None:
        rows = _rows(rows)
        if _library().nu_first_touches(self._ctx, rows.ctypes.data, len(rows)):
            raise MemoryError("nu_first_touches")

    def classify(self) -> None:
        """Every page's class from its first touch (after first_touches)."""
        _library().nu_classify(self._ctx)

    def pages(self) -> np.ndarray:
        """The pages met, by index."""
        lib = _library()
        out = np.empty(lib.nu_pages(self._ctx, None), dtype=np.uint64)
        if len(out):
            lib.nu_pages(self._ctx, out.ctypes.data)
        return out

    def close(self) -> None:
        super().close()
        for tally in ("by_rip", "by_group", "by_thread", "matrix"):
            if hasattr(self, tally):
                getattr(self, tally).close()


def _handles(
    heatmap: HeatmapCounter | None = None,
    alloc: AllocCounter | None = None,
    numa: NumaCounter | None = None,
    source: Tally | None = None,
) -> list:
    """The C objects of the counters given, in ac_count's order (None: not asked)."""
    return [None if c is None else c.handle for c in (heatmap, alloc, numa, source)]


def count(rows: np.ndarray, tid: int, **counters) -> None:
    """Access rows (ACCESS_DTYPE) of thread ``tid`` to each counter given:
    ``heatmap`` (HeatmapCounter), ``alloc`` (AllocCounter), ``numa``
    (NumaCounter), ``source`` (a Tally of width 2: rip << 1 | store -> accesses,
    bytes)."""
    rows = _rows(rows)
    if _library().ac_count(rows.ctypes.data, len(rows), tid, *_handles(**counters)):
        raise MemoryError("ac_count")


def count_block(raw, n: int, planes: bool, table, state: DecodeState, tid: int, **counters) -> int:
    """``count`` for a block of ``n`` compact records (access_pass.decode's
    arguments), decoded a tile at a time: no row is made.  Returns the rows
    counted; UnknownInstruction as decode (nothing counted)."""
    _buf, block = block_arguments(raw, n, planes, table)
    bad = ctypes.c_int64(0)
    got = _library().ac_count_compact(
        *block, ctypes.byref(state), ctypes.byref(bad), tid, *_handles(**counters)
    )
    if got == -2:
        raise UnknownInstruction(bad.value)
    if got < 0:
        raise MemoryError("ac_count_compact")
    return got


def stream_block(
    raw,
    n: int,
    planes: bool,
    table,
    state: DecodeState,
    tid: int,
    ids: AccessIds,
    out: dict,
    at: int,
    **counters,
) -> int:
    """``count_block``, then the block's columns for access_stream.py (its
    COMPACT_COLUMNS, the data ids by ``ids``) into ``out`` from ``at`` (room for
    2n rows).  Returns the rows written; UnknownInstruction as decode (nothing
    counted or written)."""
    _buf, block = block_arguments(raw, n, planes, table)
    columns = [out[c][at:] for c in ("addr", "size", "kind", "rip", "did", "order")]
    if any(len(c) < 2 * n for c in columns):
        raise ValueError("stream_block: the columns have no room for the rows")
    bad = ctypes.c_int64(0)
    got = _library().ac_stream_compact(
        *block,
        ctypes.byref(state),
        ctypes.byref(bad),
        tid,
        *_handles(**counters),
        ids.handle,
        *(c.ctypes.data for c in columns),
    )
    if got == -2:
        raise UnknownInstruction(bad.value)
    if got < 0:
        raise MemoryError("ac_stream_compact")
    return got


def cache_misses(
    by_data_function: Tally,
    by_rip: Tally,
    by_call: Tally | None,
    levels: int,
    columns: dict,
    codes: np.ndarray,
) -> None:
    """The cache's tallies (cache.py) of a chunk of the stream (``columns``:
    access_stream.COLUMNS) and its demand-miss codes (memory_sim.CacheHierarchy.run);
    ``by_call`` None: no call records."""
    did = np.ascontiguousarray(columns["did"], dtype=np.uint32)
    fid = np.ascontiguousarray(columns["fid"], dtype=np.int32)
    call = np.ascontiguousarray(columns["call_id"], dtype=np.int64) if by_call is not None else None
    rip = columns["rip"]
    if rip.dtype != np.uint64 or (len(rip) > 1 and rip.strides[0] <= 0):
        rip = np.ascontiguousarray(rip, dtype=np.uint64)
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if _library().ac_cache(
        by_data_function.handle,
        by_rip.handle,
        None if by_call is None else by_call.handle,
        levels,
        did.ctypes.data,
        fid.ctypes.data,
        rip.ctypes.data,
        rip.strides[0] if len(rip) > 1 else 8,
        None if call is None else call.ctypes.data,
        codes.ctypes.data,
        len(codes),
    ):
        raise MemoryError("ac_cache")


def reuse_uses(
    by_data: Tally,
    by_function: Tally,
    histogram: np.ndarray,
    columns: dict,
    first: np.ndarray,
    second: np.ndarray,
) -> None:
    """The reuse distances' tallies (reuse.py) of a chunk of the stream
    (``columns``) and its distances (memory_sim.ReuseDistances.run)."""
    did = np.ascontiguousarray(columns["did"], dtype=np.uint32)
    fid = np.ascontiguousarray(columns["fid"], dtype=np.int32)
    if histogram.dtype != np.int64 or not histogram.flags.c_contiguous:
        raise ValueError("reuse_uses: the histogram must be contiguous int64")
    if _library().ac_reuse(
        by_data.handle,
        by_function.handle,
        histogram.ctypes.data,
        did.ctypes.data,
        fid.ctypes.data,
        _i64(first).ctypes.data,
        _i64(second).ctypes.data,
        len(did),
    ):
        raise MemoryError("ac_reuse")
