"""The tracer's cost per traced access with 1e3 .. 1e6
live heap blocks (bench/progs/live_blocks.c), which must not grow with the
number of blocks (flat within 30%).

Each size is recorded with ``--data --data-in steady -f steady``: build()
allocates N blocks (the allocation tracker sees every malloc; data accesses
are recorded only inside steady()), then steady() runs ROUNDS rounds of one
free, one malloc and an 8-node walk of the shuffled list.  The time per
access is steady()'s duration (its entry and exit call records, TSC) over the
accesses recorded inside it: everything the tracer does for those events
(faults, allocation and free events, naming each access with its block) is
in it.  The tracer's peak RSS shows what N live blocks cost it in memory."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from common import ROOT, table

SIZES = (1000, 10_000, 100_000, 1_000_000)
ROUNDS = 3000
REPEAT = int(os.environ.get("BENCH_REPEAT", "2"))
SOURCE = os.path.join(ROOT, "bench", "progs", "live_blocks.c")
BINARY = os.path.join(ROOT, "build", "bench", "live_blocks")
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
ENV = dict(os.environ, PYTHONPATH=ROOT)


def build() -> None:
    if not os.path.exists(BINARY) or os.path.getmtime(BINARY) < os.path.getmtime(SOURCE):
        os.makedirs(os.path.dirname(BINARY), exist_ok=True)
        subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", BINARY, SOURCE],
                       check=True)


def one_run(n: int) -> dict:
    from madtrace.trace.record_files import CALL_RECORDS
    from madtrace.trace.events import load_accesses
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t")
        run = subprocess.run([*MADTRACE, "record", "-q", "--no-store", "--data", "--data-in",
                              "steady", "-f", "steady", "-o", out, "--", BINARY, str(n),
                              str(ROUNDS)], capture_output=True, env=ENV)
        native = subprocess.run([BINARY, str(n), str(ROUNDS)], capture_output=True)
        if run.returncode != 0 or run.stdout != native.stdout:
            raise SystemExit(f"N={n}: failed or output differs: {run.stderr.decode()[-400:]}")
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        with open(os.path.join(out, "functions.json")) as f:
            hz = json.load(f)["tsc_hz"]
        records = np.concatenate([CALL_RECORDS.read(p)
                                  for p in glob.glob(os.path.join(out, "calls", "*.rec"))])
        accesses = np.concatenate(list(load_accesses(out).values()))
        inside = int(np.count_nonzero(accesses["seq"] == 1))   # after steady's entry record
        seconds = (int(records["tsc"][1]) - int(records["tsc"][0])) / hz
        return {"n": n, "accesses": inside, "seconds": seconds, "per_access": seconds / inside,
                "blocks": meta["data_tracing"]["allocations"],
                "rss": meta["tracer"]["peak_rss_bytes"],
                "run": meta["end_time"] - meta["start_time"]}


def main() -> int:
    build()
    rows, per = [], {}
    all_runs: dict[int, list[dict]] = {n: [] for n in SIZES}
    for _ in range(REPEAT):          # interleaved: a slow moment of the machine hits every size
        for n in SIZES:
            all_runs[n].append(one_run(n))
    for n in SIZES:
        runs = all_runs[n]
        best = min(runs, key=lambda r: r["per_access"])
        per[n] = best["per_access"]
        rows.append((f"{n:.0e}", best["blocks"], best["accesses"], f"{best['seconds']:.2f}",
                     f"{best['per_access'] * 1e6:.1f}",
                     f"{max(r['rss'] for r in runs) / 2**20:.0f}", f"{best['run']:.1f}"))
    print(table(f"live heap blocks vs cost per traced access (min of {REPEAT} runs, "
                f"{ROUNDS} steady rounds each)", rows,
                ("live blocks", "allocations", "accesses", "steady s", "us/access",
                 "tracer peak RSS MB", "whole run s")))
    spread = max(per.values()) / min(per.values())
    print(f"goal: per-access cost flat within 30% from 1e3 to 1e6 live blocks: "
          f"{'met' if spread <= 1.3 else 'NOT met'} (max/min = {spread:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
