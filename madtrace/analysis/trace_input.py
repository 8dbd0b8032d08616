# SPDX-License-Identifier: GPL-2.0-or-later
"""What the data analyses (heatmap, alloc, numa, footprint, source lines)
share about their input: the check that a trace has data accesses, the block
events (MadT's Y/W/G: memcpy/memset and system calls that moved traced
memory as one event), which heap block an address belonged to at a given
moment, and progress lines on stderr for long passes.

Accesses themselves are read with ``trace.reader.iter_access_chunks`` (numpy
chunks, bounded memory); everything here is small (one entry per block,
per block event).
"""

from __future__ import annotations

import sys

from ..errors import NoDataError
from ..trace.record_files import ACCESS_RECORDS
from ..trace.block_event_records import block_events
from ..trace.meta import accesses_recorded, read_meta

# block event kinds -> which of their ranges were read / written
#   Y copy: `source` read, `address` written; W block store; G block fetch (write())
BLOCK_READS = {"Y": "source", "G": "address"}
BLOCK_WRITES = {"Y": "address", "W": "address"}


def require_accesses(directory: str, kind: str) -> dict:
    """meta.json of ``directory``; NoDataError when it was recorded without --data."""
    meta = read_meta(directory)
    if "data_tracing" not in meta and not ACCESS_RECORDS.files(directory):
        raise NoDataError(f"{directory} has no data accesses: --kind {kind} needs a trace "
                          "recorded with --data")
    return meta


def access_rows(directory: str) -> int:
    """How many accesses the trace holds, for a progress line (meta.accesses_recorded)."""
    return accesses_recorded(directory)


def block_ranges(event: dict):
    """(address, size, is_store) of each range a block event read or wrote."""
    kind = event["kind"]
    if kind in BLOCK_READS and event.get(BLOCK_READS[kind]) is not None:
        yield int(event[BLOCK_READS[kind]]), int(event["size"]), False
    if kind in BLOCK_WRITES:
        yield int(event[BLOCK_WRITES[kind]]), int(event["size"]), True


class Progress:
    """``madtrace: KIND: N/TOTAL accesses`` on stderr every ``step`` rows, only
    for traces large enough to take a while."""

    def __init__(self, label: str, total: int, step: int = 5_000_000):
        self.label, self.total, self.step = label, total, step
        self.done = 0
        self.next = step
        self.shown = total >= 2 * step

    def add(self, rows: int) -> None:
        self.done += rows
        if self.shown and self.done >= self.next:
            self.next += self.step
            print(f"madtrace: {self.label}: {self.done / 1e6:.1f}M/{self.total / 1e6:.1f}M "
                  "accesses", file=sys.stderr, flush=True)


def thread_block_ranges(directory: str, meta: dict) -> dict[int, list[tuple[int, int, int, int]]]:
    """Per thread, the ranges block events read or wrote, clipped to the traced
    regions (meta.json; a memcpy from the stack only touched its traced bytes),
    as (seq, order, address, size) sorted by (seq, order): where they lie among
    the thread's call records (seq) and accesses (order)."""
    regions = sorted((int(s), int(e)) for s, e, _ in meta.get("data_tracing", {}).get("regions", []))
    out: dict[int, list[tuple[int, int, int, int]]] = {}
    for event in block_events(directory):
        for address, size, _store in block_ranges(event):
            for start, end in regions:
                lo, hi = max(start, address), min(end, address + size)
                if lo < hi:
                    out.setdefault(int(event["tid"]), []).append(
                        (int(event["seq"]), int(event["order"]), lo, hi - lo))
    for ranges in out.values():
        ranges.sort()
    return out
