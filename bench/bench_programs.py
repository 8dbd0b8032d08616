# SPDX-License-Identifier: GPL-2.0-or-later
"""Data tracing of programs users run, whole runs beside lackey and native.

What a user gets from ``madtrace record --data -- CMD`` with the default
options and the ``python3`` on PATH (not the project's virtual environment):
each program natively, under madtrace and under ``valgrind --tool=lackey
--trace-mem=yes``, one after the other in one run.

* the ``python3`` on PATH running a short json script (site imported);
* Debian's ``sqlite3`` running a script of 10 000 inserts and a few queries;
* Debian's ``gzip -c`` of a generated 5 MB text (against native only: lackey's
  trace of it passes 20 GB);
* a Mandelbrot set (tests/progs/bench_data_compute.c: computation in
  registers, few accesses): lackey's cost is its instrumentation, madtrace's
  is its start-up;
* the kinds of the MadT paper's table: libc's qsort of words with a strcmp
  comparator and a Boyer-Moore-Horspool string search (bench/progs/).

madtrace's caches (symbols, call-site scans, the copier's analyses) are the
bench's own directory: emptied before each program's first run (cold), kept
for the next REPEAT runs (warm, the median given).  Each output must equal the
native one.  Per run: wall time, accesses recorded, accesses on the fault path
(ptrace stops), the faults (meta.json's: accesses the fault path carried) and
the threads moved into a copy at a fault (discovery: the first call of a
function relocated in the run).

Goals (the issue's): sqlite3 >= 10x lackey; python3 >= 10x lackey on a first
run, >= 30x warm, a warm run's faults <= 2% of the first's; Mandelbrot >= 100x
lackey; qsort and string search >= 10x lackey (the paper: 5.0x and 7.9x);
gzip of 5 MB <= 20x native.

``--quick``: one warm run and smaller inputs (a smoke test, not a
measurement).  ``--only NAME[,NAME]``: those programs.  ``--lackey-runs N``
(default 1: lackey needs minutes on some of these).  Writes
bench/results/programs.md.
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

from common import ROOT, prog, table

QUICK = "--quick" in sys.argv
REPEAT = 1 if QUICK else 3
LACKEY_RUNS = int(sys.argv[sys.argv.index("--lackey-runs") + 1]) if "--lackey-runs" in sys.argv else 1
ONLY = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None
BIN = os.path.join(ROOT, "build", "bench")
RESULTS = os.path.join(ROOT, "bench", "results", "programs.md")
NOTES = "<!-- notes: kept when the bench writes this file again -->"

JSON_SCRIPT = """import json
d = {"k%d" % i: [i, str(i), {"x": i * 2}] for i in range(3000)}
s = json.dumps(d)
e = json.loads(s)
print(len(s), len(e))
"""


def user_python() -> str:
    """The interpreter the ``python3`` of a user's PATH runs, past this project's
    virtual environment (a pyenv shim is a shell script: the interpreter it
    starts, as valgrind would not follow the exec)."""
    venv = os.path.realpath(os.path.join(ROOT, ".venv"))
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(folder, "python3")
        if os.access(candidate, os.X_OK) and \
                not os.path.realpath(folder).startswith(venv) and \
                not os.path.abspath(folder).startswith(venv):
            env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
            return subprocess.run([candidate, "-c", "import sys; print(sys.executable)"],
                                  capture_output=True, text=True, check=True, env=env,
                                  cwd="/").stdout.strip()
    raise SystemExit("no python3 on PATH outside the virtual environment")


def madtrace_command() -> list[str]:
    installed = os.path.join(os.path.dirname(sys.executable), "madtrace")
    return [installed] if os.path.exists(installed) else [sys.executable, "-m", "madtrace.cli.main"]


def build(name: str) -> str:
    os.makedirs(BIN, exist_ok=True)
    out = os.path.join(BIN, name)
    source = os.path.join(ROOT, "bench", "progs", f"{name}.c")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(source):
        subprocess.run(["gcc", "-O2", "-g", "-o", out, source], check=True)
    return out


def sql_script(rows: int) -> bytes:
    lines = ["CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, score REAL);", "BEGIN;"]
    lines += [f"INSERT INTO t(name, score) VALUES('name{i * 7919 % rows}', {i * 0.5});"
              for i in range(rows)]
    lines += ["COMMIT;", "CREATE INDEX t_name ON t(name);",
              "SELECT count(*), sum(score) FROM t WHERE name LIKE 'name1%';",
              "SELECT name, score FROM t ORDER BY score DESC LIMIT 3;",
              "SELECT substr(name, 1, 5) AS p, count(*) FROM t GROUP BY p ORDER BY 2 DESC LIMIT 3;"]
    return "\n".join(lines).encode() + b"\n"


def text_file(folder: str, megabytes: int) -> str:
    path = os.path.join(folder, f"text{megabytes}.txt")
    words = [b"tracer", b"memory", b"access", b"function", b"segment", b"heap", b"block",
             b"probe", b"ring", b"store", b"the", b"of", b"and", b"a", b"in"]
    state, out, size = 7, bytearray(), megabytes << 20
    while len(out) < size:
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        out += words[state % len(words)] + (b"\n" if state % 11 == 0 else b" ")
    with open(path, "wb") as f:
        f.write(out[:size])
    return path


def programs(folder: str) -> list[tuple[str, list[str], bytes | None]]:
    script = os.path.join(folder, "short.py")
    with open(script, "w") as f:
        f.write(JSON_SCRIPT)
    sql = os.path.join(folder, "rows.sql")
    with open(sql, "wb") as f:
        f.write(sql_script(2000 if QUICK else 10000))
    text = text_file(folder, 1 if QUICK else 5)
    return [
        ("python3 json", [user_python(), script], None),
        ("sqlite3", ["/usr/bin/sqlite3", ":memory:"], open(sql, "rb").read()),
        ("gzip 5 MB", ["/usr/bin/gzip", "-c", text], None),
        ("Mandelbrot", [prog("bench_data_compute", "O2-nopie"), "300" if QUICK else "1000"], None),
        ("qsort of words", [build("sort_words"), "5000" if QUICK else "20000"], None),
        ("string search", [build("string_search"), "500" if QUICK else "1500"], None),
    ]


def timed(argv: list[str], stdin: bytes | None, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    result = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=7200)
    return result, time.perf_counter() - started


class Runner:
    def __init__(self, folder: str):
        self.folder = folder
        self.cache = os.path.join(folder, "cache")
        self.env = dict(os.environ, MADTRACE_CACHE_DIR=self.cache)
        self.n = 0

    def native(self, argv, stdin) -> tuple[float, bytes]:
        times, out = [], b""
        for _ in range(max(REPEAT, 3)):
            r, t = timed(argv, stdin, self.env)
            if r.returncode != 0:
                raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}")
            times.append(t)
            out = r.stdout
        return statistics.median(times), out

    def madtrace(self, argv, stdin, expected: bytes) -> dict:
        self.n += 1
        out = os.path.join(self.folder, f"trace{self.n}")
        r, t = timed([*madtrace_command(), "record", "-q", "--data", "-o", out, "--", *argv],
                     stdin, self.env)
        if r.returncode != 0 or r.stdout != expected:
            err = r.stderr.decode(errors="replace").strip().splitlines()
            raise SystemExit(f"madtrace {' '.join(argv)}: exit {r.returncode}, output "
                             f"{'same' if r.stdout == expected else 'differs'}: {err[-1:]}")
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        shutil.rmtree(out, ignore_errors=True)
        data = meta.get("data_tracing") or {}
        paths = data.get("paths") or {}
        by_path = paths.get("accesses_by_path") or {}
        rewriter = paths.get("rewriter") or {}
        return {"seconds": t, "faults": data.get("faults", 0), "probe": by_path.get("probe", 0),
                "moves": rewriter.get("moved", 0) + rewriter.get("moved_by_fault_loop", 0),
                "fault": by_path.get("fault", 0), "dropped": paths.get("dropped", 0),
                "why": paths.get("on_faults_why", {})}

    def lackey(self, argv, stdin, expected: bytes) -> float:
        times = []
        for _ in range(LACKEY_RUNS):
            # its trace into a file, as a user of lackey gets it (madtrace writes its own)
            log = os.path.join(self.folder, "lackey.log")
            r, t = timed(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={log}",
                          *argv], stdin, self.env)
            os.unlink(log)
            if r.returncode != 0 or r.stdout != expected:
                raise SystemExit(f"lackey {' '.join(argv)}: exit {r.returncode} or output differs")
            times.append(t)
        return statistics.median(times)


def main() -> int:
    if not shutil.which("valgrind"):
        print("valgrind is not installed (make deps installs it)", file=sys.stderr)
        return 1
    folder = tempfile.mkdtemp(prefix="madtrace-programs-")
    try:
        runner = Runner(folder)
        rows, goals = [], []
        for label, argv, stdin in programs(folder):
            if ONLY and not any(o.lower() in label.lower() for o in ONLY):
                continue
            native, expected = runner.native(argv, stdin)
            shutil.rmtree(runner.cache, ignore_errors=True)
            cold = runner.madtrace(argv, stdin, expected)
            warm_runs = [runner.madtrace(argv, stdin, expected) for _ in range(REPEAT)]
            warm = sorted(warm_runs, key=lambda w: w["seconds"])[len(warm_runs) // 2]
            # gzip's goal is against native: lackey's trace of it passes 20 GB
            lackey = runner.lackey(argv, stdin, expected) if not label.startswith("gzip") \
                else float("nan")
            accesses = warm["probe"] + warm["fault"]
            rows.append((label, f"{native:.2f}", f"{cold['seconds']:.2f}", f"{warm['seconds']:.2f}",
                         f"{lackey:.1f}", f"{lackey / cold['seconds']:.1f}x",
                         f"{lackey / warm['seconds']:.1f}x", f"{warm['seconds'] / native:.0f}x",
                         accesses, warm["fault"], cold["faults"], warm["faults"], cold["moves"],
                         warm["moves"], warm["dropped"]))
            print(rows[-1], "warm on faults:", warm["why"], flush=True)
            goals += goal_lines(label, native, cold, warm, lackey)
        report = table("programs users run: madtrace record --data beside lackey and native",
                       rows, ("program", "native s", "cold s", "warm s", "lackey s",
                              "lackey/cold", "lackey/warm", "warm/native", "accesses",
                              "on faults", "faults cold", "faults warm", "moves cold",
                              "moves warm", "dropped"))
        print(report)
        print("\n".join(goals))
        if not QUICK and not ONLY:
            write_results(rows, goals)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def goal_lines(label: str, native: float, cold: dict, warm: dict, lackey: float) -> list[str]:
    def met(ok: bool) -> str:
        return "met" if ok else "not met"
    ratio_cold, ratio_warm = lackey / cold["seconds"], lackey / warm["seconds"]
    if label.startswith("python3"):
        share = warm["faults"] / max(cold["faults"], 1)
        moves = warm["moves"] / max(cold["moves"], 1)
        return [f"python3: {ratio_cold:.1f}x lackey cold (goal 10x: {met(ratio_cold >= 10)}), "
                f"{ratio_warm:.1f}x warm (goal 30x: {met(ratio_warm >= 30)}); a warm run's faults "
                f"{100 * share:.1f}% of the first's (goal 2%: {met(share <= 0.02)}), its threads "
                f"moved into copies at a fault {100 * moves:.1f}% of the first's"]
    if label.startswith("gzip"):
        slow = warm["seconds"] / native
        return [f"gzip: {slow:.1f}x native (goal 20x: {met(slow <= 20)})"]
    goal = {"sqlite3": 10, "Mandelbrot": 100, "qsort of words": 10, "string search": 10}[label]
    return [f"{label}: {ratio_warm:.1f}x lackey warm, {ratio_cold:.1f}x cold "
            f"(goal {goal}x: {met(ratio_warm >= goal)})"]


def write_results(rows: list, goals: list[str]) -> None:
    headers = ("program", "native s", "madtrace, cold caches s", "madtrace, warm s (median)",
               "lackey s", "lackey / cold", "lackey / warm", "warm / native", "accesses",
               "accesses on faults (warm)", "faults (cold)", "faults (warm)",
               "threads moved into copies at a fault (cold)", "the same (warm)", "dropped")
    lines = ["# Programs users run: whole recordings beside lackey and native", "",
             "Produced by `python3 bench/bench_programs.py` (part of `make bench`); how it",
             "measures is in its docstring. `madtrace record --data` with the default options;",
             "a 2-vCPU VM shared with other jobs. Native is the floor of any recorder.", "",
             "| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    lines += ["", "Goals:", ""] + [f"- {g}" for g in goals] + [""]
    notes = ""          # what was written by hand below NOTES stays
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            kept = f.read()
        if NOTES in kept:
            notes = kept[kept.index(NOTES):]
    with open(RESULTS, "w") as f:
        f.write("\n".join(lines) + ("\n" + notes if notes else ""))


if __name__ == "__main__":
    sys.exit(main())
