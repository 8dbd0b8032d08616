# SPDX-License-Identifier: GPL-2.0-or-later
"""How long an attached `instrument` stops the target, with and without CPU hogs
beside it.

Debian's /usr/bin/python3.11 running `-m http.server` on 127.0.0.1 (the server
bench_live.py uses); `madtrace daemon PID`, then `madtrace ctl PID instrument
'PyDict_*'` (20 functions), then `ctl PID status --json`: the stops of that
command (``last_stops_ms``: the mapping stop and the patching stop) and the
attach's pause; `ctl PID stop`.  Each run with HOGS busy loops (`python3 -c
'while 1: pass'`) started before the attach and killed after, for hogs in
--hogs (default 0 and 2), --runs runs each, interleaved: the median and the
maximum of the longest stop of each run.

  python bench/bench_instrument_stop.py [--runs 10] [--hogs 0,2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT, table

MADTRACE = [sys.executable, "-m", "madtrace.cli.main"]
PYTHON = "/usr/bin/python3.11"


def one_run(hogs: int, work: str) -> tuple[float, float]:
    """(the longest stop of the instrument, the attach's pause), in ms."""
    server = subprocess.Popen(
        [PYTHON, "-m", "http.server", "--bind", "127.0.0.1", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=work,
    )
    server.stdout.readline()  # "Serving HTTP on ...": it listens
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
    out = os.path.join(work, "t")
    try:
        time.sleep(0.3)
        for words in (
            ["daemon", str(server.pid), "-q", "-o", out],
            ["ctl", str(server.pid), "instrument", "PyDict_*"],
        ):
            subprocess.run([*MADTRACE, *words], check=True, capture_output=True, cwd=ROOT)
        status = json.loads(
            subprocess.run(
                [*MADTRACE, "ctl", str(server.pid), "status", "--json"],
                check=True,
                capture_output=True,
                cwd=ROOT,
            ).stdout
        )
        subprocess.run([*MADTRACE, "ctl", str(server.pid), "stop"], capture_output=True, cwd=ROOT)
        return max(status["last_stops_ms"]), float(status.get("attach_pause_ms") or 0.0)
    finally:
        for hog in busy:
            hog.kill()
        server.kill()
        server.wait()
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hogs", default="0,2")
    args = parser.parse_args()
    hogs = [int(h) for h in args.hogs.split(",")]
    stops: dict[int, list[tuple[float, float]]] = {h: [] for h in hogs}
    work = tempfile.mkdtemp(prefix="madtrace-stop-bench-")
    try:
        for _ in range(args.runs):
            for h in hogs:
                stops[h].append(one_run(h, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for h, runs in stops.items():
        longest = [s for s, _ in runs]
        attach = [a for _, a in runs]
        rows.append(
            (
                str(h),
                f"{statistics.median(longest):.2f}",
                f"{max(longest):.2f}",
                f"{statistics.median(attach):.2f}",
                f"{max(attach):.2f}",
            )
        )
    print(
        table(
            f"instrument 'PyDict_*' attached to http.server: the target's stops (ms), {args.runs} runs",
            rows,
            ("CPU hogs", "longest stop, median", "max", "attach pause, median", "max"),
        )
    )


if __name__ == "__main__":
    main()
