# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid data engine against valgrind lackey, in one run.

Per access (difference method: each program at two run lengths, the
difference of the median wall times over the difference of the accesses
recorded, so that start-up and write-out cancel):

* the probe path: a shuffled linked list on the heap (tests/progs/
  bench_data_list.c: two loads per node, one pointer chase) and passes over a
  global array (bench_data_memory.c: a load and a store per element) under
  ``madtrace record --data`` (hybrid engine), with the share of accesses each
  path took;
* the fault path: the same programs under ``--data-engine fault`` (every
  access a ptrace stop; shorter runs);
* mixed: bench_data_mixed.c, whose loop makes probe accesses and string
  instructions that stay on faults, with the share of each;
* lackey: the same runs under ``valgrind --tool=lackey --trace-mem=yes``, per
  data access (its L/S/M lines).

Whole runs (median of REPEAT): a compute-heavy program (bench_data_compute.c,
a run lackey needs 10-40 s for), Debian's gzip compressing 200 KB, and the
machine's python3 running a short script; each output must equal the native
one.  Each is timed twice: ``madtrace record`` (a Python starts and imports
the tracer, ~0.2 s of each run), and ``build/bin/madtrace-ctl record`` with a
resident madtrace process started by the bench (the client forks the
program; a worker forked from the resident, the tracer already imported,
records it).  Bytes per access on disk: the list walk's data/<tid>.dat files.

Goals: <= 50 ns per access on the probe path; memory-heavy >= 10x
faster than lackey per access; compute-heavy >= 100x faster over the whole
run; gzip and python3 >= 10x faster; <= 16 bytes per access on disk.

``--quick``: smaller runs, one repetition (a smoke test, not a measurement).
``--per-access``: the per-access table and the floors only (no whole runs).
``--lackey-once``: one lackey run per whole-run program (lackey takes 20-100 s
each there).

madtrace's caches (symbols, call-site scans, the copier's entries) are the
bench's own, empty at the start: each whole-run program's first run is cold,
the others warm; both are printed, the goals use the warm median.

madtrace's modules are byte-compiled first (``compileall``), as an installed
package has them: with PYTHONDONTWRITEBYTECODE set and no __pycache__, every
run would compile ~90 modules (~0.15-0.25 s of each whole run's start-up).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_data import ptrace_floor
from common import ROOT, prog, table

MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
# the same command through madtrace-ctl and a resident madtrace process (started by main():
# no Python starts per run; the client forks the program, process/spawn_proxy.py)
CTL = [os.path.join(ROOT, "build", "bin", "madtrace-ctl")]
ENV = dict(os.environ, PYTHONPATH=ROOT)   # MADTRACE_CACHE_DIR: the bench's own (main)
QUICK = "--quick" in sys.argv
PER_ACCESS_ONLY = "--per-access" in sys.argv     # the per-access table and the floors only
LACKEY_ONCE = "--lackey-once" in sys.argv
REPEAT = 1 if QUICK else 3
PYTHON_SCRIPT = ("d = {}\nfor i in range(10000):\n    d[str(i)] = i * i\n"
                 "print(sum(len(k) + v % 7 for k, v in d.items()))\n")


class Mismatch(Exception):
    pass


class Skip(Exception):
    """--per-access: the whole runs are left out."""


def run(argv: list, stdin: bytes | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, env=ENV, timeout=3600, input=stdin)
    return r, time.perf_counter() - t0


class Bench:
    def __init__(self, tmp: str):
        self.tmp = tmp
        self.repeat = REPEAT
        self.n = 0
        self.expected: dict = {}

    def out(self, tag: str) -> str:
        self.n += 1
        return os.path.join(self.tmp, f"{tag}.{self.n}")

    def native(self, argv: list, stdin=None) -> float:
        times = []
        for _ in range(self.repeat):
            r, t = run(argv, stdin)
            if r.returncode != 0:
                raise Mismatch(f"{' '.join(argv)}: exit status {r.returncode}")
            self.expected[tuple(argv)] = r.stdout
            times.append(t)
        return statistics.median(times)

    def madtrace(self, argv: list, engine: str, stdin=None, keep: bool = False,
                 client: list = MADTRACE) -> tuple[float, dict]:
        """Median time of REPEAT runs and the counts of the last (``info["first"]``:
        the first run's time, ``info["warm"]``: the median of the others).
        ``client``: the command (CTL: madtrace-ctl, through the resident process)."""
        times, info = [], {}
        for _ in range(self.repeat):
            out = self.out("mt")
            r, t = run([*client, "record", "-q", "--data", "--no-functions", "--no-store",
                        "--data-engine", engine, "-o", out, "--", *argv], stdin)
            if r.returncode != 0:
                err = r.stderr.decode(errors="replace").strip().splitlines()
                raise Mismatch(f"madtrace {engine} {' '.join(argv)}: exit {r.returncode}: "
                               f"{err[-1] if err else ''}")
            if r.stdout != self.expected[tuple(argv)]:
                raise Mismatch(f"madtrace {engine} {' '.join(argv)}: output differs")
            with open(os.path.join(out, "meta.json")) as f:
                meta = json.load(f)
            dt = meta.get("data_tracing") or {}
            paths = (dt.get("paths") or {}).get("accesses_by_path") or {}
            accesses = sum(c["L"] + c["S"] for c in meta.get("accesses", {}).values())
            info = {"accesses": accesses, "probe": paths.get("probe", 0),
                    "fault": paths.get("fault", accesses if engine == "fault" else 0),
                    "dropped": meta.get("dropped_events", 0) + (dt.get("paths") or {}).get("dropped", 0),
                    "bytes": sum(os.path.getsize(os.path.join(out, "data", f))
                                 for f in os.listdir(os.path.join(out, "data"))
                                 if f.endswith((".dat", ".acc")))}
            times.append(t)
            if not keep:
                shutil.rmtree(out, ignore_errors=True)
        info["first"] = times[0]
        info["warm"] = statistics.median(times[1:]) if len(times) > 1 else None
        return statistics.median(times), info

    def lackey(self, argv: list, stdin=None, repeat: int | None = None) -> tuple[float, int]:
        times, data = [], 0
        for _ in range(repeat or self.repeat):
            log = self.out("lk") + ".log"
            r, t = run(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}",
                        *argv], stdin)
            if r.returncode != 0 or r.stdout != self.expected[tuple(argv)]:
                raise Mismatch(f"lackey {' '.join(argv)}: exit {r.returncode} or output differs")
            data = count_lackey(log)
            os.unlink(log)
            times.append(t)
        return statistics.median(times), data


def count_lackey(path: str) -> int:
    data = 0
    with open(path, "rb") as f:
        for line in f:
            if line[:3] in (b" L ", b" S "):
                data += 1
            elif line[:3] == b" M ":
                data += 2
    return data


def per_access(b: Bench, name: str, sizes: tuple, fault_sizes: tuple) -> tuple[list, dict]:
    """Rows of the per-access table for one program, and its figures."""
    exe = prog(name, "O2-nopie")
    small, large = ([exe, *s] for s in sizes)
    native = {tuple(argv): b.native(argv) for argv in (small, large, *([exe, *s] for s in fault_sizes))}
    # the probe path is ~100 ns per access: 10x the lackey run's length, or the
    # difference drowns in the start-up's noise on a loaded machine
    longest = [exe, str(int(large[1]) * 10), *large[2:]]
    native[tuple(longest)] = b.native(longest)
    h1, i1 = b.madtrace(small, "hybrid")
    h2, i2 = b.madtrace(longest, "hybrid")
    ns_hybrid = (h2 - h1) / max(i2["accesses"] - i1["accesses"], 1) * 1e9
    fs, fl = ([exe, *s] for s in fault_sizes)
    f1, j1 = b.madtrace(fs, "fault")
    f2, j2 = b.madtrace(fl, "fault")
    ns_fault = (f2 - f1) / max(j2["accesses"] - j1["accesses"], 1) * 1e9
    l1, d1 = b.lackey(small)
    l2, d2 = b.lackey(large)
    ns_lackey = (l2 - l1) / max(d2 - d1, 1) * 1e9
    # the program's own cost per access, uninstrumented: the floor of any recorder
    ns_native = (native[tuple(longest)] - native[tuple(small)]) / max(i2["accesses"] - i1["accesses"], 1) * 1e9
    share = i2["probe"] / max(i2["probe"] + i2["fault"], 1)
    rows = [(name, "native", " ".join(longest[1:]), f"{native[tuple(longest)]:.2f}", "", f"{ns_native:.1f}",
             "", "", ""),
            (name, "hybrid", " ".join(longest[1:]), f"{h2:.2f}", i2["accesses"], f"{ns_hybrid:.0f}",
             f"{100 * share:.2f}%", i2["dropped"], f"{i2['bytes'] / max(i2['accesses'], 1):.2f}"),
            (name, "fault", " ".join(fl[1:]), f"{f2:.2f}", j2["accesses"], f"{ns_fault:.0f}",
             "0%", j2["dropped"], f"{j2['bytes'] / max(j2['accesses'], 1):.2f}"),
            (name, "lackey", " ".join(large[1:]), f"{l2:.2f}", d2, f"{ns_lackey:.0f}", "", "", "")]
    return rows, {"hybrid": ns_hybrid, "fault": ns_fault, "lackey": ns_lackey, "share": share,
                  "native": ns_native,
                  "bytes": i2["bytes"] / max(i2["accesses"], 1)}


def whole_run(b: Bench, label: str, argv: list, stdin=None, repeat: int = REPEAT) -> tuple[tuple, float]:
    """The program's first run under madtrace is cold: none of its binaries is in
    madtrace's caches yet (the bench's own cache directory: symbols, call-site
    scans, the copier's entries); the others are warm, as a user's runs after
    the first.  The ratio is lackey's over madtrace's warm median."""
    b.repeat = repeat
    try:
        native = b.native(argv, stdin)
        mt, info = b.madtrace(argv, "hybrid", stdin)
        resident, _ = b.madtrace(argv, "hybrid", stdin, client=CTL)
        lk, data = b.lackey(argv, stdin, repeat=1 if LACKEY_ONCE else None)
    finally:
        b.repeat = REPEAT
    share = info["probe"] / max(info["probe"] + info["fault"], 1)
    warm = info["warm"] if info["warm"] is not None else mt
    return ((label, repeat, f"{native:.2f}", f"{info['first']:.2f}", f"{warm:.2f}",
             f"{resident:.2f}", f"{lk:.2f}", f"{lk / info['first']:.1f}x", f"{lk / warm:.1f}x",
             f"{lk / resident:.1f}x", info["accesses"], data, f"{100 * share:.1f}%"),
            (lk / warm, lk / resident))


def met(ok: bool) -> str:
    return "MET" if ok else "not met"


def main() -> int:
    if not shutil.which("valgrind"):
        print("valgrind is not installed (make deps installs it)", file=sys.stderr)
        return 1
    scale = 5 if QUICK else 1
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "madtrace")],
                   capture_output=True, env=ENV)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="madtrace-bench-hybrid-") as tmp:
        ENV["MADTRACE_CACHE_DIR"] = os.path.join(tmp, "cache")    # cold at each program's first run
        ENV["XDG_RUNTIME_DIR"] = os.path.join(tmp, "run")          # the bench's own resident
        os.mkdir(ENV["XDG_RUNTIME_DIR"])
        b = Bench(tmp)
        try:
            rows, figures = [], {}
            for name, sizes, fault_sizes in (
                    ("bench_data_list", (["20", "4096"], [str(200 // scale), "4096"]),
                     (["1", "4096"], ["3", "4096"])),
                    ("bench_data_memory", (["20", "4096"], [str(200 // scale), "4096"]),
                     (["1", "4096"], ["3", "4096"])),
                    ("bench_data_mixed", (["20", "4096"], [str(200 // scale), "4096"]),
                     (["1", "4096"], ["3", "4096"]))):
                r, f = per_access(b, name, sizes, fault_sizes)
                rows += r
                figures[name] = f
            print(table("per access, difference of two run lengths (median of %d)" % REPEAT, rows,
                        ("program", "engine", "args (long run)", "wall s", "accesses",
                         "ns/access", "probe share", "dropped", "bytes/access")))
            r_compute = r_gzip = r_python = None
            floor = ptrace_floor(tmp)
            if PER_ACCESS_ONLY:
                raise Skip
            started, _ = run([*MADTRACE, "daemon", "--resident"])
            if started.returncode != 0:
                raise Mismatch(f"the resident process did not start: {started.stderr.decode()}")
            whole = []
            compute, r_compute = whole_run(b, "compute (mandelbrot)", [prog("bench_data_compute", "O2-nopie"),
                                                                      "200" if QUICK else "300", "256"])
            whole.append(compute)
            sample = os.path.join(tmp, "sample")
            with open(sample, "wb") as f:     # 200 KB of text-like, compressible data
                words = open("/usr/share/dict/words", "rb").read() if os.path.exists(
                    "/usr/share/dict/words") else b"".join(b"line %d of the sample\n" % i for i in range(20000))
                f.write((words * (1 + 200_000 // max(len(words), 1)))[:200_000])
            gz, r_gzip = whole_run(b, "gzip -c 200 KB", ["gzip", "-c", sample])
            whole.append(gz)
            python = shutil.which("python3.11", path="/usr/bin") or "/usr/bin/python3"
            # cold, then warm twice (its discovery relocates ~1 200 functions)
            py, r_python = whole_run(b, "python3 short script", [python, "-S", "-c", PYTHON_SCRIPT],
                                     repeat=1 if QUICK else 3)
            whole.append(py)
            print(table("whole runs, wall s (madtrace: the first run, cold caches; the "
                        "median of the others, warm)", whole,
                        ("program", "runs", "native", "madtrace cold", "madtrace warm",
                         "madtrace-ctl + resident", "lackey", "lackey/cold", "lackey/warm",
                         "lackey/resident", "mt accesses", "lackey data", "probe share")))
        except Skip:
            pass
        except Mismatch as e:
            print(f"bench_hybrid: check failed: {e}", file=sys.stderr)
            return 1
        finally:
            run([*MADTRACE, "daemon", "--stop-resident"])
    lst, mem = figures["bench_data_list"], figures["bench_data_memory"]
    print("== goals")
    if min(lst["hybrid"], mem["hybrid"]) <= 0:
        print("  the probe path's difference is not positive: below the noise of this run")
        return 1
    probe_ns = max(lst["hybrid"], mem["hybrid"])
    print(f"  <= 50 ns per access on the probe path: list walk {lst['hybrid']:.0f} ns, array "
          f"passes {mem['hybrid']:.0f} ns (drmemtrace: 20-30 ns)  {met(probe_ns <= 50)}")
    for name, f in (("list walk", lst), ("array passes", mem)):
        ratio = f["lackey"] / max(f["hybrid"], 1e-9)
        print(f"  memory-heavy >= 10x faster than lackey per access, {name}: {ratio:.1f}x "
              f"(lackey {f['lackey']:.0f} ns, fault engine {f['fault']:.0f} ns)  {met(ratio >= 10)}")
    for label, ratios, goal in (("compute-heavy >= 100x faster than lackey over the run", r_compute, 100),
                                ("gzip >= 10x faster than lackey", r_gzip, 10),
                                ("python3 >= 10x faster than lackey", r_python, 10)):
        print(f"  {label}: " + ("not measured (--per-access)" if ratios is None else
                                f"madtrace record {ratios[0]:.1f}x  {met(ratios[0] >= goal)}; "
                                f"madtrace-ctl record with the resident {ratios[1]:.1f}x  "
                                f"{met(ratios[1] >= goal)}"))
    print(f"  <= 16 bytes per access on disk (list walk): {lst['bytes']:.2f}  {met(lst['bytes'] <= 16)}")
    if floor is not None:
        print(f"  floors of this machine (bench/ptrace_floor.c, C tracer, one CPU): a bare ptrace "
              f"stop {floor[0] * 1000:.0f} ns, with the fault loop's requests {floor[1] * 1000:.0f} ns, "
              f"a fault handled in the process {floor[2] * 1000:.0f} ns; the programs' own cost "
              f"per access, native: list walk {lst['native']:.1f} ns, array passes {mem['native']:.1f} ns")
    print(f"  (bench took {time.perf_counter() - t0:.0f} s{', --quick: not a measurement' if QUICK else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
