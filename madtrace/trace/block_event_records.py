# SPDX-License-Identifier: GPL-2.0-or-later
"""Block events (MadT's Y, W, G: format.BLOCK_EVENT_DTYPE, one record each in
``data/block_events.bin``, a capture container): written by the tracer
(``BlockEventWriter``, used by data/block_events.py) as they come, read here.

Each record carries the heap block that held its range's address (and its
source's) when it happened, as the tracer's block index said, as an access
carries its own: readers do not look blocks up again.  Older traces wrote the
events as one JSON list (``data/block_events.json``) without blocks: they are
read as records, their blocks found in the block table (``BlockIndex``).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from ..errors import CorruptTraceError
from .format import (BLOCK_EVENT_DTYPE, BLOCK_EVENT_FREED, BLOCK_EVENT_HAS_SOURCE,
                     BLOCK_EVENT_KINDS, BLOCK_EVENT_SOURCE_FREED, BLOCK_EVENT_WHATS,
                     BLOCK_EVENTS_FILE, BLOCK_EVENTS_FILE_V1, DATA_DIR, load_json_list)
from .record_files import BLOCK_EVENT_RECORDS

KIND_CODES = {k: i for i, k in enumerate(BLOCK_EVENT_KINDS)}
WHAT_CODES = {w: i for i, w in enumerate(BLOCK_EVENT_WHATS)}


class BlockEventWriter:
    """Appends block events (a buffer, written when full and at ``flush``: a
    complete file as of then).  Memory: the buffer, whatever the number of events."""

    BUFFER_ROWS = 4096

    def __init__(self, directory: str):
        os.makedirs(os.path.join(directory, DATA_DIR), exist_ok=True)
        self.fd = BLOCK_EVENT_RECORDS.create(os.path.join(directory, BLOCK_EVENTS_FILE),
                                             truncate=True)
        self.rows: list[tuple] = []
        self.arrays: list[np.ndarray] = []     # events added as records, and rows before them
        self.buffered = 0                      # events in ``arrays``

    def add(self, tid: int, kind: str, what: str, order: int, seq: int, rip: int, address: int,
            size: int, source: int | None, block: tuple[int, int],
            source_block: tuple[int, int]) -> None:
        """``block``, ``source_block``: (heap block id or 0, 1 if it was freed)."""
        flags = (BLOCK_EVENT_HAS_SOURCE if source is not None else 0) | \
            (BLOCK_EVENT_FREED if block[1] else 0) | (BLOCK_EVENT_SOURCE_FREED if source_block[1] else 0)
        # a tuple in the record's field order (one numpy conversion a buffer: setting a
        # structured row's fields one by one cost ~10 us an event)
        self.rows.append((order, seq, rip, address, size, source or 0, tid, block[0],
                          source_block[0], KIND_CODES[kind], WHAT_CODES[what], flags, 0))
        if len(self.rows) == self.BUFFER_ROWS:
            self.flush()

    def add_rows(self, rows: np.ndarray) -> None:
        """Events already as records (BLOCK_EVENT_DTYPE), after those added before."""
        if self.rows:
            self.arrays.append(np.array(self.rows, dtype=BLOCK_EVENT_DTYPE))
            self.rows = []
        self.arrays.append(rows)
        self.buffered += len(rows)
        if self.buffered >= self.BUFFER_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.arrays.append(np.array(self.rows, dtype=BLOCK_EVENT_DTYPE))
            self.rows = []
        if self.arrays and self.fd >= 0:
            BLOCK_EVENT_RECORDS.append(self.fd, np.concatenate(self.arrays))
        self.arrays, self.buffered = [], 0

    def close(self) -> None:
        if self.fd >= 0:
            self.flush()
            os.close(self.fd)
            self.fd = -1


def read_block_event_rows(directory: str) -> np.ndarray:
    """Every block event of a trace directory (BLOCK_EVENT_DTYPE), in the order
    the tracer met them; empty without any."""
    path = os.path.join(directory, BLOCK_EVENTS_FILE)
    if os.path.exists(path):
        return BLOCK_EVENT_RECORDS.read(path)
    return _older_events(directory)


def _older_events(directory: str) -> np.ndarray:
    """data/block_events.json as records, with their blocks found in the block table."""
    from .blocks import BlockIndex, load_allocations
    events = load_json_list(directory, BLOCK_EVENTS_FILE_V1, ("kind", "address", "size", "order"))
    rows = np.zeros(len(events), dtype=BLOCK_EVENT_DTYPE)
    if not events:
        return rows
    index = BlockIndex(load_allocations(directory))
    for row, e in zip(rows, events):
        source = e.get("source")
        block, freed = index.find(int(e["address"]), int(e["order"]))
        found, source_freed = index.find(int(source), int(e["order"])) if source is not None \
            else (None, False)
        row["order"], row["seq"], row["rip"] = int(e["order"]), int(e.get("seq", 0)), \
            int(e.get("rip") or 0)
        row["address"], row["size"], row["source"] = int(e["address"]), int(e["size"]), \
            int(source or 0)
        row["tid"] = int(e.get("tid", 0))
        row["block"] = block["id"] if block is not None else 0
        row["source_block"] = found["id"] if found is not None else 0
        if e["kind"] not in KIND_CODES or e.get("what") not in WHAT_CODES:
            raise CorruptTraceError(f"{os.path.join(directory, BLOCK_EVENTS_FILE_V1)}: an event of "
                                    f"kind {e['kind']!r}, {e.get('what')!r}")
        row["kind"], row["what"] = KIND_CODES[e["kind"]], WHAT_CODES[e["what"]]
        row["flags"] = (BLOCK_EVENT_HAS_SOURCE if source is not None else 0) | \
            (BLOCK_EVENT_FREED if freed else 0) | (BLOCK_EVENT_SOURCE_FREED if source_freed else 0)
    return rows


def block_events(directory: str) -> Iterator[dict]:
    """Every block event as a dict: kind (Y, W, G), what, order, tid, seq, rip,
    address, size, source (Y only), block, freed, source_block, source_freed."""
    rows = read_block_event_rows(directory)
    for r in rows.tolist():
        order, seq, rip, address, size, source, tid, block, source_block, kind, what, flags, _ = r
        event = {"kind": BLOCK_EVENT_KINDS[kind], "what": BLOCK_EVENT_WHATS[what],
                 "order": order, "tid": tid, "seq": seq, "rip": rip, "address": address,
                 "size": size, "block": block, "freed": bool(flags & BLOCK_EVENT_FREED),
                 "source_block": source_block,
                 "source_freed": bool(flags & BLOCK_EVENT_SOURCE_FREED)}
        if flags & BLOCK_EVENT_HAS_SOURCE:
            event["source"] = source
        yield event
