# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's build on traces recorded before, side by side with another
checkout of madtrace (``--against``), interleaved run by run: the whole command
a user types the first time (``madtrace query DIR "SELECT 1"``: start-up, the
build, the trivial query), its wall time, events per second and peak RSS; the
store's size beside the raw capture's.

  python bench/bench_store_build.py DIR [DIR ...] [--runs 3] [--against TREE]

Each DIR is copied once into a scratch folder per checkout (the raw capture
only), so that neither build reads the other's store.  Events: the accesses and
call records of the trace.  ``--against TREE``: a checkout with its native parts
built (``make native`` there).
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

from common import ROOT, table

sys.path.insert(0, ROOT)


def events_of(directory: str) -> int:
    from madtrace.trace.record_files import CALL_RECORDS
    with open(os.path.join(directory, "meta.json")) as f:
        meta = json.load(f)
    accesses = sum(c["L"] + c["S"] for c in meta.get("accesses", {}).values())
    return accesses + sum(CALL_RECORDS.rows(p) for _, p in CALL_RECORDS.files(directory))


def size_of(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def build(tree: str, directory: str) -> tuple[float, int]:
    """(wall s, peak RSS MB) of the first query of ``directory`` with ``tree``'s madtrace."""
    shutil.rmtree(os.path.join(directory, "store"), ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run(["/usr/bin/time", "-f", "@@ %e %M", sys.executable, "-m",
                           "madtrace.cli.main", "query", directory, "SELECT 1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=tree)
    if done.returncode:
        raise SystemExit(f"the build failed ({tree}, {directory}):\n{done.stderr[-2000:]}")
    last = [line for line in done.stderr.splitlines() if line.startswith("@@ ")][-1].split()
    return float(last[1]), int(last[2]) // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", metavar="DIR")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", metavar="TREE", help="another checkout, built")
    args = parser.parse_args()
    trees = [("this tree", ROOT)] + ([("against", os.path.abspath(args.against))]
                                     if args.against else [])
    work = tempfile.mkdtemp(prefix="madtrace-store-build-")
    rows = []
    try:
        for trace in args.traces:
            copies = {}
            for label, _tree in trees:
                copy = os.path.join(work, label.replace(" ", "-"), os.path.basename(trace))
                shutil.copytree(trace, copy, ignore=shutil.ignore_patterns("store"))
                copies[label] = copy
            events = events_of(trace)
            raw = size_of(os.path.join(trace, "data")) + size_of(os.path.join(trace, "calls"))
            times: dict[str, list[tuple[float, int]]] = {label: [] for label, _ in trees}
            for _ in range(args.runs):
                for label, tree in trees:
                    times[label].append(build(tree, copies[label]))
            for label, _tree in trees:
                walls = sorted(t for t, _ in times[label])
                wall = statistics.median(walls)
                stored = size_of(os.path.join(copies[label], "store"))
                rows.append((os.path.basename(trace), label, f"{events / 1e6:.1f}",
                             f"{wall:.2f} ({walls[0]:.2f}-{walls[-1]:.2f})",
                             f"{events / wall / 1e6:.1f}",
                             f"{statistics.median(m for _, m in times[label])}",
                             f"{stored / 1e6:.0f} MB, {stored / raw:.2f}x"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(f"the store's build: the first `madtrace query DIR \"SELECT 1\"`, {args.runs} runs "
                "interleaved, the median (min-max)", rows,
                ("trace", "madtrace", "M events", "s", "M events/s", "peak RSS MB",
                 "store, x raw")))


if __name__ == "__main__":
    main()
