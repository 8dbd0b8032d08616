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
