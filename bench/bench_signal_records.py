"""Signal handlers that call traced functions: are their records kept?

For each tree given (default: this one), RUNS recordings of each case, with
this tree's test programs (make programs):

* ``callsite``: signal_calls 5000 (O2-pie), ``-f leaf -f handled``: a thread
  sends SIGUSR1 to the main thread while it calls leaf(); the handler calls
  handled().  Exact: the calls table (built from the records, ``madtrace
  query``) counts the calls the program printed.
* ``entry``: the same with ``--method entry`` (O0-pie).
* ``storm``: hooks_churn 20000 storm, ``--data --no-functions``, hybrid
  engine: a SIGVTALRM handler copies memory (memcpy) while the rounds are in
  hooked calls.  Exact: one Y event per copy of the rounds and of the handler.

Counted per case and tree: exact runs, runs with wrong counts (and the
largest difference), runs where the program or madtrace failed or did not
finish in 60 s (the program is then killed).  Writes bench/results/signal_records.md.  Usage:

    python bench/bench_signal_records.py [TREE ...]

environment: RUNS (per case and tree, default 10).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

from common import BUILD as PROGS, ROOT, side_by_side


def madtrace(tree: str, *args: str) -> subprocess.CompletedProcess:
    """madtrace of ``tree`` (run from there: ``-m`` puts the working directory first)."""
    return subprocess.run([sys.executable, "-m", "madtrace.cli.main", *args], capture_output=True,
                          timeout=60, cwd=tree, env=dict(os.environ, PYTHONPATH=tree))


def printed(text: bytes) -> dict[str, int]:
    return {k: int(v) for k, v in (w.split("=") for w in text.decode().split() if "=" in w)}


def calls_case(tree: str, out: str, method: str, variant: str) -> int | None:
    """The difference between the calls table and the program's counts (0:
    exact), or None when a run failed."""
    result = madtrace(tree, "record", "-q", "--method", method, "-f", "leaf", "-f", "handled",
                      "-o", out, "--", os.path.join(PROGS, f"signal_calls-{variant}"), "5000")
    if result.returncode != 0:
        return None
    made = printed(result.stdout)
    table = madtrace(tree, "query", out, "SELECT function, count(*) AS n FROM calls GROUP BY 1",
                     "--json")
    if table.returncode != 0:
        return None
    rows = {row["function"]: row["n"] for row in json.loads(table.stdout)}
    return sum(abs(rows.get(name, 0) - made.get(name, 0)) for name in ("leaf", "handled"))


def storm_case(tree: str, out: str) -> int | None:
    argv = [os.path.join(PROGS, "hooks_churn-O2-pie"), "20000", "storm"]
    result = madtrace(tree, "record", "-q", "--data", "--no-functions", "--data-engine", "hybrid",
                      "--no-store", "-o", out, "--", *argv)
    if result.returncode != 0:
        return None
    handler = int(result.stderr.decode().split("handler memcpy=")[1].split()[0])
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    y = meta["data_tracing"]["block_events"].get("Y", {}).get("events", 0)
    return abs(y - (printed(result.stdout)["memcpy"] + handler))


CASES = {
    "callsite": lambda tree, out: calls_case(tree, out, "callsite", "O2-pie"),
    "entry": lambda tree, out: calls_case(tree, out, "entry", "O0-pie"),
    "storm": storm_case,
}


def measure(tree: str, case: str, runs: int, scratch: str) -> dict:
    exact = wrong = failed = largest = 0
    for run in range(runs):
        out = os.path.join(scratch, f"{case}{run}")
        try:
            difference = CASES[case](tree, out)
        except subprocess.TimeoutExpired:
            difference = None
            subprocess.run(["pkill", "-KILL", "-f", PROGS + "/"])      # a hung target
        subprocess.run(["rm", "-rf", out])
        if difference is None:
            failed += 1
        elif difference == 0:
            exact += 1
        else:
            wrong += 1
            largest = max(largest, difference)
    return {"runs": runs, "exact": exact, "wrong": wrong, "largest difference": largest,
            "failed or hung": failed}


def main() -> None:
    trees = sys.argv[1:] or [ROOT]
    runs = int(os.environ.get("RUNS", 10))
    with tempfile.TemporaryDirectory() as scratch:
        side_by_side("Signal handlers that call traced functions",
                     f"{runs} runs per case and tree (bench/bench_signal_records.py).",
                     {case: functools.partial(measure, case=case, runs=runs, scratch=scratch)
                      for case in CASES}, trees, "signal_records.md")


if __name__ == "__main__":
    main()
