# SPDX-License-Identifier: GPL-2.0-or-later
"""How the program used its heap blocks (madtrace report DIR --kind alloc).

Per block (the block table, trace/blocks.py; MadT's forged names): loads, stores and
bytes of the accesses that hit it, the bytes block events (memcpy, memset,
read()...) moved into or out of it, accesses after it was freed (use after
free: how many, and the first offending instruction, thread and offset) and
whether it was ever touched.  Per allocation site (``func+off`` of the
allocator's caller): blocks, bytes allocated, the same access totals, the
blocks never touched.

An access carries the id of the block that held its address when it
happened and whether that block was already freed (the recorder's
``block``/``freed`` fields), so one pass over the accesses in chunks suffices;
accesses the allocator made itself (its thread inside malloc, free...:
trace/allocator_calls.py) are counted apart (``allocator_accesses``) and are
never a use after free;
block events carry their blocks too (trace/block_event_records.py).  The malloc block
inside a C++ ``new`` (``part_of``) is the ``new`` block's bytes: its
accesses are the ``new`` block's, and it is neither listed as never touched
nor counted again in its site.  Memory: a few counters per block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace.allocator_calls import AllocatorCalls
from ..trace.blocks import block_name, load_allocations
from ..trace.block_event_records import block_events
from ..trace.naming import address_space_of
from .access_counters import AllocCounter
from .shared_pass import Part, run_parts
from .trace_input import BLOCK_READS, BLOCK_WRITES, block_ranges, require_accesses

COLUMNS = ("loads", "stores", "bytes_loaded", "bytes_stored", "block_bytes_in", "block_bytes_out",
           "block_events", "freed_accesses", "allocator_accesses")


@dataclass
class AllocUsage:
    directory: str
    blocks: list[dict]                       # the block table's rows as dicts + the counters
    sites: list[dict] = field(default_factory=list)
    totals: dict = field(default_factory=dict)

    @property
    def untouched(self) -> list[dict]:
        return [b for b in self.blocks if not b["touched"] and b.get("part_of") is None]

    @property
    def use_after_free(self) -> list[dict]:
        return [b for b in self.blocks if b["freed_accesses"] or b["freed_block_events"]]

    def to_dict(self) -> dict:
        return {"kind": "alloc", "directory": self.directory, "totals": self.totals,
                "sites": self.sites, "blocks": self.blocks,
                "untouched": [b["id"] for b in self.untouched],
                "use_after_free": [b["id"] for b in self.use_after_free]}


def _range_blocks(event: dict) -> list[tuple[int, bool]]:
    """(block, freed) of each range of ``block_ranges(event)``, in its order: the
    source (read) before the destination (written)."""
    out = []
    if event["kind"] in BLOCK_READS and event.get(BLOCK_READS[event["kind"]]) is not None:
        read_block = (event["source_block"], event["source_freed"]) if BLOCK_READS[event["kind"]] \
            == "source" else (event["block"], event["freed"])
        out.append(read_block)
    if event["kind"] in BLOCK_WRITES:
        out.append((event["block"], event["freed"]))
    return out


class AllocPart(Part):
    """The heap blocks' use as a part of the shared pass: access_counters.c
    counts the COLUMNS of each access's block (the allocator's accesses: its
    thread inside one of its calls) and keeps each block's first access after
    free; the block events after the accesses."""

    label = "alloc"

    def __init__(self, directory: str):
        require_accesses(directory, "alloc")
        self.directory = directory
        self.blocks = load_allocations(directory)
        self.calls = AllocatorCalls.load(directory)
        self.table = AllocCounter(max((b["id"] for b in self.blocks), default=0) + 1)
        self.counter = ("alloc", self.table)

    def thread(self, tid: int) -> None:
        self.table.thread(self.calls.spans(tid))

    def close(self) -> None:
        self.table.close()

    def result(self) -> AllocUsage:
        directory, blocks = self.directory, self.blocks
        table = self.table.table
        freed = self.table.first_freed
        first_uaf = {int(i): tuple(int(v) for v in freed[i])
                     for i in np.flatnonzero(freed[:, 0] != AllocCounter.NO_ORDER)}
        size = len(table)
        by_id = {b["id"]: b for b in blocks}
        freed_block_events = np.zeros(size, dtype=np.int64)
        for event in block_events(directory):
            # each range with the block the tracer found there (block_event_records.py)
            for (address, nbytes, is_store), (block_id, freed) in zip(
                    block_ranges(event), _range_blocks(event)):
                block = by_id.get(block_id) if block_id else None
                if block is None:
                    continue
                table[block_id, 4 if is_store else 5] += min(nbytes, block["address"] +
                                                             block["size"] - address)
                table[block_id, 6] += 1
                freed_block_events[block_id] += freed
        space = address_space_of(directory) if first_uaf else None
        out = []
        for b in sorted(blocks, key=lambda b: b["id"]):
            counters = {name: int(table[b["id"], i]) for i, name in enumerate(COLUMNS)}
            entry = dict(b, **counters, freed=b.get("freed_order") is not None,
                         freed_block_events=int(freed_block_events[b["id"]]))
            entry["bytes"] = counters["bytes_loaded"] + counters["bytes_stored"]
            # its name while it was live (``name`` is its name at the end: <freed:...>)
            entry["allocated_as"] = block_name(b["kind"], b["id"], b["site"], False)
            entry["touched"] = bool(counters["loads"] or counters["stores"] or counters["block_events"])
            if b["id"] in first_uaf:
                order, rip, address, tid = first_uaf[b["id"]]
                entry["first_freed_access"] = {"order": order, "tid": tid, "instruction":
                                               space.code_location(rip), "rip": rip,
                                               "offset": address - b["address"]}
            out.append(entry)
        for entry in out:      # the malloc inside a `new` is touched when its `new` is
            outer = by_id.get(entry.get("part_of")) if entry.get("part_of") is not None else None
            if outer is not None and not entry["touched"]:
                entry["touched"] = bool(table[outer["id"], 0] or table[outer["id"], 1]
                                        or table[outer["id"], 6])
        usage = AllocUsage(directory, out)
        usage.sites = _sites(out)
        usage.totals = {
            "blocks": len(out), "bytes_allocated": sum(b["size"] for b in out if b.get("part_of") is None),
            **{name: int(table[:, i].sum()) for i, name in enumerate(COLUMNS)},
            "untouched_blocks": len(usage.untouched), "use_after_free_blocks": len(usage.use_after_free)}
        return usage


def alloc_usage(directory: str) -> AllocUsage:
    return run_parts(directory, [AllocPart(directory)])[0]


def _sites(blocks: list[dict]) -> list[dict]:
    sites: dict[str, dict] = {}
    for b in blocks:
        if b.get("part_of") is not None:
            continue
        s = sites.setdefault(b["site"], {"site": b["site"], "kinds": [], "blocks": 0,
                                         "bytes_allocated": 0, "untouched_blocks": 0,
                                         **{name: 0 for name in COLUMNS}, "bytes": 0})
        if b["kind"] not in s["kinds"]:
            s["kinds"].append(b["kind"])
        s["blocks"] += 1
        s["bytes_allocated"] += b["size"]
        s["untouched_blocks"] += not b["touched"]
        for name in (*COLUMNS, "bytes"):
            s[name] += b[name]
    return sorted(sites.values(), key=lambda s: (-(s["loads"] + s["stores"]), s["site"]))
