# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's ``block_events`` table: MadT's Y/W/G events (memcpy/memmove
``Y``, memset and system calls that wrote traced memory ``W``, system calls
that read it ``G``; data/block_events.json), one row each, named like the
accesses: the heap block that held the address when the event happened
(``<malloc0014@build_list+39>+8``, ``<freed:...>`` after its release), else
the variable or symbol, else the region.

``pos`` places an event among its thread's records and accesses: the
``pos`` (in the ``events`` view) of the first access after it, or of the
call record after it when no access of the thread comes between them;
``order`` is the tracer's total order of accesses, allocations and block
events.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .blocks import BlockIndex, load_allocations
from .columnar import PartWriter
from .format import load_block_events
from .naming import AccessNamer
from .reader import iter_access_chunks


class BlockEventPlacer:
    """Counts, per block event, its thread's accesses with a smaller order, from
    the access chunks the store's pass sees (each thread's in order): the pass
    over the accesses is not made a second time for the events."""

    def __init__(self, directory: str):
        events = load_block_events(directory)
        self.events = sorted(events, key=lambda e: (int(e["tid"]), int(e["order"])))
        self.tids = np.array([int(e["tid"]) for e in self.events], dtype=np.int64)
        self.orders = np.array([int(e["order"]) for e in self.events], dtype=np.uint64)
        self.before = np.zeros(len(self.events), dtype=np.int64)

    def see(self, tid: int, orders: np.ndarray) -> None:
        if not len(self.events):
            return
        mine = np.flatnonzero(self.tids == tid)
        if len(mine):
            self.before[mine] += np.searchsorted(np.sort(orders), self.orders[mine], side="left")


def write_block_events(directory: str, namer: AccessNamer | None,
                       placer: BlockEventPlacer | None = None) -> int:
    """The block_events table; ``placer``: the counts of the accesses before each
    event, made by the store's pass (else the accesses are read here)."""
    if placer is None:
        placer = BlockEventPlacer(directory)
        for tid, chunk in iter_access_chunks(directory):
            placer.see(tid, chunk["order"])
    events = placer.events
    writer = PartWriter(directory, "block_events")
    if events:
        namer = namer or AccessNamer(directory)
        blocks = BlockIndex(load_allocations(directory))
        tids = np.array([int(e["tid"]) for e in events], dtype=np.int64)
        orders = np.array([int(e["order"]) for e in events], dtype=np.uint64)
        seqs = np.array([int(e.get("seq", 0)) for e in events], dtype=np.int64)
        before = placer.before
        addresses = np.array([int(e["address"]) for e in events], dtype=np.uint64)
        sources = [e.get("source") for e in events]
        rips = np.array([int(e.get("rip", 0)) for e in events], dtype=np.uint64)
        codes, names = namer.code_names(rips)
        writer.write({
            "tid": tids.astype(np.int32), "pos": seqs + before, "seq": seqs, "order": orders,
            "kind": pa.array([e["kind"] for e in events], type=pa.string()),
            "what": pa.array([e.get("what") for e in events], type=pa.string()),
            "rip": rips, "instruction": pa.array([names[c] for c in codes.tolist()],
                                                 type=pa.string()),
            "addr": addresses, "size": np.array([int(e["size"]) for e in events], dtype=np.uint64),
            "source": pa.array(sources, type=pa.uint64()),
            "data": pa.array(_names(namer, blocks, addresses, orders), type=pa.string()),
            "source_data": pa.array(_source_names(namer, blocks, sources, orders),
                                    type=pa.string())})
    writer.close()
    writer.ensure_file()
    return writer.rows


def _names(namer: AccessNamer, blocks: BlockIndex, addresses: np.ndarray,
           orders: np.ndarray) -> list[str]:
    """The name of each address when its event happened, as accesses are named:
    the heap block that held it then (live or freed), else the variable, symbol
    or region, + offset."""
    ids = np.zeros(len(addresses), dtype=np.uint32)
    freed = np.zeros(len(addresses), dtype=np.uint8)
    for i, (address, order) in enumerate(zip(addresses.tolist(), orders.tolist())):
        block, was_freed = blocks.find(address, order)
        if block is not None:
            ids[i], freed[i] = block["id"], was_freed
    return namer.data_labels(addresses, ids, freed)


def _source_names(namer, blocks, sources: list, orders: np.ndarray) -> list[str | None]:
    given = [i for i, s in enumerate(sources) if s is not None]
    out: list[str | None] = [None] * len(sources)
    if given:
        named = _names(namer, blocks, np.array([int(sources[i]) for i in given], dtype=np.uint64),
                       orders[given])
        for i, name in zip(given, named):
            out[i] = name
    return out
