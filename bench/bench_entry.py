# SPDX-License-Identifier: GPL-2.0-or-later
"""Function tracing with the hybrid data engine, this tree against a base tree
(calls through function tracing's trampolines must run the copies).

``madtrace record --data --data-engine hybrid`` (function tracing on, as by
default) of:

* the machine's python3 running a short script (python3 is stripped:
  every function it exports is patched at its entry), N iterations;
* tests/progs/data_calls at two call counts: bump() patched at its entry
  (its address is taken), scale() at its entry (``--method entry``) or at
  its call site (``auto``); its loop also calls strlen() through the PLT.

Each workload runs under the base tree and this one in turn (A B A B ...:
the machine's speed drifts under load, pairs keep the comparison fair), RUNS
times.  Reported per tree: median wall time, and from meta.json of the last
run: faults the fault loop handled, untraced faults (faults on protected
pages at bytes nobody traces: .got.plt beside .data), moves into copies
(a ptrace stop and Python work each), accesses on the fault path.  The
output must equal the native one.  The machine's floor (a ptrace stop, from
bench/ptrace_floor.c) and the load average are printed with the figures.

usage: bench_entry.py --base DIR [--runs N] [--python N] [--no-python] [--calls A,B]
  --base DIR: another checkout of madtrace, built (make setup), e.g. /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_data import ptrace_floor
from common import ROOT, prog, table

SCRIPT = "d = {}\nfor i in range(N):\n    d[str(i)] = i * i\nprint(sum(len(k) + v % 7 for k, v in d.items()))\n"


def madtrace_of(tree: str) -> tuple[list[str], dict]:
    python = os.path.join(tree, ".venv", "bin", "python")
    return [python if os.path.exists(python) else sys.executable, "-m", "madtrace.cli.main"], \
        dict(os.environ, PYTHONPATH=tree)


def one_run(tree: str, argv: list[str], options: list[str], out: str, expected: bytes) -> dict:
    cmd, env = madtrace_of(tree)
    t0 = time.perf_counter()
    r = subprocess.run([*cmd, "record", "-q", "--data", "--data-engine", "hybrid", "--no-store",
                        "-o", out, *options, "--", *argv], capture_output=True, env=env, timeout=3600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(argv)}: exit {r.returncode}: "
                         f"{r.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
    if r.stdout != expected:
        raise SystemExit(f"{tree}: {' '.join(argv)}: output differs from the native run")
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    data = meta["data_tracing"]
    paths = data["paths"]
    rewriter = paths["rewriter"]
    return {"wall": wall, "faults": data["faults"], "untraced": data["untraced_faults"],
            "moved": rewriter.get("moved", 0) + rewriter.get("moved to a plt replacement", 0),
            "fault path": paths["accesses_by_path"]["fault"],
            "probe path": paths["accesses_by_path"]["probe"]}


def compare(name: str, argv: list[str], options: list[str], trees: dict[str, str], runs: int,
            tmp: str) -> list[tuple]:
    expected = subprocess.run(argv, capture_output=True, timeout=600).stdout
    results: dict[str, list[dict]] = {label: [] for label in trees}
    for i in range(runs):
        for label, tree in trees.items():
            out = tempfile.mkdtemp(prefix=f"{label}{i}-", dir=tmp)
            os.rmdir(out)
            results[label].append(one_run(tree, argv, options, out, expected))
            print(f"  {name} {label} run {i + 1}: {results[label][-1]['wall']:.1f} s", file=sys.stderr)
    rows = []
    for label, got in results.items():
        last = got[-1]
        rows.append((name, label, f"{statistics.median(r['wall'] for r in got):.2f}",
                     f"{min(r['wall'] for r in got):.2f}", last["faults"], last["untraced"],
                     last["moved"], last["fault path"], last["probe path"]))
    base, this = (statistics.median(r["wall"] for r in results[label]) for label in trees)
    rows.append((name, "base/this", f"{base / this:.2f}x", "", "", "", "", "", ""))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--python", type=int, default=10000, help="iterations of the script")
    parser.add_argument("--no-python", action="store_true")
    parser.add_argument("--calls", default="2000,20000")
    args = parser.parse_args()
    trees = {"base": os.path.abspath(args.base), "this": ROOT}
    rows: list[tuple] = []
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-entry-") as tmp:
        floor = ptrace_floor(tmp)
        for calls in args.calls.split(","):
            for method in ("entry", "auto"):
                rows += compare(f"data_calls {calls} --method {method}",
                                [prog("data_calls", "O2-nopie"), calls], ["--method", method],
                                trees, args.runs, tmp)
        if not args.no_python:
            script = os.path.join(tmp, "script.py")
            with open(script, "w") as f:
                f.write(SCRIPT.replace("range(N)", f"range({args.python})"))
            rows += compare(f"python3 -S script ({args.python})", ["/usr/bin/python3", "-S", script],
                            [], trees, args.runs, tmp)
    print(table("record --data --data-engine hybrid, functions traced: base against this tree",
                rows, ("workload", "tree", "wall s (median)", "min", "faults", "untraced faults",
                       "moves", "fault-path accesses", "probe-path accesses")))
    if floor:
        print(f"machine floor: a ptrace stop {floor[0]:.1f} us, with the fault loop's requests "
              f"{floor[1]:.1f} us; a fault handled in the process {floor[2]:.1f} us")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
