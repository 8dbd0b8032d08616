"""Symbols and DWARF once per binary.  ``madtrace record``
of the machine's python3.11 (which links libpython3.11.so.1.0, 9 MB of
.debug_info), with function tracing, and with --data on a short script,
each twice with an empty symbol cache first: the first run reads the DWARF
while the target runs, the second loads it from the cache.

Reported per run: the whole wall time, the target's own run under tracing
(meta.json start to end), the time beyond it, the write-out after the
target ended, the tracer's time in symbols (ELF) and DWARF, the peak RSS of
the tracer and of the DWARF reader.  Goals: a second run adds <= 1 s for
symbols and DWARF; the tracer's peak RSS <= 300 MB.

--data traces the executable's own .data/.bss (--regions) so that the
target runs in seconds: naming the accesses still loads the variables of
every module, libpython's 8.7k included.  BENCH_FULL=1 adds the whole
`--data -- python3.11 -c pass` (every region: minutes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import ROOT, table



def _python311() -> str:
    """The real python3.11 binary (not a pyenv shim): MADTRACE_BENCH_PYTHON, else
    the interpreter python3.11 on PATH names as its executable."""
    if os.environ.get("MADTRACE_BENCH_PYTHON"):
        return os.environ["MADTRACE_BENCH_PYTHON"]
    found = shutil.which("python3.11")
    if not found:
        raise SystemExit("python3.11 not found (set MADTRACE_BENCH_PYTHON)")
    return subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True,
                          text=True, check=True).stdout.strip()


PYTHON = _python311()
LIB = "libpython3.11.so.1.0"
SCRIPT = "import json; print(json.dumps(sorted({'b': 2, 'a': [1, 2, 3]}.items())))"
MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
REGIONS = ["--regions", ".data of python3.11", "--regions", ".bss of python3.11"]
CASES = [("functions", [], ["-c", SCRIPT]),
         ("--data (own .data/.bss)", ["--data", *REGIONS], ["-c", SCRIPT])]
if os.environ.get("BENCH_FULL"):
    CASES.append(("--data (all regions)", ["--data"], ["-c", "pass"]))


def record(cache: str, options: list[str], args: list[str], native: bytes) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, MADTRACE_CACHE_DIR=cache)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t")
        t0 = time.perf_counter()
        run = subprocess.run([*MADTRACE, "record", "-q", *options, "-o", out, "--", PYTHON, *args],
                             capture_output=True, env=env)
        wall = time.perf_counter() - t0
        if run.returncode != 0 or run.stdout != native:
            raise SystemExit(f"{options}: failed or output differs: {run.stderr.decode()[-400:]}")
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
    target = meta["end_time"] - meta["start_time"]
    tracer = meta["tracer"]
    return {"wall": wall, "target": target, "beyond": wall - target, **tracer}


def main() -> int:
    if LIB not in subprocess.run(["ldd", PYTHON], capture_output=True, text=True).stdout:
        print(f"{PYTHON} does not link {LIB}: nothing to measure")
        return 1
    rows, goals = [], []
    for name, options, args in CASES:
        native = subprocess.run([PYTHON, *args], capture_output=True)
        t0 = time.perf_counter()
        subprocess.run([PYTHON, *args], capture_output=True)
        untraced = time.perf_counter() - t0
        with tempfile.TemporaryDirectory() as cache:
            for which in ("first", "second"):
                r = record(cache, options, args, native.stdout)
                rows.append((name, which, f"{r['wall']:.2f}", f"{untraced:.2f}", f"{r['target']:.2f}",
                             f"{r['beyond']:.2f}", f"{r['write_seconds']:.2f}",
                             f"{r['symbols_seconds']:.2f}", f"{r['dwarf_seconds']:.2f}",
                             r["dwarf_read_while_running"], f"{r['peak_rss_bytes'] / 2**20:.0f}",
                             f"{r['dwarf_reader_peak_rss_bytes'] / 2**20:.0f}"))
                if which == "second":
                    goals.append((name, r["symbols_seconds"] + r["dwarf_seconds"],
                                  r["peak_rss_bytes"]))
    print(table(f"madtrace record of {PYTHON} ({LIB}), empty symbol cache, then warm", rows,
                ("record", "run", "wall s", "untraced s", "target run s", "beyond s",
                 "write-out s", "symbols s", "DWARF s", "DWARF read live", "peak RSS MB",
                 "reader RSS MB")))
    for name, seconds, rss in goals:
        print(f"goal ({name}): second run adds <= 1 s for symbols and DWARF: "
              f"{'met' if seconds <= 1 else 'NOT met'} ({seconds:.2f} s); "
              f"peak RSS <= 300 MB: {'met' if rss <= 300 * 2**20 else 'NOT met'} "
              f"({rss / 2**20:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
