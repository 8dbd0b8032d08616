# SPDX-License-Identifier: GPL-2.0-or-later
"""Function tracing benchmark: overhead per traced call, in ns.

tests/progs/bench_calls.c (O2, PIE) calls the tiny function leaf() N times,
each through a wrapper, with a real call.  Each configuration runs at two
sizes N1 < N2 and the per-call cost is (t(N2) - t(N1)) / (N2 - N1), where t
is the wall time of the whole command (median of REPEAT runs; the runs of all
configurations are interleaved, so that a change in the machine's load
affects them alike), so that start-up (exec, symbol loading, patching,
attach, final drain and write-out at fixed cost) cancels:

* native: no tracer;
* uftrace: ``uftrace record --no-libcall -P leaf -d DIR`` (dynamic patching
  of leaf's entry, no -pg build; --no-libcall so that it traces leaf only);
* madtrace: ``madtrace record -q -f leaf -o DIR``, with timestamps and with
  ``--no-time``;
* the floor on this machine (bench/calls_floor.c, the same loop): the least
  any tracer writing madtrace's records must do per call, compiled into the
  caller itself (no trampoline, no saved register, no thread lookup): two
  16-byte records into a 4 MiB ring, with or without two rdtsc, and the same
  with a second thread writing the records to a file as they come (the
  records of a traced call must reach the trace directory: 32 bytes per call
  into the page cache).  A floor is a bound: it is timed by its best run,
  the tracers by their median run.  On these VMs, writing into memory the
  guest has not touched lately is far slower (the host hands the pages back
  to the guest one fault at a time), so runs that write records out vary
  from one to the next, floors included.

The per-call figures include everything the tracer does for a call,
including writing the records out; the trace directory is removed after
each run, outside the timing.  "loop ns/call" is the time the program's own
loop took per call at N2 (BENCH_CALLS_LOOP): how much slower the traced
program itself runs, start-up and the tracer's end left out.

Before timing, each tracer's trace is checked once: it must hold exactly N1
calls of leaf (and, for madtrace, no dropped events), and the program's output
must be the untraced one.

Goals: madtrace's overhead per call (over native) at most 1/6 of
uftrace's with timestamps, 1/20 with --no-time.  The floors show the best
ratio any tracer of these records could reach here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, prog, table

NATIVE_SIZES = (2_000_000, 20_000_000)
TRACED_SIZES = (1_000_000, 10_000_000)
REPEAT = 5
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
ENV = dict(os.environ, PYTHONPATH=ROOT, BENCH_CALLS_LOOP="1")
GOALS = {"madtrace": 6.0, "madtrace --no-time": 20.0}
# each madtrace configuration and the floors that bound it (in the target alone, whole)
FLOORS = {"madtrace": ("floor: records+rdtsc", "floor: records+rdtsc to file"),
          "madtrace --no-time": ("floor: records", "floor: records to file")}


class Unavailable(Exception):
    pass


def run(argv: list) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, env=ENV, timeout=600)


def native_cmd(binary, n, out):
    return [binary, str(n)]


def uftrace_cmd(binary, n, out):
    return ["uftrace", "record", "--no-libcall", "-P", "leaf", "-d", out, binary, str(n)]


def madtrace_cmd(extra):
    def cmd(binary, n, out):
        return [*MADTRACE, "record", "-q", *extra, "-o", out, "-f", "leaf", "--", binary, str(n)]
    return cmd


def floor_cmd(floor_binary, mode):
    def cmd(binary, n, out):
        return [floor_binary, mode, str(n), out]
    return cmd


def uftrace_check(out: str, n: int) -> None:
    r = run(["uftrace", "report", "-d", out, "--no-pager", "-F", "leaf"])
    for line in r.stdout.decode().splitlines():
        fields = line.split()
        if fields and fields[-1] == "leaf":
            calls = int(fields[-2])
            if calls != n:
                raise Unavailable(f"uftrace recorded {calls} calls of leaf, not {n}")
            return
    raise Unavailable(f"no leaf in uftrace's report: {r.stdout!r} {r.stderr!r}")


def madtrace_check(out: str, n: int) -> None:
    r = run([*MADTRACE, "summary", out, "--json"])
    if r.returncode != 0:
        raise Unavailable(r.stderr.decode().strip())
    s = json.loads(r.stdout)
    if s["calls"].get("leaf") != n or s["dropped_events"] != 0:
        raise Unavailable(f"madtrace recorded {s['calls'].get('leaf')} calls of leaf "
                          f"({s['dropped_events']} dropped), not {n}")


def floor_check(out: str, n: int) -> None:
    if os.path.exists(out) and os.path.getsize(out) != 32 * n:
        raise Unavailable(f"the floor wrote {os.path.getsize(out)} bytes, not {32 * n}")


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.unlink(path)


def loop_ns(stderr: bytes) -> float | None:
    m = re.search(rb"loop ([0-9.]+) ns/call", stderr)
    return float(m.group(1)) if m else None


class Config:
    def __init__(self, name, cmd, sizes, check, bound=False):
        """``bound``: a floor, timed by its best run (the least this machine needs),
        where the tracers are timed by their median run."""
        self.name, self.cmd, self.sizes, self.check = name, cmd, sizes, check
        self.stat = min if bound else statistics.median
        self.times = {n: [] for n in sizes}
        self.loops: list[float] = []
        self.failure: str | None = None

    def verify(self, binary, expected, tmp) -> None:
        """Correctness first, once, untimed."""
        out = os.path.join(tmp, "check")
        try:
            r = run(self.cmd(binary, self.sizes[0], out))
            if r.returncode != 0:
                raise Unavailable(r.stderr.decode().strip().splitlines()[-1] if r.stderr else
                                  f"exit status {r.returncode}")
            if r.stdout != expected[self.sizes[0]]:
                raise Unavailable(f"output differs from the untraced run: {r.stdout!r}")
            if self.check:
                self.check(out, self.sizes[0])
        except (Unavailable, subprocess.TimeoutExpired) as e:
            self.failure = str(e)
        finally:
            remove(out)

    def time_once(self, binary, tmp) -> None:
        for n in self.sizes:
            out = os.path.join(tmp, "out")
            t0 = time.perf_counter()
            r = run(self.cmd(binary, n, out))
            elapsed = time.perf_counter() - t0
            remove(out)
            if r.returncode != 0:
                self.failure = f"exit status {r.returncode} at N={n}"
                return
            self.times[n].append(elapsed)
            if n == self.sizes[1] and loop_ns(r.stderr) is not None:
                self.loops.append(loop_ns(r.stderr))

    def per_call(self) -> tuple[float, float, float]:
        """(t(N1), t(N2), ns per call)."""
        t1, t2 = (self.stat(self.times[n]) for n in self.sizes)
        return t1, t2, (t2 - t1) / (self.sizes[1] - self.sizes[0]) * 1e9


def build_floor(tmp: str) -> str | None:
    exe = os.path.join(tmp, "calls_floor")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls_floor.c")
    r = subprocess.run(["gcc", "-O2", "-fPIE", "-pie", "-pthread", "-o", exe, src],
                       capture_output=True)
    return exe if r.returncode == 0 else None


def main() -> int:
    binary = prog("bench_calls", "O2-pie")
    expected = {n: subprocess.run([binary, str(n)], capture_output=True, check=True).stdout
                for n in set(NATIVE_SIZES + TRACED_SIZES)}
    notes = []
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-") as tmp:
        configs = [Config("native", native_cmd, NATIVE_SIZES, None)]
        if shutil.which("uftrace"):
            configs.append(Config("uftrace", uftrace_cmd, TRACED_SIZES, uftrace_check))
        else:
            notes.append("uftrace: not installed (make deps installs it)")
        configs += [Config("madtrace", madtrace_cmd([]), TRACED_SIZES, madtrace_check),
                    Config("madtrace --no-time", madtrace_cmd(["--no-time"]), TRACED_SIZES,
                           madtrace_check)]
        floor = build_floor(tmp)
        if floor:
            configs += [Config(name, floor_cmd(floor, mode), TRACED_SIZES, floor_check, bound=True)
                        for name, mode in (("floor: records", "writes"),
                                           ("floor: records+rdtsc", "writes-tsc"),
                                           ("floor: records to file", "file"),
                                           ("floor: records+rdtsc to file", "file-tsc"))]
        else:
            notes.append("floor: bench/calls_floor.c does not build")
        for c in configs:
            c.verify(binary, expected, tmp)
        live = [c for c in configs if not c.failure]
        for _ in range(REPEAT):
            for c in live:
                if not c.failure:
                    c.time_once(binary, tmp)
    per_call: dict = {}
    rows = []
    for c in configs:
        if c.failure:
            rows.append((c.name, "-", "-", "-", "-", "failed"))
            notes.append(f"{c.name}: {c.failure}")
            continue
        t1, t2, ns = c.per_call()
        per_call[c.name] = ns
        loop = f"{c.stat(c.loops):.1f}" if c.loops else "-"
        rows.append((c.name, f"{c.sizes[0]}/{c.sizes[1]}", f"{t1 * 1e3:.1f}", f"{t2 * 1e3:.1f}",
                     f"{ns:.1f}", loop))
    print(table(f"per-call cost of tracing leaf(), ns (median of {REPEAT}, floors: best of "
                f"{REPEAT}; differenced)",
                rows, ("tracer", "N1/N2", "t(N1) ms", "t(N2) ms", "ns/call", "loop ns/call")))
    for note in notes:
        print(f"  {note}")
    native = per_call.get("native", 0.0)
    overhead = {name: ns - native for name, ns in per_call.items() if name != "native"}
    uftrace = overhead.get("uftrace")
    ratio_rows = [(name, f"{over:.1f}", f"{uftrace / over:.2f}x" if uftrace and over > 0 else "-")
                  for name, over in overhead.items()]
    print(table("overhead per call over native, ns, and uftrace's overhead / this", ratio_rows,
                ("tracer", "overhead ns", "uftrace/this")))
    if uftrace:
        print("goals (uftrace's overhead / madtrace's):")
        for name, goal in GOALS.items():
            if name not in overhead:
                continue
            got = uftrace / overhead[name]
            bounds = [f"{f}: {uftrace / overhead[f]:.1f}x" for f in FLOORS[name]
                      if overhead.get(f, 0) > 0]
            print(f"  {name}: {got:.2f}x, goal >= {goal:g}x: {'MET' if got >= goal else 'not met'}"
                  f"  (best possible here, {'; '.join(bounds) or 'floor not measured'})")
    return 1 if any(c.failure for c in configs) else 0


if __name__ == "__main__":
    sys.exit(main())
