# SPDX-License-Identifier: GPL-2.0-or-later
"""Data tracing benchmark: madtrace --data against valgrind lackey.

Two programs (O2, non-PIE):

* tests/progs/bench_data_compute.c: a Mandelbrot set computed in registers,
  one store per row to a global array (compute-heavy, few data accesses);
* tests/progs/bench_data_memory.c: passes over a global int array, one load
  and one store per element (memory-heavy).

Three measurements:

1. madtrace's cost per traced access: the memory-heavy program at two numbers
   of passes, the difference of the wall times (medians) divided by the
   difference of ``data_tracing.faults`` in meta.json (start-up and write-out
   cancel), and likewise per recorded access (sum of the ``accesses`` counts;
   an instruction that both loads and stores is one fault, two accesses);
2. whole-run wall time, native vs ``madtrace record -q --data --no-functions``
   vs ``valgrind --tool=lackey --trace-mem=yes`` (log to a file in a temporary
   directory), for both programs, and the ratio lackey / madtrace;
   the memory-heavy program also runs under lackey at both sizes, for lackey's
   own differenced cost per data access (its L/S/M lines, which also cover
   the stack and every other mapping);
3. the goals, computed from the figures above: compute-heavy at least
   50x faster than lackey, memory-heavy no slower than lackey, at most 10 us
   per access.

4. the floors on this machine (bench/ptrace_floor.c): a bare ptrace stop, a
   stop with the requests madtrace's fault loop makes, and a fault handled in
   the process itself with no tracer.

Before any timing each program's output under madtrace must equal its native
output (exit status 1 otherwise).  Whole-run ratios include the fixed start-up
of each tool (python, symbol loading, protection set-up; valgrind's own
start-up), so the compute-heavy ratio grows with the size of the run (it is
about lackey's time over madtrace's fixed cost, which the table prints).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import ROOT, prog, table

COMPUTE = ("bench_data_compute", ["300", "256"])       # native ~12 ms, lackey ~25 s
MEMORY_SIZES = (["2", "4096"], ["10", "4096"])          # passes, elements
REPEAT_NATIVE = 5
REPEAT_MADTRACE = 3
REPEAT_LACKEY = 3          # memory-heavy runs (about a second each)
REPEAT_LACKEY_COMPUTE = 1  # compute-heavy run (about 25 s)
GOAL_COMPUTE_RATIO = 50.0
GOAL_MEMORY_RATIO = 1.0
GOAL_US_PER_ACCESS = 10.0
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
ENV = dict(os.environ, PYTHONPATH=ROOT)


class Mismatch(Exception):
    pass


def run(argv: list) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, env=ENV, timeout=900)
    return r, time.perf_counter() - t0


def median(values: list) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


class Bench:
    def __init__(self, tmp: str):
        self.tmp = tmp
        self.counter = 0
        self.expected: dict = {}

    def _out(self, tag: str) -> str:
        self.counter += 1
        return os.path.join(self.tmp, f"{tag}.{self.counter}")

    def native(self, argv: list) -> float:
        times = []
        for _ in range(REPEAT_NATIVE):
            r, t = run(argv)
            if r.returncode != 0:
                raise Mismatch(f"{' '.join(argv)}: exit status {r.returncode}")
            self.expected[tuple(argv)] = r.stdout
            times.append(t)
        return median(times)

    def madtrace_once(self, argv: list) -> tuple[float, dict]:
        out = self._out("madtrace")
        r, t = run([*MADTRACE, "record", "-q", "--data", "--no-functions", "-o", out, "--", *argv])
        try:
            if r.returncode != 0:
                err = r.stderr.decode(errors="replace").strip().splitlines()
                raise Mismatch(f"madtrace --data {' '.join(argv)}: exit status {r.returncode}"
                               f" ({err[-1] if err else 'no message'})")
            if r.stdout != self.expected[tuple(argv)]:
                raise Mismatch(f"madtrace --data {' '.join(argv)}: output differs from the "
                               f"native one:\n  native:   {self.expected[tuple(argv)]!r}\n"
                               f"  madtrace: {r.stdout!r}")
            with open(os.path.join(out, "meta.json")) as f:
                meta = json.load(f)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        dt = meta.get("data_tracing") or {}
        return t, {"faults": dt.get("faults", 0), "fast_path": dt.get("fast_path", 0),
                   "untraced_faults": dt.get("untraced_faults", 0),
                   "accesses": sum(c.get("L", 0) + c.get("S", 0)
                                   for c in meta.get("accesses", {}).values())}

    def madtrace(self, argv: list) -> tuple[float, dict, list]:
        """Median time, counts of the last run, and notes if the counts varied."""
        times, seen = [], []
        for _ in range(REPEAT_MADTRACE):
            t, counts = self.madtrace_once(argv)
            times.append(t)
            seen.append(counts)
        notes = []
        if any(c != seen[0] for c in seen):
            notes.append(f"{os.path.basename(argv[0])} {' '.join(argv[1:])}: counts vary "
                         f"between runs: {[c['faults'] for c in seen]} faults")
        return median(times), seen[-1], notes

    def lackey(self, argv: list, repeat: int) -> tuple[float, int, int, list]:
        """Median time, trace records (all lines) and data records (L/S/M lines)."""
        times, notes = [], []
        records = data = 0
        for _ in range(repeat):
            log = self._out("lackey") + ".log"
            r, t = run(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}",
                        *argv])
            times.append(t)
            if r.returncode != 0:
                raise Mismatch(f"lackey {' '.join(argv)}: exit status {r.returncode}")
            if r.stdout != self.expected[tuple(argv)]:
                notes.append(f"lackey {' '.join(argv)}: output differs from the native one")
            records, data = count_lackey(log)
            os.unlink(log)
        return median(times), records, data, notes


def count_lackey(path: str) -> tuple[int, int]:
    records = data = 0
    with open(path, "rb") as f:
        for line in f:
            if line.startswith(b"I  "):
                records += 1
            elif line[:3] in (b" L ", b" S ", b" M "):
                records += 1
                data += 2 if line[1:2] == b"M" else 1
    return records, data


def ptrace_floor(tmp: str) -> tuple[float, float, float] | None:
    """(µs per bare ptrace stop, µs per stop with the fault loop's requests, µs per
    fault handled inside the process with no tracer), from bench/ptrace_floor.c on
    this machine, or None if it cannot be built."""
    exe = os.path.join(tmp, "ptrace_floor")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ptrace_floor.c")
    if subprocess.run(["gcc", "-O2", "-o", exe, src], capture_output=True).returncode != 0:
        return None
    values = []
    for mode in ("bare", "full", "inproc"):
        runs = [float(subprocess.run([exe, mode, "50000"], capture_output=True, text=True,
                                     timeout=120).stdout) for _ in range(3)]
        values.append(median(runs))
    return values[0], values[1], values[2]


def met(ok: bool) -> str:
    return "MET" if ok else "not met"


def main() -> int:
    if not shutil.which("valgrind"):
        print("valgrind is not installed (make deps installs it)", file=sys.stderr)
        return 1
    compute = [prog(COMPUTE[0], "O2-nopie"), *COMPUTE[1]]
    mem_bin = prog("bench_data_memory", "O2-nopie")
    mem_small, mem_large = ([mem_bin, *a] for a in MEMORY_SIZES)
    notes: list = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-data-") as tmp:
        b = Bench(tmp)
        try:
            # native times (also the expected outputs), then one untimed check run of
            # madtrace for each program: its output must be the native one
            native = {tuple(a): b.native(a) for a in (compute, mem_small, mem_large)}
            for argv in (compute, mem_small):
                b.madtrace_once(argv)
            # 1. per access, differenced
            m_small, c_small, n1 = b.madtrace(mem_small)
            m_large, c_large, n2 = b.madtrace(mem_large)
            m_compute, c_compute, n3 = b.madtrace(compute)
            notes += n1 + n2 + n3
            # 2. lackey, whole runs
            l_compute, rec_compute, data_compute, n4 = b.lackey(compute, REPEAT_LACKEY_COMPUTE)
            l_mem_small, _, data_mem_small, n5 = b.lackey(mem_small, REPEAT_LACKEY)
            l_mem, rec_mem, data_mem, n6 = b.lackey(mem_large, REPEAT_LACKEY)
            notes += n4 + n5 + n6
            floor = ptrace_floor(tmp)
        except Mismatch as e:
            print(f"bench_data: check failed, benchmark stopped: {e}",
                  file=sys.stderr)
            return 1
        except subprocess.TimeoutExpired as e:
            print(f"bench_data: timed out: {e}", file=sys.stderr)
            return 1

    d_faults = c_large["faults"] - c_small["faults"]
    d_acc = c_large["accesses"] - c_small["accesses"]
    d_time = m_large - m_small
    us_fault = d_time / d_faults * 1e6 if d_faults > 0 else float("nan")
    us_access = d_time / d_acc * 1e6 if d_acc > 0 else float("nan")
    rows = [(" ".join(a[1:]), f"{t:.3f}", c["faults"], c["fast_path"], c["untraced_faults"],
             c["accesses"]) for a, t, c in ((mem_small, m_small, c_small),
                                            (mem_large, m_large, c_large))]
    rows.append(("difference", f"{d_time:.3f}", d_faults, c_large["fast_path"] -
                 c_small["fast_path"], "", d_acc))
    print(table(f"madtrace --data, memory-heavy: cost per access (median of {REPEAT_MADTRACE})",
                rows, ("passes n", "wall s", "faults", "fast path", "untraced", "accesses")))
    d_lackey = data_mem - data_mem_small
    us_lackey = (l_mem - l_mem_small) / d_lackey * 1e6 if d_lackey > 0 else float("nan")
    print(f"  madtrace: {us_fault:.1f} us per fault, {us_access:.1f} us per recorded access")
    print(f"  lackey, same difference: {us_lackey:.2f} us per data access "
          f"({d_lackey} more L/S/M accesses, {l_mem - l_mem_small:.3f} s more, "
          f"medians of {REPEAT_LACKEY}); lackey / madtrace per access {us_lackey / us_fault:.2f}")

    native_c, native_m = native[tuple(compute)], native[tuple(mem_large)]
    ratio_c, ratio_m = l_compute / m_compute, l_mem / m_large
    rows = [
        (f"compute {' '.join(compute[1:])}", f"{native_c:.3f}", f"{m_compute:.3f}",
         f"{l_compute:.3f}", f"{m_compute / native_c:.0f}x", f"{l_compute / native_c:.0f}x",
         f"{ratio_c:.2f}", c_compute["faults"], c_compute["accesses"], data_compute,
         rec_compute),
        (f"memory {' '.join(mem_large[1:])}", f"{native_m:.3f}", f"{m_large:.3f}",
         f"{l_mem:.3f}", f"{m_large / native_m:.0f}x", f"{l_mem / native_m:.0f}x",
         f"{ratio_m:.2f}", c_large["faults"], c_large["accesses"], data_mem, rec_mem),
    ]
    print(table(f"whole run, wall s (native median of {REPEAT_NATIVE}, madtrace of "
                f"{REPEAT_MADTRACE}, lackey of {REPEAT_LACKEY_COMPUTE}/{REPEAT_LACKEY})", rows,
                ("program", "native", "madtrace", "lackey", "mt/nat", "lk/nat",
                 "lackey/mt", "mt faults", "mt accesses", "lk data", "lk records")))
    if rec_mem:
        print(f"  lackey: {l_mem / rec_mem * 1e6:.2f} us per trace record, "
              f"{l_mem / data_mem * 1e6:.2f} us per data access (memory-heavy, whole run); "
              f"{l_compute / rec_compute * 1e6:.2f} us per record (compute-heavy)")
    # whole-run ratios carry each tool's start-up: for the compute-heavy program
    # madtrace's time is almost all fixed cost, so its ratio grows with the run
    print(f"  compute-heavy: madtrace's fixed cost (madtrace - native) "
          f"{m_compute - native_c:.2f} s; the ratio grows with the size of the run")
    if floor is not None:
        print(f"  the floor on this machine (bench/ptrace_floor.c, C tracer, same CPU): a bare "
              f"ptrace stop {floor[0]:.1f} us; with the fault loop's requests (GETSIGINFO, "
              f"GETREGS, pread, POKEUSER) {floor[1]:.1f} us; madtrace per fault "
              f"{us_fault:.1f} us = {us_fault / floor[1]:.2f}x that floor")
        # what one fault per access costs at the very least, against lackey's cost per access
        print(f"  a fault taken and handled inside the process (no tracer, no mprotect, nothing "
              f"recorded) {floor[2]:.2f} us; lackey per data access {us_lackey:.2f} us: a "
              f"ptrace-driven tracer stays above {floor[1]:.1f} us per access, "
              f"{floor[1] / us_lackey:.1f}x lackey's; only a design without a fault per "
              f"access can be faster than lackey on memory-heavy code")
    print("== goals")
    print(f"  compute-heavy >= {GOAL_COMPUTE_RATIO:.0f}x faster than lackey: "
          f"{ratio_c:.1f}x  {met(ratio_c >= GOAL_COMPUTE_RATIO)}")
    print(f"  memory-heavy no slower than lackey: lackey/madtrace {ratio_m:.2f}  "
          f"{met(ratio_m >= GOAL_MEMORY_RATIO)}")
    print(f"  <= {GOAL_US_PER_ACCESS:.0f} us per access: {us_fault:.1f} us per fault  "
          f"{met(us_fault <= GOAL_US_PER_ACCESS)}")
    for note in notes:
        print(f"  note: {note}")
    print(f"  (bench took {time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
