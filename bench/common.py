"""Shared helpers of the benchmarks: build check, timing, table printing."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "tests")
sys.path.insert(0, ROOT)
# the benches' own 'madtrace daemon' commands start no resident process on demand
# (each bench has runtime directories of its own: one would stay for minutes after
# it); bench_live.py measures the plain commands with it on, on purpose
os.environ.setdefault("MADTRACE_RESIDENT_IDLE", "0")


def prog(name: str, variant: str = "O2-pie") -> str:
    path = os.path.join(BUILD, f"{name}-{variant}")
    if not os.path.exists(path):
        subprocess.run(["make", "-C", ROOT, "-s", "programs"], check=True)
    return path


def best_of(fn, repeat: int = 5) -> float:
    """Median of ``repeat`` runs of fn() (seconds); fn does its own inner loop."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table(title: str, rows: list[tuple], headers: tuple) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    out = [f"== {title}", line.format(*headers)]
    out += [line.format(*map(str, row)) for row in rows]
    return "\n".join(out)


def side_by_side(title: str, intro: str, measures: dict, trees: list[str], results: str) -> None:
    """Each measure (name -> fn(tree) -> {what: count}) on each tree in turn,
    printed as it goes and written to bench/results/``results`` (Markdown)."""
    lines = [f"# {title}", "", intro, ""]
    for name, measure in measures.items():
        lines += [f"## {name}", ""]
        for tree in trees:
            result = measure(tree)
            print(f"{name} {tree}: {result}", flush=True)
            lines.append(f"- `{os.path.basename(os.path.abspath(tree))}`: " +
                         ", ".join(f"{k} {v}" for k, v in result.items()))
        lines.append("")
    path = os.path.join(ROOT, "bench", "results", results)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines))
