# SPDX-License-Identifier: GPL-2.0-or-later
"""Memory of the footprint analysis (Skadu's SlimTV, madtrace/analysis/footprint.c)
against the naive set-per-call replay, on one synthetic trace, side by side.

The trace (written here, in madtrace's trace directory format): one thread,
PHASES top-level calls of `phase`, each making CALLS calls of `work`, each of
which calls `leaf` once; the calls make ACCESSES 8-byte loads and stores in
all, sliding over a REGION-byte array (so footprints overlap across calls and
phases, and every level has its own set in the naive replay).  Each analysis
runs in its own process: peak RSS (ru_maxrss), and what the analysis itself
held at its peak (the C core's shadow and stack; tracemalloc's peak for the
naive sets), and the time.  A third process only reads and segments the trace
(the floor both share).  The two analyses' results are compared: equal.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np

from common import ROOT, table

PHASES, CALLS = 8, 250
ACCESSES = 400_000
REGION = 1 << 20          # 1 MiB touched in all
BASE_RSP = 0x7FFF0000


def write_trace(directory: str) -> None:
    from madtrace.trace.format import ACCESS_DTYPE, FORMAT_VERSION, RECORD_DTYPE
    from madtrace.trace.record_files import ACCESS_RECORDS, CALL_RECORDS
    os.makedirs(os.path.join(directory, "calls"))
    os.makedirs(os.path.join(directory, "data"))
    names = ["phase", "work", "leaf"]
    with open(os.path.join(directory, "functions.json"), "w") as f:
        json.dump({"timestamps": False, "tsc_hz": None,
                   "sites": [{"sid": i, "function": n, "kind": "call", "address": 0,
                              "caller": "main"} for i, n in enumerate(names)],
                   "functions": [{"fid": i, "name": n, "method": "callsite"}
                                 for i, n in enumerate(names)]}, f)
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump({"format_version": FORMAT_VERSION, "command": ["synthetic"], "outcome": "exited",
                   "data_tracing": {"regions": [[0x10000000, 0x10000000 + REGION, "[heap]"]]}}, f)
    records: list[tuple[int, int, int]] = []
    # call structure: record index of each work/leaf call's accesses
    per_leaf = ACCESSES // (PHASES * CALLS * 2)       # half in work, half in leaf
    rng = np.random.default_rng(7)
    acc_chunks = []
    position = 0

    def accesses(count: int, seq: int) -> None:
        nonlocal position
        a = np.zeros(count, dtype=ACCESS_DTYPE)
        offsets = (position + np.arange(count) * 8 + rng.integers(0, 4096, count)) % REGION
        a["addr"] = 0x10000000 + (offsets & ~np.int64(7))
        a["size"], a["kind"], a["seq"] = 8, 1 + (np.arange(count) % 2), seq
        position = (position + count * 4) % REGION
        acc_chunks.append(a)

    for _ in range(PHASES):
        records.append((0, 0 << 1, BASE_RSP - 256))
        for _ in range(CALLS):
            records.append((0, 1 << 1, BASE_RSP - 512))
            accesses(per_leaf, len(records))
            records.append((0, 2 << 1, BASE_RSP - 768))
            accesses(per_leaf, len(records))
            records.append((0, 2 << 1 | 1, BASE_RSP - 768))
            records.append((0, 1 << 1 | 1, BASE_RSP - 512))
        records.append((0, 0 << 1 | 1, BASE_RSP - 256))
    rec = np.array(records, dtype=RECORD_DTYPE)
    CALL_RECORDS.write(os.path.join(directory, "calls", "1.rec"), rec)
    acc = np.concatenate(acc_chunks)
    acc["order"] = np.arange(len(acc))
    ACCESS_RECORDS.write(os.path.join(directory, "data", "1.acc"), acc)


CHILD = r"""
import json, resource, sys, time, tracemalloc
sys.path.insert(0, {root!r})
directory, which = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if which == "slimtv":
    from madtrace.analysis.footprint import footprint
    r = footprint(directory, keep_calls=True)
    held = r.peak_memory
    result = {{str(int(x["call_id"])): [list(map(int, x["incl"])), list(map(int, x["self"]))]
              for rows in r.all_calls.values() for x in rows}}
elif which == "naive":
    from madtrace.analysis.footprint_naive import naive_footprint
    tracemalloc.start()
    n = naive_footprint(directory)
    held = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    result = {{str(c): [list(v[0]), list(v[1])] for calls in n.values() for c, v in calls.items()
              if c >= 0}}
else:
    from madtrace.trace.segmentation import iter_thread_chunks
    for chunk in iter_thread_chunks(directory):
        pass
    held, result = 0, {{}}
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"rss": rss, "held": held, "seconds": seconds, "result": result}}))
"""


def run(directory: str, which: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT), directory, which],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-fp-") as tmp:
        directory = os.path.join(tmp, "trace")
        write_trace(directory)
        floor = run(directory, "read")
        slim = run(directory, "slimtv")
        naive = run(directory, "naive")
    same = slim["result"] == naive["result"]
    mib = 1 << 20
    rows = [(name, f"{r['rss'] / mib:.1f}", f"{(r['rss'] - floor['rss']) / mib:.1f}",
             f"{r['held'] / mib:.1f}", f"{r['seconds']:.2f}")
            for name, r in (("read+segment only", floor), ("footprint (SlimTV, C)", slim),
                            ("naive set per call", naive))]
    print(table(f"footprint analysis of {ACCESSES} accesses, {PHASES * CALLS * 2 + PHASES} "
                f"calls, {REGION >> 20} MiB touched (one synthetic trace)", rows,
                ("analysis", "peak RSS MiB", "above floor MiB", "held MiB", "seconds")))
    print(f"naive / SlimTV: peak RSS {naive['rss'] / slim['rss']:.1f}x (above the read+segment "
          f"floor: {(naive['rss'] - floor['rss']) / mib:.0f} vs "
          f"{max(slim['rss'] - floor['rss'], 0) / mib:.0f} MiB), "
          f"held {naive['held'] / max(slim['held'], 1):.1f}x, time "
          f"{naive['seconds'] / slim['seconds']:.1f}x; results equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
