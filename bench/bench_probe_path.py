# SPDX-License-Identifier: GPL-2.0-or-later
"""Where the hybrid data engine's probe path spends its time.

Each program runs at two lengths (difference method: start-up and write-out
cancel), untraced and under ``madtrace record --data --data-engine hybrid``,
alternating the variants run by run so that the machine's load falls on all
of them alike.  Per access (the difference over the accesses recorded):

* ``native``: the program alone (its own loads, cache and TLB misses): the
  floor of any recorder on this machine;
* ``wall``: the hybrid engine's wall time;
* ``cpu``: the CPU time of tracer and target together (user + system of the
  madtrace process tree): what the machine pays, whatever the other core does;
* with ``perf`` (software event cpu-clock; these VMs have no hardware
  counters), the CPU split by where it is spent, again by difference of the
  two lengths: ``target:copies`` (the relocated code: the program's own work,
  the probes and the probes' waits on a full ring), ``target:kernel``
  (faults, page-table work of the alias), and the tracer's side: ``drain:C``
  (the ring drain, the compaction and the block index, in C),
  ``drain:zstd``, ``drain:python`` (the interpreter, numpy, ctypes),
  ``drain:kernel`` (writes, wake-ups).

``--baseline DIR``: also runs the madtrace of another source tree (built:
build/native, build/injector) in the same alternation, for before/after
tables.  ``--runs N`` (default 5; min and median are printed), ``--quick``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, prog, table

QUICK = "--quick" in sys.argv


def _arg(name: str, default: str | None) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


RUNS = 1 if QUICK else int(_arg("--runs", "5") or 5)
BASELINE = _arg("--baseline", None)
PROGRAMS = (("list walk", "bench_data_list", ["20", "4096"], ["2000", "4096"]),
            ("array passes", "bench_data_memory", ["20", "4096"], ["2000", "4096"]))
PERF = shutil.which("perf")
PERF_HZ = 4000


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list, env: dict, cwd: str) -> tuple[subprocess.CompletedProcess, float, float]:
    before = _children_cpu()
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, env=env, cwd=cwd, timeout=1800)
    return r, time.perf_counter() - t0, _children_cpu() - before


def classify(comm: str, dso: str) -> str:
    target = not comm.startswith(("python", "madtrace"))
    if target:
        if "madtrace-copies" in dso:
            return "target:copies"
        return "target:kernel" if "kernel" in dso else "target:other"
    if "kernel" in dso:
        return "drain:kernel"
    if "libarrow" in dso or "zstd" in dso:
        return "drain:zstd"
    if any(k in dso for k in ("libmtloop", "libmtdrain", "libmtblocks")):
        return "drain:C"
    return "drain:python"


def perf_split(data: str) -> dict:
    """CPU seconds per class of classify(), from a perf.data file (cpu-clock
    sampled at PERF_HZ: one sample stands for 1/PERF_HZ s)."""
    out = subprocess.run(["perf", "report", "-i", data, "-n", "--sort", "comm,dso", "--stdio"],
                         capture_output=True, text=True).stdout
    split: dict = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or line.startswith("#") or not parts[1].isdigit():
            continue
        key = classify(parts[2], parts[3])
        split[key] = split.get(key, 0.0) + int(parts[1]) / PERF_HZ
    return split


class Variant:
    def __init__(self, name: str, root: str):
        self.name = name
        self.root = root
        self.env = dict(os.environ, PYTHONPATH=root)

    def record(self, argv: list, out: str, perf: str | None):
        cmd = [sys.executable, "-m", "madtrace.cli.main", "record", "-q", "--data",
               "--no-functions", "--no-store", "--data-engine", "hybrid", "-o", out, "--", *argv]
        if perf:
            cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ), "-o", perf, "--", *cmd]
        return timed(cmd, self.env, tempfile.gettempdir())


def accesses_of(out: str) -> tuple[int, int]:
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    paths = (meta.get("data_tracing") or {}).get("paths") or {}
    total = sum(c["L"] + c["S"] for c in meta.get("accesses", {}).values())
    return total, int(paths.get("ring_waits", 0))


def main() -> int:
    variants = [Variant("this tree", ROOT)]
    if BASELINE:
        variants.insert(0, Variant(f"baseline {BASELINE}", os.path.abspath(BASELINE)))
    t0 = time.perf_counter()
    rows, split_rows = [], []
    micro_rows = []
    for v in variants:          # the probe's own instructions (probe_micro.py)
        r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "probe_micro.py")],
                           capture_output=True, text=True, env=v.env, timeout=600)
        try:
            m = json.loads(r.stdout)
            micro_rows.append((v.name, f"{m['floor_ns']:.2f}", f"{m['probe_ns']:.2f}",
                               f"{m['probe_ns'] - m['floor_ns']:.2f}", m["probe_bytes"]))
        except (ValueError, KeyError):
            micro_rows.append((v.name, "failed", r.stdout.strip()[-80:], r.stderr.strip()[-80:], ""))
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-probe-") as tmp:
        for label, name, small, large in PROGRAMS:
            exe = prog(name, "O2-nopie")
            argvs = {"small": [exe, *small], "large": [exe, *large]}
            expected = {k: subprocess.run(a, capture_output=True).stdout for k, a in argvs.items()}
            native = {k: [] for k in argvs}
            got: dict = {(v.name, k): [] for v in variants for k in argvs}
            splits: dict = {(v.name, k): [] for v in variants for k in argvs}
            counts: dict = {}
            for run in range(RUNS):
                for k, argv in argvs.items():
                    native[k].append(timed(argv, os.environ, tmp)[1])
                for v in variants:
                    for k, argv in argvs.items():
                        out = os.path.join(tmp, f"out-{run}-{k}")
                        perf = os.path.join(tmp, "perf.data") if PERF and run == 0 else None
                        r, wall, cpu = v.record(argv, out, perf)
                        if r.returncode != 0 or r.stdout != expected[k]:
                            err = r.stderr.decode(errors="replace").strip().splitlines()
                            print(f"{v.name} {label} {k}: exit {r.returncode} or output differs: "
                                  f"{err[-1] if err else ''}", file=sys.stderr)
                            return 1
                        counts[(v.name, k)] = accesses_of(out)
                        got[(v.name, k)].append((wall, cpu))
                        if perf:
                            splits[(v.name, k)].append(perf_split(perf))
                            os.unlink(perf)
                        shutil.rmtree(out, ignore_errors=True)
            for v in variants:
                n = counts[(v.name, "large")][0] - counts[(v.name, "small")][0]
                small, large = got[(v.name, "small")], got[(v.name, "large")]

                def per(f, xs, ys, n=n):    # (f of the long runs - f of the short runs) / accesses
                    return (f(ys) - f(xs)) / n * 1e9
                nat = per(min, native["small"], native["large"])
                rows.append((label, v.name, n, f"{nat:.1f}",
                             f"{per(min, [w for w, _ in small], [w for w, _ in large]):.0f}",
                             f"{per(statistics.median, [w for w, _ in small], [w for w, _ in large]):.0f}",
                             f"{per(min, [c for _, c in small], [c for _, c in large]):.0f}",
                             f"{per(statistics.median, [c for _, c in small], [c for _, c in large]):.0f}",
                             counts[(v.name, "large")][1]))
                if splits[(v.name, "large")]:
                    big, little = splits[(v.name, "large")][0], splits[(v.name, "small")][0]
                    for key in sorted(set(big) | set(little)):
                        ns = (big.get(key, 0.0) - little.get(key, 0.0)) / n * 1e9
                        split_rows.append((label, v.name, key, f"{ns:.1f}"))
    print(table("the probe alone (probe_micro.py: a load in a loop over 64 KiB, relocated with a "
                "probe, in one process; no drain, the ring never full; min of 7)", micro_rows,
                ("madtrace", "loop ns/access", "with probe", "probe ns", "probe+copy bytes")))
    print(table(f"ns per access: (min or median of the long runs - the same of the short runs) / "
                f"accesses ({RUNS} runs each, alternating)",
                rows, ("program", "madtrace", "accesses (diff)", "native min", "wall min",
                       "wall median", "cpu min", "cpu median", "ring waits (long run)")))
    if split_rows:
        print(table("CPU ns per access by where it is spent (perf cpu-clock, first run, "
                    "difference of the two lengths)", split_rows,
                    ("program", "madtrace", "where", "cpu ns/access")))
    else:
        print("(perf not found: no split)")
    print(f"(bench took {time.perf_counter() - t0:.0f} s{', --quick: not a measurement' if QUICK else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
