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

from ..trace.block_event_records import block_events
from ..trace.format import PAGE, PAGE_SHIFT as SHIFT
from ..trace.naming import address_space_of
from .access_counters import HeatmapCounter
from .shared_pass import Part, run_parts
from .trace_input import block_ranges, require_accesses

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
class HeatmapPart(Part):
    """The heat map as a part of the shared pass: access_counters.c counts each
    access on its page (and the next when it spans two) of the region that
    holds its address, exact byte ranges (a page shared by .data and .bss
    counts each one's accesses in its own row); accesses outside every region
    by page, for ``unmapped_regions``.  The block events after the accesses."""

    label = "heatmap"

    def __init__(self, directory: str):
        meta = require_accesses(directory, "heatmap")
        traced = [(int(s), int(e), str(label))
                  for s, e, label in meta.get("data_tracing", {}).get("regions", [])]
        regions = [HeatRegion(label, s, e, True) for s, e, label in traced]
        regions += untraced_regions(directory, traced)
        regions.sort(key=lambda r: r.start)
        self.directory, self.regions = directory, regions
        self.page_counts = HeatmapCounter([r.start for r in regions], [r.end for r in regions],
                                    [r.pages for r in regions])
        self.counter = ("heatmap", self.page_counts)

    def result(self) -> Heatmap:
        for event in block_events(self.directory):
            for address, size, _store in block_ranges(event):
                self.page_counts.block_range(address, size)
        regions = self.regions
        for i, r in enumerate(regions):
            counts = self.page_counts.region_counts(i, r.pages)
            if r.traced or counts.any():
                r.traced, r.counts = True, counts.copy()
        orphans: dict[int, list[int]] = {}
        keys, sums, _ = self.page_counts.outside.result()
        for key, (n,) in zip(keys.tolist(), sums.tolist()):
            orphans.setdefault(key >> 2, [0, 0, 0])[key & 3] += n
        regions += unmapped_regions(orphans)
        regions.sort(key=lambda r: r.start)
        for r in regions:
            r.cell_pages = _cell_pages(r.pages)
        once = self.page_counts.once
        return Heatmap(self.directory, regions, {"loads": int(once[0]), "stores": int(once[1])})

    def close(self) -> None:
        self.page_counts.close()


def heatmap(directory: str) -> Heatmap:
    return run_parts(directory, [HeatmapPart(directory)])[0]
