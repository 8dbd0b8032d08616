# SPDX-License-Identifier: GPL-2.0-or-later
"""Reuse distances (madtrace report DIR --kind reuse [--line N]): for each use
of a cache line, how many distinct other lines the thread used since its
previous use of it (a fully associative LRU cache of C lines hits exactly
the uses at distance < C).  Exact (memory_sim.c: the lines used last in a
short list, the others by Olken's method over a Fenwick tree; memory
proportional to the distinct lines, not to the trace).

Each thread's stream is its own (the distance a thread's private cache sees).
An access that spans two lines is a use of each.  Histograms in powers of
two: bucket 0 holds distance 0, bucket b >= 1 the distances 2^(b-1) ..
2^b - 1; ``cold`` the first use of a line.  Per data (variable and field,
heap block, region) and per function (the innermost traced call), with the
distance under which half and nine tenths of the reuses fall (the bucket's
upper bound): the working set that would keep them in cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace.access_pass import Tally
from .access_counters import reuse_uses
from .access_stream import AccessStream, StreamChunk
from .memory_sim import ReuseDistances
from .shared_pass import Part, SharedPass, run_parts
from .sharing import check_line
from .trace_input import require_accesses

BUCKETS = 48  # distances up to 2^47 lines
COLD = BUCKETS  # the bucket of first uses


def bucket_of(distance: np.ndarray) -> np.ndarray:
    """The histogram bucket of each distance (-1: COLD): what access_counters.c
    tallies, in numpy (the tests' reference)."""
    d = distance.astype(np.int64)
    out = np.zeros(len(d), dtype=np.int64)
    pos = d > 0
    b = np.floor(np.log2(d[pos].astype(np.float64))).astype(np.int64) + 1
    b[(np.int64(1) << (b - 1)) > d[pos]] -= 1  # log2 rounded up below a power of two
    out[pos] = b
    out[d < 0] = COLD
    return out


def bucket_label(b: int) -> str:
    if b == COLD:
        return "cold"
    if b <= 1:
        return str(b)
    return f"{1 << (b - 1)}-{(1 << b) - 1}"


def _bound(b: int) -> int:
    return 0 if b == 0 else (1 << b) - 1


@dataclass
class ReuseReport:
    directory: str
    line: int
    histogram: np.ndarray  # BUCKETS + 1 counts
    by_data: list[dict] = field(default_factory=list)
    by_function: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "kind": "reuse",
            "directory": self.directory,
            "line": self.line,
            "buckets": [bucket_label(b) for b in range(BUCKETS)] + ["cold"],
            **_summary(self.histogram),
            "by_data": self.by_data,
            "by_function": self.by_function,
        }


def _summary(hist: np.ndarray) -> dict:
    """uses, cold, the histogram (trailing empty buckets cut) and the distances
    half and nine tenths of the reuses stay under."""
    warm = hist[:BUCKETS]
    reuses = int(warm.sum())
    out: dict = {"uses": int(hist.sum()), "cold": int(hist[COLD]), "reuses": reuses}
    nonzero = np.nonzero(warm)[0]
    out["histogram"] = warm[: (int(nonzero[-1]) + 1) if len(nonzero) else 0].tolist()
    for name, share in (("p50", 0.5), ("p90", 0.9)):
        if reuses:
            b = int(np.searchsorted(np.cumsum(warm), share * reuses))
            out[name] = _bound(b)
        else:
            out[name] = None
    return out


class ReusePart(Part):
    """Reuse distances as a part of the shared pass: each thread's stream of
    lines through its own ReuseDistances (memory_sim.c), the uses tallied per
    data and function by bucket (access_counters.c)."""

    label = "reuse"
    names = True

    def __init__(self, directory: str, line: int | None = None):
        self.line = check_line(line)
        require_accesses(directory, "reuse")
        self.directory = directory
        self.by_data, self.by_function = Tally(1), Tally(1)
        self.histogram = np.zeros(BUCKETS + 1, dtype=np.int64)
        self.distances: ReuseDistances | None = None  # the current thread's
        self.stream: AccessStream | None = None

    def prepare(self, shared: SharedPass) -> None:
        self.stream = shared.stream

    def thread(self, tid: int) -> None:
        if self.distances is not None:
            self.distances.close()
        self.distances = ReuseDistances(self.line)

    def add(self, tid: int, chunk: StreamChunk) -> None:
        assert self.distances is not None  # thread() came first
        c = chunk.columns
        first, second = self.distances.run(c["addr"], c["size"])
        reuse_uses(self.by_data, self.by_function, self.histogram, c, first, second)

    def result(self) -> ReuseReport:
        stream = self.stream
        assert stream is not None
        labels, regions, _sites = stream.data_labels()
        report = ReuseReport(self.directory, self.line, self.histogram)
        report.by_data = _rows(self.by_data, lambda k: labels[k], "data", lambda k: {"region": regions[k]})
        if stream.has_calls:
            report.by_function = _rows(self.by_function, lambda k: stream.function_name(k - 1), "function")
        return report

    def close(self) -> None:
        if self.distances is not None:
            self.distances.close()
        self.by_data.close()
        self.by_function.close()


def reuse_report(directory: str, line: int | None = None) -> ReuseReport:
    return run_parts(directory, [ReusePart(directory, line)])[0]


def _rows(tally: Tally, name_of, label: str, extra=None) -> list[dict]:
    keys, sums, _ = tally.result()
    hists: dict[str, np.ndarray] = {}
    more: dict[str, dict] = {}
    for key, (n,) in zip(keys.tolist(), sums.tolist()):
        ident, b = key >> 8, key & 0xFF
        name = name_of(ident)
        h = hists.get(name)
        if h is None:
            h = hists[name] = np.zeros(BUCKETS + 1, dtype=np.int64)
            if extra is not None:
                more[name] = extra(ident)
        h[b] += n
    rows = [{label: name, **more.get(name, {}), **_summary(h)} for name, h in hists.items()]
    rows.sort(key=lambda r: (-r["uses"], r[label]))
    return rows
