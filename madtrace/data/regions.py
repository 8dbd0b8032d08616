"""Which bytes the data engine traces, and which pages it must protect.

Traced ranges are exact (pitfall 5): the .data and .bss sections of every
module except the dynamic loader and the vdso, and the brk heap; on request
(``--regions '.rodata of prog'``, a label that names it) the constant data
of .rodata too.  Never code, stacks, or madtrace's own areas.  Protection is per page, so a page
may hold traced and untraced bytes (.got.plt beside .data): faults on the
untraced bytes are executed and not recorded.  Each page remembers its
original protection, restored exactly when tracing ends.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
from dataclasses import dataclass

import numpy as np

from ..binary.address_space import AddressSpace
from ..binary.maps import Mapping
from ..trace.format import PAGE

TRACED_SECTIONS = (".data", ".bss")
OPT_IN_SECTIONS = (".rodata",)     # traced only when a --regions glob names them
SKIPPED_MODULES = ("ld-linux", "ld64", "[vdso]")


@dataclass(frozen=True)
class Region:
    start: int
    end: int
    label: str          # ".bss of prog", "[heap]"


def default_regions(space: AddressSpace, mappings: list[Mapping], opt_in: bool = False) -> list[Region]:
    """The traced regions of a process; ``opt_in``: also the sections traced only on
    request (.rodata), for a --regions filter to pick from."""
    sections = TRACED_SECTIONS + (OPT_IN_SECTIONS if opt_in else ())
    regions = []
    for module in space.modules:
        if module.name.startswith(SKIPPED_MODULES):
            continue
        for section in module.image.sections:
            if section.name in sections and section.size:
                start = module.bias + section.address
                regions.append(Region(start, start + section.size, f"{section.name} of {module.name}"))
    heap = [m for m in mappings if m.path == "[heap]"]   # may be split by mprotect
    if heap:
        regions.append(Region(min(m.start for m in heap), max(m.end for m in heap), "[heap]"))
    return sorted(regions, key=lambda r: r.start)


class RegionSet:
    """Sorted, non-overlapping traced ranges with bisect lookup, and their
    history: ``history`` holds ``[start, end, label, from, to]`` per version of
    a region, ``from``/``to`` orders of the tracer's event counter (``clock()``:
    the next order; None: 0), ``to`` None while it lasts.  A region that grows
    or shrinks from the same start under the same label ([heap] at each brk)
    stays one version (its end the largest it had); one cut or moved ends its
    version.  The trace names each access's region from it, as it was when
    the access happened (trace/access_names.py)."""

    def __init__(self, regions: list[Region], clock=None):
        self.regions = sorted(regions, key=lambda r: r.start)
        self._starts = [r.start for r in self.regions]
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.clock = clock
        self.history: list[list] = []
        self._open: dict[tuple[int, str], int] = {}     # (start, label) -> its version
        for r in self.regions:
            self._opened(r, 0)

    def _now(self) -> int:
        return self.clock() if self.clock is not None else 0

    def _opened(self, r: Region, now: int | None = None) -> None:
        at = self._open.get((r.start, r.label))
        if at is not None:
            self.history[at][1] = max(self.history[at][1], r.end)
            return
        self._open[(r.start, r.label)] = len(self.history)
        self.history.append([r.start, r.end, r.label, self._now() if now is None else now, None])

    def _closed(self, r: Region) -> None:
        at = self._open.pop((r.start, r.label), None)
        if at is not None:
            self.history[at][4] = self._now()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The ranges' starts and ends (uint64, sorted)."""
        if self._arrays is None:
            self._arrays = (np.array([r.start for r in self.regions], dtype=np.uint64),
                            np.array([r.end for r in self.regions], dtype=np.uint64))
        return self._arrays

    def mask(self, addresses: np.ndarray) -> np.ndarray:
        """Which of ``addresses`` (uint64) lie in a traced range."""
        starts, ends = self.arrays()
        if not len(starts):
            return np.zeros(len(addresses), dtype=bool)
        i = np.searchsorted(starts, addresses, side="right").astype(np.int64) - 1
        return (i >= 0) & (addresses < ends[np.maximum(i, 0)])

    def find(self, address: int) -> Region | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self.regions[i].end:
            return self.regions[i]
        return None

    def add(self, region: Region) -> None:
        self._opened(region)
        self.regions.append(region)
        self.regions.sort(key=lambda r: r.start)
        self._starts = [r.start for r in self.regions]
        self._arrays = None

    def replace(self, label: str, region: Region | None) -> None:
        for r in self.regions:
            if r.label == label and (region is None or r.start != region.start):
                self._closed(r)
        if region is not None:
            self._opened(region)
        self.regions = [r for r in self.regions if r.label != label]
        if region is not None:
            self.regions.append(region)
        self.regions.sort(key=lambda r: r.start)
        self._starts = [r.start for r in self.regions]
        self._arrays = None

    def cut(self, start: int, end: int) -> None:
        """Remove [start, end) from every region (munmap): trimmed or split."""
        kept = []
        for r in self.regions:
            if r.end <= start or r.start >= end:
                kept.append(r)
                continue
            self._closed(r)
            if r.start < start:
                kept.append(Region(r.start, start, r.label))
                self._opened(kept[-1])
            if r.end > end:
                kept.append(Region(end, r.end, r.label))
                self._opened(kept[-1])
        self.regions = sorted(kept, key=lambda r: r.start)
        self._starts = [r.start for r in self.regions]
        self._arrays = None

    def pages(self) -> set[int]:
        out: set[int] = set()
        for r in self.regions:
            out.update(range(r.start & ~(PAGE - 1), r.end, PAGE))
        return out


def region_matcher(globs):
    """A filter on region labels (".data of prog", "[heap]", "[anon 0x7f...]"): fnmatch
    globs in which square brackets are literal (labels contain them)."""
    patterns = [g.replace("[", "[[]").replace("]", "[]]").replace("[[[]]", "[[]") for g in globs]
    patterns = [re.compile(fnmatch.translate(p)) for p in patterns]
    return lambda region: any(p.match(region.label) for p in patterns)


def page_runs(pages) -> list[tuple[int, int]]:
    """Contiguous [start, end) runs of a set of page addresses."""
    runs: list[tuple[int, int]] = []
    for page in sorted(pages):
        if runs and runs[-1][1] == page:
            runs[-1] = (runs[-1][0], page + PAGE)
        else:
            runs.append((page, page + PAGE))
    return runs


def page_protections(mappings: list[Mapping], pages) -> "PageProtections":
    """The current PROT_* bits of each page (from /proc/PID/maps)."""
    starts = [m.start for m in mappings]
    out = {}
    for page in pages:
        i = bisect.bisect_right(starts, page) - 1
        if i < 0 or page >= mappings[i].end:
            continue
        perms = mappings[i].perms
        out[page] = (1 if perms[0] == "r" else 0) | (2 if perms[1] == "w" else 0) | \
            (4 if perms[2] == "x" else 0)
    return PageProtections(out)


class PageProtections:
    """The pages madtrace protects, with each one's original PROT_* bits, as
    sorted runs [start, end) of one protection: a region that comes, goes or
    changes costs O(log runs + its own pages), never O(every traced page).
    Reads like a dict page -> prot (``get``, ``in``, ``[]``, iteration over
    pages, ``len`` in pages); ``runs()`` gives the runs."""

    def __init__(self, items=None):
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._prots: list[int] = []
        self._pages = 0
        if items:
            self.update(items)

    # ------------------------------------------------------------ ranges
    def set_range(self, start: int, end: int, prot: int) -> None:
        """Pages [start, end) (page-aligned) protected, remembered as ``prot``."""
        if end <= start:
            return
        self.drop_range(start, end)
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        self._prots.insert(i, prot)
        self._pages += (end - start) // PAGE
        # join neighbours of the same protection
        if i + 1 < len(self._starts) and self._starts[i + 1] == end and self._prots[i + 1] == prot:
            self._ends[i] = self._ends[i + 1]
            del self._starts[i + 1], self._ends[i + 1], self._prots[i + 1]
        if i > 0 and self._ends[i - 1] == start and self._prots[i - 1] == prot:
            self._ends[i - 1] = self._ends[i]
            del self._starts[i], self._ends[i], self._prots[i]

    def drop_range(self, start: int, end: int) -> None:
        """Forget the pages in [start, end)."""
        if end <= start or not self._starts:
            return
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while i < len(self._starts) and self._starts[i] < end:
            s, e, p = self._starts[i], self._ends[i], self._prots[i]
            if e <= start:
                i += 1
                continue
            cut_start, cut_end = max(s, start), min(e, end)
            self._pages -= (cut_end - cut_start) // PAGE
            pieces = [(a, b) for a, b in ((s, cut_start), (cut_end, e)) if b > a]
            del self._starts[i], self._ends[i], self._prots[i]
            for a, b in pieces:
                self._starts.insert(i, a)
                self._ends.insert(i, b)
                self._prots.insert(i, p)
                i += 1

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that are not protected."""
        out, at = [], start
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while i < len(self._starts) and self._starts[i] < end:
            if self._ends[i] > at:
                if self._starts[i] > at:
                    out.append((at, self._starts[i]))
                at = max(at, self._ends[i])
            i += 1
        if at < end:
            out.append((at, end))
        return out

    def pages_in(self, start: int, end: int) -> list[int]:
        """The protected pages in [start, end)."""
        out: list[int] = []
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while i < len(self._starts) and self._starts[i] < end:
            lo = max(self._starts[i], start & ~(PAGE - 1))
            out.extend(range(lo, min(self._ends[i], end), PAGE))
            i += 1
        return out

    def runs(self) -> list[tuple[int, int, int]]:
        """(start, end, prot) of every run, by address."""
        return list(zip(self._starts, self._ends, self._prots))

    # ------------------------------------------------------- dict-like use
    def get(self, page: int, default=None):
        i = bisect.bisect_right(self._starts, page) - 1
        if i >= 0 and page < self._ends[i]:
            return self._prots[i]
        return default

    def __contains__(self, page: int) -> bool:
        return self.get(page) is not None

    def __getitem__(self, page: int) -> int:
        prot = self.get(page)
        if prot is None:
            raise KeyError(page)
        return prot

    def __setitem__(self, page: int, prot: int) -> None:
        self.set_range(page, page + PAGE, prot)

    def __delitem__(self, page: int) -> None:
        if page not in self:
            raise KeyError(page)
        self.drop_range(page, page + PAGE)

    def pop(self, page: int, default=None):
        prot = self.get(page)
        if prot is None:
            return default
        self.drop_range(page, page + PAGE)
        return prot

    def update(self, items) -> None:
        """``items``: a dict page -> prot, or (page, prot) pairs."""
        pairs = sorted(items.items() if hasattr(items, "items") else items)
        run = None
        for page, prot in pairs:
            if run is not None and run[1] == page and run[2] == prot:
                run[1] = page + PAGE
                continue
            if run is not None:
                self.set_range(*run)
            run = [page, page + PAGE, prot]
        if run is not None:
            self.set_range(*run)

    def items(self):
        for start, end, prot in self.runs():
            for page in range(start, end, PAGE):
                yield page, prot

    def __iter__(self):
        for start, end, _prot in self.runs():
            yield from range(start, end, PAGE)

    def __len__(self) -> int:
        return self._pages

    def __bool__(self) -> bool:
        return self._pages > 0

    def clear(self) -> None:
        self._starts, self._ends, self._prots, self._pages = [], [], [], 0
