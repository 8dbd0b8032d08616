# SPDX-License-Identifier: GPL-2.0-or-later
"""The capture container's cost (trace/format.py): reading raw capture files
and recording, this tree against a base commit (default: main), side by side
in one run (A B A B ..., several runs, min and median).

  read      throughput of RecordFile.chunks over a large file of each kind,
            written as each side's writers write it: calls/<tid>.rec in
            1 MiB drain pieces (and in 64-record pieces: an idle drain's
            small chunks, the container's worst case), data/<tid>.acc in
            spool writes of 2^18 rows, data/<tid>.dat in compact blocks of
            2^17 records; page cache warm (the first run is not counted)
  record    `madtrace record` of a call-heavy program (bench_calls: 4 M call
            records) and of a data-heavy one (--data, bench_data_list): wall seconds

The base is extracted with `git archive` into a temporary directory; its ring
drain is compiled there (the rest of build/ is this tree's: the same sources).

  python bench/bench_capture_read.py [--base REF] [--runs N] [--record-runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, prog, table

GENERATE = r"""
import os, sys
import numpy as np
from madtrace.trace import format as F
from madtrace.trace import record_files as R
from madtrace.trace.compact import encode_block
kind, path, rows, piece = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
new = hasattr(F, "CAPTURE_MAGIC")
os.makedirs(os.path.dirname(path), exist_ok=True)
rng = np.random.default_rng(1)
if kind == "dat":
    dtype = F.COMPACT_DTYPE
    target = R.COMPACT_RECORDS if new else None
else:
    target = R.CALL_RECORDS if kind == "rec" else R.ACCESS_RECORDS
    dtype = target.dtype
fd = target.create(path, truncate=True) if new else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
done = 0
while done < rows:
    n = min(piece, rows - done)
    r = np.zeros(n, dtype=dtype)
    if kind == "dat":
        r["a"] = 0x7F0000000000 + rng.integers(0, 1 << 20, n).astype(np.uint64) * 8
        r["id"] = 1 + rng.integers(0, 50, n).astype(np.uint32)
        block = encode_block(r)
        if new:
            target.container().append_payload(fd, block)
        else:
            os.write(fd, block)
    else:
        r[r.dtype.names[0]] = np.arange(done, done + n)
        if new:
            target.append(fd, r)
        else:
            os.write(fd, r.tobytes())
    done += n
os.close(fd)
if kind == "dat":   # the instructions the compact records name
    from madtrace.trace.compact import write_instructions
    write_instructions(os.path.dirname(os.path.dirname(path)),
                       [[0] * 6] + [[0x1000 + i, 8, 1, 3, 1, 0] for i in range(50)], 3)
"""

READ = r"""
import sys, time
try:
    from madtrace.trace.record_files import ACCESS_RECORDS, CALL_RECORDS
except ImportError:                 # a tree whose format.py holds the record files
    from madtrace.trace.format import ACCESS_RECORDS, CALL_RECORDS
from madtrace.trace import compact  # noqa: F401 - imported before the clock starts, as
try:                                # the container's reader (a one-time cost of ~10 ms)
    from madtrace.trace import capture_file  # noqa: F401
except ImportError:
    pass
path = sys.argv[1]
files = CALL_RECORDS if path.endswith(".rec") else ACCESS_RECORDS
t0 = time.perf_counter()
n = sum(len(c) for c in files.chunks(path, 1 << 20))
print(time.perf_counter() - t0, n)
"""

# name, file kind, rows, rows per writer's piece
READS = [("calls .rec (1 MiB chunks)", "rec", 1 << 23, 1 << 16),
         ("calls .rec (64-record chunks)", "rec", 1 << 20, 64),
         ("accesses .acc", "acc", 1 << 21, 1 << 18),
         ("compact .dat", "dat", 1 << 22, 1 << 17)]


def extract_base(ref: str, where: str) -> str:
    base = os.path.join(where, "base")
    os.makedirs(base)
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
    shutil.copytree(os.path.join(ROOT, "build", "injector"), os.path.join(base, "build", "injector"))
    shutil.copytree(os.path.join(ROOT, "build", "native"), os.path.join(base, "build", "native"))
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Iinjector", "-o", "build/native/libmtdrain.so",
                    "madtrace/rings/ring_drain.c"], cwd=base, check=True)
    return base


def run_py(tree: str, code: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=tree)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                          capture_output=True, text=True, cwd=tree).stdout


def timed(tree: str, argv: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "madtrace.cli.main", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tree)
    return time.perf_counter() - t0


def stats(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="main")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--record-runs", type=int, default=3, help="0: no recording")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-capture-")
    try:
        trees = {"base": extract_base(args.base, work), "this": ROOT}
        rows_out = []
        for name, kind, rows, piece in READS:
            paths = {}
            for side, tree in trees.items():
                folder = "calls" if kind == "rec" else "data"
                paths[side] = os.path.join(work, side, kind, folder, f"1.{kind}")
                run_py(tree, GENERATE, kind, paths[side], str(rows), str(piece))
            times: dict[str, list[float]] = {"base": [], "this": []}
            for run in range(args.runs + 1):
                for side, tree in trees.items():
                    seconds, n = run_py(tree, READ, paths[side]).split()
                    if run:
                        times[side].append(float(seconds))
            mib = {s: os.path.getsize(p) / (1 << 20) for s, p in paths.items()}
            ratio = statistics.median(times["this"]) / statistics.median(times["base"])
            rows_out.append((name, f"{mib['base']:.0f} / {mib['this']:.1f}", stats(times["base"]),
                             stats(times["this"]),
                             f"{mib['this'] / statistics.median(times['this']):.0f}",
                             f"{ratio:.2f}"))
        print(table(f"reading raw capture files: {args.base} (base) vs this tree, {args.runs} runs, "
                    "seconds min / median", rows_out,
                    ("file", "MiB base/this", "base s", "this s", "this MiB/s", "this/base")))
        if not args.record_runs:
            return
        record = [("calls (bench_calls)", ["record", "-q", "--force", "-o", "{o}", "--", prog("bench_calls")]),
                  ("data (--data, bench_data_list)",
                   ["record", "-q", "--force", "--data", "-o", "{o}", "--", prog("bench_data_list")])]
        rows_out = []
        for name, argv in record:
            times = {"base": [], "this": []}
            for run in range(args.record_runs + 1):
                for side, tree in trees.items():
                    out = os.path.join(work, side, "trace")
                    seconds = timed(tree, [a.replace("{o}", out) for a in argv])
                    if run:
                        times[side].append(seconds)
            ratio = statistics.median(times["this"]) / statistics.median(times["base"])
            rows_out.append((name, stats(times["base"]), stats(times["this"]), f"{ratio:.3f}"))
        print(table(f"recording: {args.base} (base) vs this tree, {args.record_runs} runs, wall seconds "
                    "min / median", rows_out, ("recording", "base s", "this s", "this/base")))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
