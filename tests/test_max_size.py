# SPDX-License-Identifier: GPL-2.0-or-later
"""record --max-size SIZE: the recording stops once the trace holds SIZE bytes,
madtrace detaches and the program runs on untraced.

Oracles: the trace directory's size on disk, meta.json's stop_reason, the
program's own output (the same as untraced: it finished correctly after the
detach), and the trace still read whole by summary and report.
"""

from __future__ import annotations

import json
import os

from .util import madtrace, one_line_error, prog, run_untraced, summary_json

MB = 1 << 20


def size_of(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def test_max_size_stops_the_recording(tmp_path):
    argv = [prog("data_kernels", "O2-pie"), "matmul", "400"]
    out = str(tmp_path / "t")
    r = madtrace("record", "--data", "--max-size", "4M", "-o", out, "--", *argv, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(argv).stdout
    assert b"reached --max-size" in r.stderr
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert meta["outcome"] == "detached" and meta["stop_reason"] == "max-size"
    # checked every 50 ms: what the drain wrote in that time is the slack
    assert 4 * MB <= size_of(out) <= 24 * MB, size_of(out)
    counted = sum(c["L"] + c["S"] for c in summary_json(out)["accesses"].values())
    # matmul 400 makes about 128 M accesses: far from all were recorded
    assert 0 < counted < 100_000_000
    assert madtrace("report", out, "--kind", "heatmap", "--json").returncode == 0


def test_max_size_errors(tmp_path):
    for bad in ("lots", "0", "-5M", "3X"):
        one_line_error(madtrace("record", "--max-size", bad, "-o", str(tmp_path / "t"), "--",
                                prog("data_kernels", "O2-pie")), 2, "--max-size")
