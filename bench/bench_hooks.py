# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine's hook stubs against its breakpoint hooks, side by side.

Per call (difference method: each loop at two lengths, the difference of the
median times over the difference of the calls, so that start-up, the first
faults of discovery and the write-out cancel), for tests/progs/hooks_churn's
loops of one kind of call:

* ``pairs``: malloc(48) and free (two hooked calls);
* ``copies``: memcpy of 64 bytes between two heap blocks (a Y event each);
* ``untraced``: memcpy of 64 bytes between two stack buffers (no event: the
  stub's page check, then the call);

under ``madtrace record --data --data-engine hybrid --no-functions`` with the
stubs (the default) and with ``MADTRACE_HOOK_STUBS=0`` (the breakpoint hooks:
two ptrace stops per call, one single-step), and natively.  Each run is timed
twice: wall clock, and CPU (user + system of madtrace and the program, from
getrusage of the children): on a VM shared with other jobs the CPU figure is
the steadier one.  Also the ptrace stops each run took (meta.json
``data_tracing``: ``faults`` + ``traps`` + the rewriter's ``moved``).

``--python``: the anchor, ``python3 -S`` on a 10 000-entry dict script,
``REPEAT`` runs of each configuration (alternating): whole-run wall and CPU, the
stops, the allocator and block-event calls.  That run takes minutes.

The stubs' own cost, without a tracer (hook_stubs_micro.py: the stubs in this
process in front of libc's functions, a ring nobody drains), REPEAT times.

``--quick``: one repetition, short loops (a smoke test, not a measurement).
Prints the load average with the results: these VMs are shared.
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

MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
QUICK = "--quick" in sys.argv
PYTHON = "--python" in sys.argv
REPEAT = 1 if QUICK else int(os.environ.get("REPEAT", "5"))
LENGTHS = (2000, 10000) if QUICK else (5000, 45000)
MODES = ("pairs", "copies", "untraced")
CONFIGS = {"native": None, "stubs": "1", "breakpoints": "0"}
PYTHON_SCRIPT = ("d = {}\nfor i in range(10000):\n    d[str(i)] = i * i\n"
                 "print(sum(len(k) + v % 7 for k, v in d.items()))\n")


def run(argv: list[str], stubs: str | None, work: str) -> tuple[float, float, dict, bytes]:
    """(wall s, CPU s, meta data_tracing or {}, stdout) of one run."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = os.path.join(work, "t")
    shutil.rmtree(out, ignore_errors=True)
    if stubs is not None:
        env["MADTRACE_HOOK_STUBS"] = stubs
        argv = [*MADTRACE, "record", "-q", "--data", "--data-engine", "hybrid", "--no-functions",
                "-o", out, "--", *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, env=env, timeout=3600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr[-500:]!r}")
    meta = {}
    if stubs is not None:
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)["data_tracing"]
    return wall, cpu, meta, result.stdout


def per_call(work: str) -> list[tuple]:
    rows = []
    for mode in MODES:
        samples = {(c, n): [] for c in CONFIGS for n in LENGTHS}
        stops = {}
        for _ in range(REPEAT):
            for config, stubs in CONFIGS.items():      # alternating, run by run
                for n in LENGTHS:
                    wall, cpu, meta, _ = run([prog("hooks_churn"), str(n), mode], stubs, work)
                    samples[(config, n)].append((wall, cpu))
                    if meta:
                        stops[(config, n)] = meta["faults"] + meta["traps"] + \
                            meta["paths"]["rewriter"].get("moved", 0)
        calls = (LENGTHS[1] - LENGTHS[0]) * (2 if mode == "pairs" else 1)
        for config in CONFIGS:
            per = []
            for k in (0, 1):    # wall, cpu
                lo = statistics.median(s[k] for s in samples[(config, LENGTHS[0])])
                hi = statistics.median(s[k] for s in samples[(config, LENGTHS[1])])
                per.append((hi - lo) / calls * 1e9)
            unit = per if mode != "pairs" else [2 * p for p in per]   # per malloc/free pair
            rows.append((mode, config, f"{unit[0]:,.0f}", f"{unit[1]:,.0f}",
                         " / ".join(str(stops.get((config, n), "-")) for n in LENGTHS)))
    return rows


def micro() -> list[tuple]:
    runs = []
    for _ in range(REPEAT):
        out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "hook_stubs_micro.py"),
                              "--json"], capture_output=True, check=True, timeout=600,
                             env=dict(os.environ, PYTHONPATH=ROOT)).stdout
        runs.append(json.loads(out))
    return [(what, f"{min(r[what] for r in runs):.1f}",
             f"{statistics.median(r[what] for r in runs):.1f}") for what in runs[0]]


def python_run(work: str) -> list[tuple]:
    script = os.path.join(work, "dict.py")
    with open(script, "w") as f:
        f.write(PYTHON_SCRIPT)
    argv = ["/usr/bin/python3", "-S", script]
    native = subprocess.run(argv, capture_output=True, timeout=60).stdout
    got: dict[str, list] = {c: [] for c in CONFIGS}
    for _ in range(max(REPEAT // 2, 1) if not QUICK else 1):
        for config, stubs in CONFIGS.items():
            wall, cpu, meta, out = run(argv, stubs, work)
            if out != native:
                raise SystemExit(f"python3 under {config}: output differs")
            got[config].append((wall, cpu, meta))
    rows = []
    for config, runs in got.items():
        meta = runs[-1][2]
        hooks = (meta.get("paths") or {}).get("hooks") or {}
        events = hooks.get("events", {})
        moved = ((meta.get("paths") or {}).get("rewriter") or {}).get("moved", "-")
        rows.append((config, " ".join(f"{w:.1f}" for w, _, _ in runs),
                     " ".join(f"{c:.1f}" for _, c, _ in runs),
                     meta.get("faults", "-"), meta.get("traps", "-"), moved,
                     events.get("alloc entries", "-"), events.get("mem entries", "-"),
                     meta.get("block_calls_redirected", "-")))
    return rows


def main() -> int:
    work = tempfile.mkdtemp(prefix="bench-hooks-")
    try:
        print(f"load average before: {os.getloadavg()}")
        if not PYTHON:
            print(table("the stubs alone, in one process (hook_stubs_micro.py), ns per call",
                        micro(), ("call", "min ns", "median ns")))
            print(table(f"ns per call (memcpy) or per malloc/free pair, median of {REPEAT}, "
                        f"{LENGTHS[0]} and {LENGTHS[1]} calls",
                        per_call(work),
                        ("loop", "hooks", "wall ns", "CPU ns", "stops (faults+traps+moved)")))
        else:
            print(table("python3 -S, a 10 000-entry dict script (whole run, each run)",
                        python_run(work),
                        ("hooks", "wall s", "CPU s", "faults", "traps", "moved", "allocator calls",
                         "memcpy & co. events", "redirected")))
        print(f"load average after: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
