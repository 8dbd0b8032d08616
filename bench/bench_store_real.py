# SPDX-License-Identifier: GPL-2.0-or-later
"""The first answers after a recording of a program nobody here wrote: Debian's
gzip compressing a generated text, every data access traced, as a user gets
them with the default options:

  record     madtrace record --data -o DIR -- gzip -c TEXT (the whole run)
  summary    madtrace summary DIR: its first run (no store: it counts from the
             raw capture)
  store      madtrace query DIR "SELECT 1" the first time: the store is built
             (the whole command: events/s, peak RSS)
  query      madtrace query DIR "SELECT region, kind, count(*) ..." (the store
             is there)
  floor      reading and decompressing the raw capture alone (events/s)

Side by side with the raw capture's size and the store's.  Each phase in its
own process (/usr/bin/time gives its wall time and peak RSS); ``--runs`` runs,
the median.

  reports    with --reports: each report kind (and the HTML page: every kind
             the trace has, in one pass over the accesses) on the last run's
             trace, once: wall time and peak RSS; with --trace DIR, on that
             trace (recorded before) alone, --runs times each, the median

  python bench/bench_store_real.py [--mb 5] [--runs 3] [--reports] [--keep DIR]
  python bench/bench_store_real.py --trace DIR [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import ROOT, table

sys.path.insert(0, ROOT)

REPORT_KINDS = ("heatmap", "alloc", "footprint", "numa", "source", "cache", "sharing", "reuse",
                "segments", "calls")
QUERY = "SELECT region, kind, count(*) FROM accesses GROUP BY ALL"
FLOOR = """
import sys, time
from madtrace.trace import compact
from madtrace.trace.record_files import ACCESS_RECORDS
t = time.monotonic(); n = 0
for _, path in ACCESS_RECORDS.files(sys.argv[1]):
    for _off, _raw, k, _planes in compact.iter_raw_blocks(path):
        n += k
print(n, time.monotonic() - t)
"""


def text(path: str, size: int) -> None:
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]
    with open(path, "w") as f:
        written = 0
        while written < size:
            line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
            f.write(line)
            written += len(line)


def timed(command: list[str], out=subprocess.DEVNULL, refused_ok: bool = False
          ) -> tuple[float, int, str]:
    """(wall s, peak RSS MB, stderr) of one command; ``refused_ok``: a command that
    refuses the trace (a report kind that needs what it lacks) gives (-1, 0, why)."""
    done = subprocess.run(["/usr/bin/time", "-f", "@@ %e %M", *command], stdout=out,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT)
    if done.returncode and refused_ok:
        return -1.0, 0, done.stderr.splitlines()[0] if done.stderr else ""
    if done.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    last = [line for line in done.stderr.splitlines() if line.startswith("@@ ")][-1].split()
    return float(last[1]), int(last[2]) // 1024, done.stderr


def time_reports(directory: str, runs: int = 1) -> list[tuple]:
    """(kind, seconds, peak RSS MB) of each report kind and of the HTML page on
    ``directory``: the median of ``runs``, the kinds one after the other in each
    run (so that a load on the machine falls on all of them alike); a kind the
    trace refuses: (kind, "refused", why)."""
    madtrace = [sys.executable, "-m", "madtrace.cli.main"]
    times: dict[str, list[tuple[float, int]]] = {}
    refused: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="madtrace-reports-") as work:
        page = os.path.join(work, "page.html")
        for _ in range(runs):
            for kind in (*REPORT_KINDS, "html (all kinds)"):
                if kind in refused:
                    continue
                command = [*madtrace, "report", directory, "--html", page, "--force"] \
                    if kind.startswith("html") else \
                    [*madtrace, "report", directory, "--kind", kind, "--json"]
                seconds, rss, why = timed(command, refused_ok=True)
                if seconds < 0:
                    refused[kind] = why.split(": ", 2)[-1][:60]
                else:
                    times.setdefault(kind, []).append((seconds, rss))
    out = []
    for kind in (*REPORT_KINDS, "html (all kinds)"):
        if kind in refused:
            out.append((kind, "refused", refused[kind]))
            continue
        seconds = [s for s, _ in times[kind]]
        spread = f" ({min(seconds):.1f}-{max(seconds):.1f})" if runs > 1 else ""
        out.append((kind, f"{statistics.median(seconds):.1f}{spread}",
                    int(statistics.median(r for _, r in times[kind]))))
    return out


def size_of(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=5.0, help="size of the text (MB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", help="keep the last trace directory here")
    parser.add_argument("--reports", action="store_true",
                        help="also time every report kind on the last run's trace")
    parser.add_argument("--trace", metavar="DIR",
                        help="only time every report kind on this trace (recorded before)")
    args = parser.parse_args()
    if args.trace:
        print(table(f"each report kind on {args.trace}: {args.runs} runs, the median (min-max)",
                    time_reports(args.trace, args.runs), ("kind", "s", "peak RSS MB")))
        return
    gzip = shutil.which("gzip")
    if gzip is None:
        raise SystemExit("gzip is not installed (Debian package gzip)")
    madtrace = [sys.executable, "-m", "madtrace.cli.main"]
    work = tempfile.mkdtemp(prefix="madtrace-store-real-")
    results: dict[str, list[float]] = {}
    reports: list[tuple] = []
    try:
        source = os.path.join(work, "text")
        text(source, int(args.mb * 1e6))
        native, _, _ = timed([gzip, "-c", source])
        for run in range(args.runs):
            directory = os.path.join(work, f"t{run}")
            record, record_rss, _ = timed([*madtrace, "record", "-q", "--data", "-o", directory,
                                           "--", gzip, "-c", source])
            summary, summary_rss, _ = timed([*madtrace, "summary", directory])
            raw = size_of(os.path.join(directory, "data"))
            floor = subprocess.run([sys.executable, "-c", FLOOR, directory], capture_output=True,
                                   text=True, cwd=ROOT, check=True).stdout.split()
            # the first query builds the store: a trivial one, so that the build is timed
            store, store_rss, _ = timed([*madtrace, "query", directory, "SELECT 1"])
            query, query_rss, _ = timed([*madtrace, "query", directory, QUERY])
            events = sum(c["L"] + c["S"] for c in __import__("json").load(
                open(os.path.join(directory, "meta.json")))["accesses"].values())
            stored = size_of(os.path.join(directory, "store"))
            for key, value in (("native s", native), ("record s", record),
                               ("summary s", summary), ("summary / record", summary / record),
                               ("summary RSS MB", summary_rss),
                               ("store build s", store),
                               ("store M events/s", events / store / 1e6),
                               ("store RSS MB", store_rss), ("query s", query),
                               ("query RSS MB", query_rss),
                               ("floor: decompress M records/s",
                                int(floor[0]) / float(floor[1]) / 1e6),
                               ("events M", events / 1e6), ("raw MB", raw / 1e6),
                               ("store MB", stored / 1e6), ("store / raw", stored / raw)):
                results.setdefault(key, []).append(value)
            if run == args.runs - 1 and args.reports:
                reports = time_reports(directory)
            if run < args.runs - 1 or not args.keep:
                shutil.rmtree(directory)
            else:
                shutil.rmtree(args.keep, ignore_errors=True)
                shutil.move(directory, args.keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"gzip -c of a {args.mb:g} MB text, every data access traced; {args.runs} runs, "
          "the median (min-max)")
    if args.reports:
        print(table("each report kind on the last run's trace", reports,
                    ("kind", "s", "peak RSS MB")))
    print(table("the first answers", [(k, f"{statistics.median(v):.2f}",
                                       f"{min(v):.2f}-{max(v):.2f}")
                 for k, v in results.items()], ("measurement", "median", "range")))


if __name__ == "__main__":
    main()
