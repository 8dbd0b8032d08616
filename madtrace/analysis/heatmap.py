# SPDX-License-Identifier: GPL-2.0-or-later
"""The page heat map of MadT's Fig. 1: the data regions of the address space,
top (low addresses) to bottom, one cell per page with its access count
(madtrace report DIR --kind heatmap).

Regions come from what the trace directory saved:

* traced regions: ``data_tracing.regions`` of meta.json (each module's
  .data/.bss, the brk ``[heap]``, the anonymous private mappings the program
  made, ``[anon 0x...]``; or only those --regions/--only selected);
* untraced data regions, shown grey: the .data/.bss of the modules that are
  not traced (the dynamic loader...), ``[stack]``, the heap when it was not
  selected, and the other anonymous read/write mappings (thread stacks,
  TLS) of the memory map saved at the end (maps.end.txt, else
  maps.start.txt); madtrace's own mappings are left out;
* pages accessed outside all of those (a mapping unmapped before the end):
  runs of such pages, labelled ``[anon 0x...] (unmapped)``.

Counts per page: loads and stores (an access that straddles a page boundary
counts on both pages), and block events (memcpy/memset/system calls that
moved the page's bytes as one event, counted once per event and page).
A region with more than ``MAX_CELLS`` pages shows ``cell_pages`` pages per
cell (a power of two), so the map stays readable; the JSON form lists every
touched page.  Memory: one counter triple per distinct page touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace.access_pass import Tally
from ..trace.block_event_records import block_events
from ..trace.format import PAGE, PAGE_SHIFT as SHIFT
from ..trace.naming import address_space_of
from ..trace.reader import iter_access_chunks
from .trace_input import Progress, access_rows, block_ranges, require_accesses

COLUMNS = 64                 # cells per row (text and PNG)
MAX_CELLS = COLUMNS * 64     # cells per region before pages are grouped
UNMAPPED_GAP = 16            # pages: accessed pages closer than this form one region
OWN_MAPPINGS = "/memfd:madtrace"


@dataclass
class HeatRegion:
    label: str
    start: int               # exact bytes [start, end); cells cover its pages
    end: int
    traced: bool
    cell_pages: int = 1
    # per page: loads, stores, block events (traced regions only)
    counts: np.ndarray | None = field(default=None, repr=False)

    @property
    def first_page(self) -> int:
        """Address of the region's first page (start rounded down)."""
        return self.start & ~(PAGE - 1)

    @property
    def pages(self) -> int:
        return (((self.end + PAGE - 1) & ~(PAGE - 1)) - self.first_page) // PAGE

    @property
    def cells(self) -> int:
        return -(-self.pages // self.cell_pages)

    def cell_values(self) -> np.ndarray:
        """Accesses + block events per cell (int64), or None when untraced."""
        if self.counts is None:
            return None
        per_page = self.counts.sum(axis=1)
        padded = np.zeros(self.cells * self.cell_pages, dtype=np.int64)
        padded[:len(per_page)] = per_page
        return padded.reshape(self.cells, self.cell_pages).sum(axis=1)

    def totals(self) -> dict:
        if self.counts is None:
            return {"loads": 0, "stores": 0, "block_events": 0, "touched_pages": 0}
        s = self.counts.sum(axis=0)
        return {"loads": int(s[0]), "stores": int(s[1]), "block_events": int(s[2]),
                "touched_pages": int(np.count_nonzero(self.counts.sum(axis=1)))}

    def to_dict(self) -> dict:
        out = {"label": self.label, "start": self.start, "end": self.end, "traced": self.traced,
               "pages": self.pages, "cell_pages": self.cell_pages, **self.totals()}
        if self.counts is not None:
            touched = np.flatnonzero(self.counts.sum(axis=1))
            out["touched"] = [[self.first_page + int(i) * PAGE, *map(int, self.counts[i])]
                              for i in touched]
        return out


@dataclass
class Heatmap:
    directory: str
    regions: list[HeatRegion]
    # the accesses, each counted once ({"loads", "stores"}): a region's cells count an
    # access that spans two pages on each, its totals too; these are the trace's
    accesses: dict | None = None

    @property
    def max_cell(self) -> int:
        values = [r.cell_values() for r in self.regions if r.counts is not None]
        return max((int(v.max()) for v in values if len(v)), default=0)

    def region_of(self, address: int) -> HeatRegion | None:
        for r in self.regions:
            if r.start <= address < r.end:
                return r
        return None

    def to_dict(self) -> dict:
        totals = {k: sum(r.totals()[k] for r in self.regions)
                  for k in ("loads", "stores", "block_events", "touched_pages")}
        if self.accesses is not None:
            totals.update(self.accesses)
        return {"kind": "heatmap", "directory": self.directory, "page_size": PAGE,
                "columns": COLUMNS, **totals, "regions": [r.to_dict() for r in self.regions]}


# ------------------------------------------------------------------- regions
def _page_span(start: int, end: int) -> tuple[int, int]:
    return start & ~(PAGE - 1), (end + PAGE - 1) & ~(PAGE - 1)


def _overlaps(start: int, end: int, spans) -> bool:
    return any(start < e and s < end for s, e in spans)


def untraced_regions(directory: str, traced: list[tuple[int, int, str]]) -> list[HeatRegion]:
    space = address_space_of(directory)
    spans = [(s, e) for s, e, _ in traced]
    out: list[HeatRegion] = []
    for module in space.modules:
        if module.name == "[vdso]":
            continue
        for section in module.image.sections:
            if section.name in (".data", ".bss") and section.size:
                start = module.bias + section.address
                end = start + section.size
                if not _overlaps(start, end, spans):
                    out.append(HeatRegion(f"{section.name} of {module.name}", start, end, False))
                    spans.append((start, end))
    for m in space.mappings:
        if m.path not in ("", "[heap]", "[stack]") or m.perms.startswith("---"):
            continue         # files, madtrace's memfds, [vvar]...; guard pages
        if m.path == "" and space.module_for(m.start) is not None:
            continue         # the anonymous tail of a module's .bss
        if _overlaps(m.start, m.end, spans):
            continue
        label = m.path or f"[anon {m.start:#x}]"
        if out and not out[-1].traced and out[-1].label == label and out[-1].end == m.start:
            out[-1].end = m.end
        else:
            out.append(HeatRegion(label, m.start, m.end, False))
        spans.append((m.start, m.end))
    return out


def unmapped_regions(orphans: dict[int, list[int]]) -> list[HeatRegion]:
    """Runs of accessed pages that no region holds, with their counts."""
    out: list[HeatRegion] = []
    for page in sorted(orphans):
        if out and page - (out[-1].end >> SHIFT) < UNMAPPED_GAP:
            out[-1].end = (page + 1) << SHIFT
        else:
            out.append(HeatRegion(f"[anon {page << SHIFT:#x}] (unmapped)", page << SHIFT,
                                  (page + 1) << SHIFT, True))
    for r in out:
        r.counts = np.zeros((r.pages, 3), dtype=np.int64)
        for page in range(r.start >> SHIFT, r.end >> SHIFT):
            if page in orphans:
                r.counts[page - (r.start >> SHIFT)] = orphans[page]
    return out


def _cell_pages(pages: int) -> int:
    cell = 1
    while -(-pages // cell) > MAX_CELLS:
        cell *= 2
    return cell


# ------------------------------------------------------------------ counting
class _Counter:
    """Counts per (region, page) with regions found by their exact byte ranges (a
    page shared by .data and .bss counts each one's accesses in its own row)."""

    def __init__(self, regions: list[HeatRegion]):
        self.regions = regions
        self.starts = np.array([r.start for r in regions], dtype=np.uint64)
        self.ends = np.array([r.end for r in regions], dtype=np.uint64)
        self.first_page = np.array([r.start >> SHIFT for r in regions], dtype=np.uint64)
        self.pages = [np.zeros((_page_span(r.start, r.end)[1] - _page_span(r.start, r.end)[0])
                               >> SHIFT, dtype=np.int64) for r in regions]
        self.counts = [np.zeros((len(p), 3), dtype=np.int64) for p in self.pages]
        self.orphans: dict[int, list[int]] = {}
        self.tally = Tally(1)       # (region, page, column) -> count, until finish()
        self.once = np.zeros(2, dtype=np.int64)     # loads, stores: each access once

    def region_index(self, addresses: np.ndarray) -> np.ndarray:
        """Index of the region holding each address, -1 for none."""
        if not len(self.starts):
            return np.full(len(addresses), -1, dtype=np.int64)
        idx = np.searchsorted(self.starts, addresses, side="right").astype(np.int64) - 1
        safe = np.maximum(idx, 0)
        inside = (idx >= 0) & (addresses < self.ends[safe])
        return np.where(inside, idx, -1)

    def add(self, pages: np.ndarray, region: np.ndarray, column: np.ndarray) -> None:
        """One count per element: page number, region index (-1: none), column."""
        hit = region >= 0
        rel = pages[hit] - self.first_page[region[hit]]
        keys = (region[hit].astype(np.uint64) << np.uint64(38)) | (rel << np.uint64(2)) \
            | column[hit].astype(np.uint64)
        self.tally.add(keys, [None])
        if not hit.all():
            for page, col in zip(pages[~hit].tolist(), column[~hit].tolist()):
                self.orphans.setdefault(page, [0, 0, 0])[col] += 1

    def finish(self) -> None:
        """The tallied counts into ``counts``."""
        keys, sums, _ = self.tally.result()
        self.tally.close()
        self.tally = Tally(1)
        for key, (c,) in zip(keys.tolist(), sums.tolist()):
            table = self.counts[key >> 38]
            row = min((key >> 2) & ((1 << 36) - 1), len(table) - 1)
            table[row, key & 3] += c


def count_accesses(directory: str, counter: _Counter) -> None:
    progress = Progress("heatmap", access_rows(directory))
    for _tid, chunk in iter_access_chunks(directory):
        progress.add(len(chunk))
        addr = chunk["addr"]
        first = addr >> np.uint64(SHIFT)
        last_addr = addr + np.maximum(chunk["size"], 1).astype(np.uint64) - np.uint64(1)
        last = last_addr >> np.uint64(SHIFT)
        column = (chunk["kind"] == 2).astype(np.int64)
        region = counter.region_index(addr)
        counter.add(first, region, column)
        counter.once += np.bincount(column, minlength=2)[:2]
        straddle = last != first
        if straddle.any():
            counter.add(last[straddle], region[straddle], column[straddle])
    for event in block_events(directory):
        for address, size, _store in block_ranges(event):
            pages = np.arange(address >> SHIFT, ((address + max(size, 1) - 1) >> SHIFT) + 1,
                              dtype=np.uint64)
            where = np.maximum(pages << np.uint64(SHIFT), np.uint64(address))
            counter.add(pages, counter.region_index(where), np.full(len(pages), 2))
    counter.finish()


def heatmap(directory: str) -> Heatmap:
    meta = require_accesses(directory, "heatmap")
    traced = [(int(s), int(e), str(label))
              for s, e, label in meta.get("data_tracing", {}).get("regions", [])]
    regions = [HeatRegion(label, s, e, True) for s, e, label in traced]
    regions += untraced_regions(directory, traced)
    regions.sort(key=lambda r: r.start)
    counter = _Counter(regions)
    count_accesses(directory, counter)
    for r, counts in zip(regions, counter.counts):
        if r.traced or counts.any():
            r.traced, r.counts = True, counts
    regions += unmapped_regions(counter.orphans)
    regions.sort(key=lambda r: r.start)
    for r in regions:
        r.cell_pages = _cell_pages(r.pages)
    return Heatmap(directory, regions, {"loads": int(counter.once[0]),
                                        "stores": int(counter.once[1])})
