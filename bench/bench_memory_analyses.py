# SPDX-License-Identifier: GPL-2.0-or-later
"""The memory analyses (report --kind cache, sharing, reuse) on a large trace:
Debian's gzip compressing a generated text, every data access traced (or a
trace directory given with --trace), as a user runs them:

  cache      madtrace report DIR --kind cache --json (this machine's caches)
  sharing    madtrace report DIR --kind sharing --json
  reuse      madtrace report DIR --kind reuse --json
  heatmap    the existing heat map on the same trace, the anchor
  summary    madtrace summary DIR: reading and counting the trace, the floor of
             any pass over it

Each in its own process (/usr/bin/time: wall time, peak RSS), ``--runs`` runs,
the median; accesses per second = the trace's accesses / wall time.

  sim        the cache simulation alone (memory_sim.c) on the trace's first 40 M
             accesses, already in memory: the simulated accesses per second
  pycachesim the independent simulator the tests compare with, on the first
             million accesses (accesses per second)

  threads    the same kinds on a threaded trace: tests/progs/data_sharing.c (two
             threads storing to one line, a counter under a lock) with
             ``--rounds`` rounds each

  python bench/bench_memory_analyses.py [--mb 5] [--runs 3] [--trace DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_store_real import text, timed
from common import ROOT, prog, table

sys.path.insert(0, ROOT)

KINDS = ("cache", "sharing", "reuse", "heatmap")
SIM = """
import sys, time
import numpy as np
from madtrace.analysis.access_stream import AccessStream
from madtrace.analysis.cache import machine_levels
from madtrace.analysis.memory_sim import CacheHierarchy
stream = AccessStream(sys.argv[1], "bench")
chunks, held = [], 0
for c in stream.merged():                 # the first 40 M accesses (memory)
    chunks.append((c.columns["addr"], c.columns["size"], c.columns["kind"], c.thread))
    held += len(c)
    if held >= 40_000_000:
        break
stream.close()
levels = machine_levels()
private = next((i for i, lv in enumerate(levels) if lv.shared), len(levels))
sim = CacheHierarchy([(lv.size, lv.ways) for lv in levels], levels[0].line, private)
t = time.perf_counter()
n = 0
for a, s, k, th in chunks:
    sim.run(a, s, k, th)
    n += len(a)
print(n, time.perf_counter() - t)
first = chunks[0]
m = min(len(first[0]), 1_000_000)
from cachesim import Cache, CacheSimulator, MainMemory
below, caches = None, []
for lv in reversed(levels):
    c = Cache(lv.name, lv.size // lv.line // lv.ways, lv.ways, lv.line, "LRU",
              store_to=below, load_from=below)
    caches.insert(0, c)
    below = c
mem = MainMemory()
mem.load_to(caches[-1])
mem.store_from(caches[-1])
cs = CacheSimulator(caches[0], mem)
addr = (first[0][:m] & np.uint64(0xFFFFFFFF)).tolist()
t = time.perf_counter()
for a, s, k in zip(addr, first[1][:m].tolist(), first[2][:m].tolist()):
    (cs.store if k == 2 else cs.load)(a, length=max(s, 1))
print(m, time.perf_counter() - t)
"""


def accesses_of(directory: str) -> int:
    with open(os.path.join(directory, "meta.json")) as f:
        meta = json.load(f)
    return sum(c["L"] + c["S"] for c in meta["accesses"].values())


def kinds_of(madtrace: list[str], directory: str, events: int, runs: int) -> list[tuple]:
    """(kind, median s, range, M accesses/s, peak RSS MB) of the summary and each kind."""
    rows = []
    for kind in ("summary",) + KINDS:
        times = []
        for _ in range(runs):
            command = [*madtrace, "summary", directory] if kind == "summary" else \
                [*madtrace, "report", directory, "--kind", kind, "--json"]
            seconds, rss, _ = timed(command)
            times.append((seconds, rss))
        seconds = statistics.median(s for s, _ in times)
        rows.append((kind, f"{seconds:.2f}", f"{min(s for s, _ in times):.2f}-"
                     f"{max(s for s, _ in times):.2f}", f"{events / seconds / 1e6:.1f}",
                     max(r for _, r in times)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=5.0, help="size of the text (MB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trace", help="an existing trace directory (recorded with --data)")
    parser.add_argument("--rounds", type=int, default=2_000_000,
                        help="rounds of each thread of the threaded trace")
    args = parser.parse_args()
    madtrace = [sys.executable, "-m", "madtrace.cli.main"]
    work = tempfile.mkdtemp(prefix="madtrace-memory-")
    try:
        directory = args.trace
        what = f"the trace {directory}"
        if directory is None:
            gzip = shutil.which("gzip")
            if gzip is None:
                raise SystemExit("gzip is not installed (Debian package gzip)")
            source = os.path.join(work, "text")
            text(source, int(args.mb * 1e6))
            directory = os.path.join(work, "t")
            timed([*madtrace, "record", "-q", "--data", "-o", directory, "--", gzip, "-c", source])
            what = f"gzip -c of a {args.mb:g} MB text, every data access traced"
        events = accesses_of(directory)
        rows = kinds_of(madtrace, directory, events, args.runs)
        threaded = os.path.join(work, "threads")
        timed([*madtrace, "record", "-q", "--data", "-o", threaded, "--",
               prog("data_sharing", "O2-pie"), str(args.rounds)])
        threaded_events = accesses_of(threaded)
        threaded_rows = kinds_of(madtrace, threaded, threaded_events, args.runs)
        sims = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", SIM, directory], capture_output=True,
                                 text=True, cwd=ROOT, check=True).stdout.split()
            sims.append((int(out[0]) / float(out[1]) / 1e6, int(out[2]) / float(out[3]) / 1e6))
        print(f"{what}: {events / 1e6:.1f} M accesses; {args.runs} runs, the median (min-max)")
        print(table("each kind, a whole command", rows,
                    ("kind", "s", "range", "M accesses/s", "peak RSS MB")))
        print(table(f"data_sharing {args.rounds} rounds, 3 threads, "
                    f"{threaded_events / 1e6:.1f} M accesses", threaded_rows,
                    ("kind", "s", "range", "M accesses/s", "peak RSS MB")))
        sim = statistics.median(s for s, _ in sims)
        oracle = statistics.median(o for _, o in sims)
        print(table("the cache simulation alone (this machine's caches)", [
            ("memory_sim.c", f"{sim:.1f}", f"{min(s for s, _ in sims):.1f}-{max(s for s, _ in sims):.1f}"),
            ("pycachesim (first 1 M accesses)", f"{oracle:.2f}",
             f"{min(o for _, o in sims):.2f}-{max(o for _, o in sims):.2f}")],
            ("simulator", "M accesses/s", "range")))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
