"""Reading a trace directory's data events back, in the order the tracer saw
them: accesses (data/<tid>.acc, read in chunks) and allocation events
(data/blocks.bin), merged by their shared ``order`` counter."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from .blocks import load_allocations
from .record_files import ACCESS_RECORDS


@dataclass(frozen=True)
class AllocEvent:
    order: int
    tid: int
    kind: str            # "M" malloc, "C" calloc, "R" realloc, "F" free
    block: dict


def load_accesses(directory: str) -> dict[int, np.ndarray]:
    """Every thread's accesses, whole (tests and small traces)."""
    return {tid: np.concatenate(list(ACCESS_RECORDS.chunks(path, 1 << 20)) or
                                [np.zeros(0, ACCESS_RECORDS.dtype)])
            for tid, path in ACCESS_RECORDS.files(directory)}


# MadT's event letters: M malloc (and C++ new), C calloc, R realloc, P mmap, E mremap;
# a block's release: F free (and delete), U munmap
_ALLOC_KIND = {"malloc": "M", "new": "M", "calloc": "C", "realloc": "R", "memmap": "P",
               "mremap": "E"}
_RELEASE_KIND = {"memmap": "U", "mremap": "U"}


def ordered_events(directory: str, chunk_rows: int = 1 << 16):
    """Yields (order, tid, event) for every access (a numpy record) and every
    allocation event (AllocEvent), in the tracer's order.  The access files
    are read in chunks of ``chunk_rows`` (memory: one chunk per thread)."""
    items: list[tuple[int, int, object]] = []
    for block in load_allocations(directory):
        items.append((block["order"], block["tid"], AllocEvent(block["order"], block["tid"],
                                                               _ALLOC_KIND[block["kind"]], block)))
        if block.get("freed_order") is not None:
            items.append((block["freed_order"], block["freed_tid"],
                          AllocEvent(block["freed_order"], block["freed_tid"],
                                     _RELEASE_KIND.get(block["kind"], "F"), block)))
    items.sort(key=lambda item: item[0])
    # merge: accesses of all threads by order, with allocation events in between
    streams = {tid: ACCESS_RECORDS.chunks(path, chunk_rows)
               for tid, path in ACCESS_RECORDS.files(directory)}
    current: dict[int, tuple[np.ndarray, int]] = {}
    heads: list[tuple[int, int]] = []
    for tid, chunks in streams.items():
        arr = next(chunks, None)
        if arr is not None:
            current[tid] = (arr, 0)
            heads.append((int(arr["order"][0]), tid))
    heapq.heapify(heads)
    a = 0
    while heads or a < len(items):
        next_alloc = items[a][0] if a < len(items) else None
        if heads and (next_alloc is None or heads[0][0] < next_alloc):
            order, tid = heapq.heappop(heads)
            arr, i = current[tid]
            yield order, tid, arr[i]
            i += 1
            if i == len(arr):
                arr, i = next(streams[tid], None), 0
            if arr is not None:
                current[tid] = (arr, i)
                heapq.heappush(heads, (int(arr["order"][i]), tid))
        else:
            yield items[a]
            a += 1
