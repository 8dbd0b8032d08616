# SPDX-License-Identifier: GPL-2.0-or-later
"""The trace store: events written per second and peak memory, for a synthetic
stream (100 M events by default), side by side in one run:

  spool read      reading the raw capture (calls/*.rec, data/*.acc) in chunks:
                  the floor for everything below
  store           every table, as the first query builds them (one
                  segmentation pass: records, calls, access rows and names)
  query           `SELECT function, count(*) ... GROUP BY` over calls and
                  over accesses with DuckDB (madtrace query's path)

The spool is generated in chunks (bounded memory): threads that call a(),
which calls b() (two accesses) and c() (one access), over and over: 6 call
records and 3 accesses per round.  Each phase runs in its own process, so
its peak RSS is its own.

  python bench/bench_store.py [--events N] [--threads T] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from common import ROOT, table

sys.path.insert(0, ROOT)

ROUND_RECORDS = 6
ROUND_ACCESSES = 3
CHUNK_ROUNDS = 1 << 18
DATA_BASE = 0x7F0000000000
DATA_SIZE = 1 << 24
CODE_BASE = 0x7E0000000000


def generate(directory: str, events: int, threads: int, accesses_per_round: int = ROUND_ACCESSES
             ) -> tuple[int, int]:
    """A trace directory with ``events`` call records and accesses in all
    (``accesses_per_round`` 0: call records only, as with function tracing alone)."""
    from madtrace.trace.format import ACCESS_DTYPE, FORMAT_VERSION, RECORD_DTYPE
    from madtrace.trace.record_files import ACCESS_RECORDS, CALL_RECORDS
    os.makedirs(os.path.join(directory, "calls"))
    os.makedirs(os.path.join(directory, "data"))
    sites = [{"sid": i, "function": f, "kind": "call", "address": 0x1000 + i, "caller": "main"}
             for i, f in enumerate(["a", "b", "c"])]
    with open(os.path.join(directory, "functions.json"), "w") as f:
        json.dump({"timestamps": True, "tsc_hz": 2.5e9, "sites": sites, "functions": []}, f)
    with open(os.path.join(directory, "maps.end.txt"), "w") as f:
        f.write(f"{DATA_BASE:x}-{DATA_BASE + DATA_SIZE:x} rw-p 00000000 00:00 0\n")
    with open(os.path.join(directory, "meta.json"), "w") as f:
        json.dump({"format_version": FORMAT_VERSION, "command": ["synthetic"], "outcome": "exited"}, f)
    # one round: E a, E b, [2 accesses], X b, E c, [1 access], X c, X a
    codes = np.array([0, 2, 3, 4, 5, 1], dtype=np.uint32)
    rsps = np.array([1000, 900, 900, 900, 900, 1000], dtype=np.uint32)
    acc_seq = np.array([2, 2, 4], dtype=np.uint64)[:accesses_per_round]   # records before each
    rng = np.random.default_rng(7)
    rounds_total = events // (ROUND_RECORDS + accesses_per_round)
    records = accesses = 0
    for t in range(threads):
        tid = 1000 + t
        rounds = rounds_total // threads
        rec = CALL_RECORDS.create(os.path.join(directory, "calls", f"{tid}.rec"))
        acc = ACCESS_RECORDS.create(os.path.join(directory, "data", f"{tid}.acc"))
        try:
            done = 0
            while done < rounds:
                n = min(CHUNK_ROUNDS, rounds - done)
                r = np.zeros(n * ROUND_RECORDS, dtype=RECORD_DTYPE)
                r["code"] = np.tile(codes, n)
                r["rsp"] = np.tile(rsps, n)
                r["tsc"] = (done * ROUND_RECORDS + np.arange(len(r), dtype=np.uint64)) * 40
                a = np.zeros(n * accesses_per_round, dtype=ACCESS_DTYPE)
                first_record = (done + np.arange(n, dtype=np.uint64)) * ROUND_RECORDS
                a["seq"] = (first_record[:, None] + acc_seq[None, :]).ravel()
                a["order"] = np.arange(len(a), dtype=np.uint64) + done * accesses_per_round
                a["rip"] = CODE_BASE + rng.integers(0, 64, len(a)).astype(np.uint64) * 4
                a["addr"] = DATA_BASE + rng.integers(0, DATA_SIZE // 8, len(a)).astype(np.uint64) * 8
                a["size"] = 8
                a["kind"] = 1 + (np.arange(len(a)) % 2)
                a["first"] = 1
                CALL_RECORDS.append(rec, r)
                if len(a):
                    ACCESS_RECORDS.append(acc, a)
                done += n
                records += len(r)
                accesses += len(a)
        finally:
            os.close(rec)
            os.close(acc)
    return records, accesses


# ------------------------------------------------------------------ phases
def phase_spool(directory: str) -> dict:
    from madtrace.trace.reader import iter_access_chunks, iter_call_chunks
    _started()
    n = 0
    for _, chunk in iter_call_chunks(directory):
        n += len(chunk)
    for _, chunk in iter_access_chunks(directory):
        n += int(chunk["seq"][-1] >= 0) and len(chunk)
    return {"events": n}


def phase_final(directory: str) -> dict:
    from madtrace.trace.format import write_store_meta
    from madtrace.trace.store_tables import write_final_tables
    _started()
    rows = write_final_tables(directory)
    write_store_meta(directory, {"complete": True, "rows": rows, "timestamps": True,
                                 "tsc_hz": 2.5e9})
    return {"events": rows["records"] + rows["access_rows"], "rows": rows,
            "written": rows["records"] + rows["calls"] + rows["access_rows"]}


def phase_query(directory: str) -> dict:
    import duckdb  # noqa: F401
    from madtrace.trace.query import connect
    _started()
    con = connect(directory)
    calls = con.execute("SELECT function, count(*), sum(accesses_self) FROM calls "
                        "GROUP BY 1 ORDER BY 1").fetchall()
    accesses = con.execute("SELECT function, count(*) FROM accesses GROUP BY 1 "
                           "ORDER BY 1").fetchall()
    return {"events": sum(r[1] for r in calls) * 2 + sum(r[1] for r in accesses),
            "calls": [list(map(str, r)) for r in calls]}


_start = [0.0, 0.0]


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, it does not carry the
    peak of the parent that forked it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _started() -> None:
    """The phase's work starts now (its imports are done): time and RSS so far."""
    _start[:] = [time.perf_counter(), peak_rss_mb()]


PHASES = {"spool": phase_spool, "final": phase_final, "query": phase_query}


def run_phase(name: str, directory: str) -> dict:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--phase", name, directory],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"phase {name} failed:\n{out.stderr}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - start
    return result


def bench_stream(directory: str, kind: str, events: int, threads: int, per_round: int) -> None:
    t0 = time.perf_counter()
    records, accesses = generate(directory, events, threads, per_round)
    what = "call records and accesses" if per_round else "call records only (function tracing)"
    print(f"\n{kind}: {records + accesses} events, {what}: {records} call records, {accesses} "
          f"accesses, {threads} threads (generated in {time.perf_counter() - t0:.1f} s)",
          flush=True)
    rows = []
    for name, label in (("spool", "spool read"), ("final", "store"), ("query", "query")):
        r = run_phase(name, directory)
        written = r.get("written", 0)
        rows.append((label, r["events"], written, f"{r['seconds']:.2f}",
                     f"{r['events'] / r['seconds'] / 1e6:.1f}",
                     f"{written / r['seconds'] / 1e6:.1f}" if written else "-",
                     f"{r['import_rss_mb']:.0f}", f"{r['peak_rss_mb']:.0f}"))
    store_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                      os.walk(os.path.join(directory, "store")) for f in fs)
    spool_bytes = sum(os.path.getsize(os.path.join(d, f)) for sub in ("calls", "data")
                      for d, _, fs in os.walk(os.path.join(directory, sub)) for f in fs)
    print(table(f"trace store, {kind} stream (each phase its own process; events: call records "
                "and accesses it handles; rows: Parquet rows it writes)", rows,
                ("phase", "events", "rows", "s", "M events/s", "M rows/s", "RSS after imports MB",
                 "peak RSS MB")))
    print(f"spool {spool_bytes / 1e6:.0f} MB, store {store_bytes / 1e6:.0f} MB "
          f"({store_bytes / max(records + accesses, 1):.2f} bytes/event)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=float, default=100e6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    parser.add_argument("--only", choices=("mixed", "calls"),
                        help="one stream only (default: both)")
    parser.add_argument("--phase", nargs=2, metavar=("NAME", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        name, directory = args.phase
        result = PHASES[name](directory)
        result["seconds"] = time.perf_counter() - _start[0]
        result["import_rss_mb"] = _start[1]
        result["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(result))
        return 0
    base = args.keep or tempfile.mkdtemp(prefix="madtrace-bench-store-")
    try:
        for kind, per_round in (("mixed", ROUND_ACCESSES), ("calls", 0)):
            if args.only in (None, kind):
                bench_stream(os.path.join(base, kind), kind, int(args.events), args.threads,
                             per_round)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
