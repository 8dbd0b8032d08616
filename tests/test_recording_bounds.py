# SPDX-License-Identifier: GPL-2.0-or-later
"""Bounded recordings: record --max-size SIZE stops once the trace holds SIZE
bytes, --for SECONDS after that long; madtrace detaches and the program runs
on untraced.

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


def test_for_seconds_stops_the_recording(tmp_path):
    argv = [prog("data_kernels", "O2-pie"), "matmul", "400"]
    out = str(tmp_path / "t")
    r = madtrace("record", "--data", "--for", "0.5", "-o", out, "--", *argv, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(argv).stdout
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert meta["outcome"] == "detached" and meta["stop_reason"] == "duration"
    assert 0.4 < meta["end_time"] - meta["start_time"] < 30
    one_line_error(madtrace("record", "--for", "0", "-o", str(tmp_path / "u"), "--", *argv), 2,
                   "must be a positive number of seconds")


def test_start_after_attaches_to_the_running_program(tmp_path):
    """--start-after: the program runs untraced, then is attached to and recorded
    (with --for, for a window; without, to its end); its output is its own."""
    long = [prog("data_sharing", "O2-pie"), "1500000000"]     # about 4 s untraced
    out = str(tmp_path / "window")
    r = madtrace("record", "--data", "-f", "left", "--start-after", "0.5", "--for", "0.5", "-o", out,
                 "--", *long, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(long).stdout
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert (meta["mode"], meta["outcome"], meta["stop_reason"]) == ("attach", "detached", "duration")
    summary = summary_json(out)
    assert sum(c["L"] + c["S"] for c in summary["accesses"].values()) > 0
    # left() was running when madtrace attached: its exit, if seen, has no entry
    assert summary["calls"].get("left", 0) == 0
    short = [prog("data_sharing", "O2-pie"), "150000000"]     # about 0.4 s untraced
    out = str(tmp_path / "to-the-end")         # calls only: to the end in a moment
    r = madtrace("record", "-f", "left", "--start-after", "0.05", "-o", out, "--", *short, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(short).stdout
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    assert (meta["mode"], meta["outcome"], meta["exit_status"]) == ("attach", "exited", 0)
    # a program that ends first: its status, and nothing recorded
    quick = [prog("data_kernels", "O2-pie"), "matmul", "10"]
    r = madtrace("record", "--start-after", "5", "-o", str(tmp_path / "none"), "--", *quick)
    assert r.returncode == 0 and b"nothing recorded" in r.stderr
    assert not os.path.exists(tmp_path / "none")
    one_line_error(madtrace("record", "--start-after", "0", "-o", str(tmp_path / "x"), "--", *quick),
                   2, "--start-after must be a positive")


def test_every_period_records_windows(tmp_path):
    """--every PERIOD --for SECONDS: windows of a long run, each a whole trace
    directory (DIR, DIR/window.2...), the program untraced in between and its
    output its own."""
    long = [prog("data_sharing", "O2-pie"), "600000000"]      # about 1.7 s untraced
    out = str(tmp_path / "t")
    r = madtrace("record", "--data", "--every", "0.4", "--for", "0.1", "-o", out, "--", *long,
                 timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout == run_untraced(long).stdout
    with open(os.path.join(out, "meta.json")) as f:
        windows = json.load(f)["windows"]
    assert len(windows) >= 2 and windows[0]["directory"] == "."
    starts = [w["start_time"] for w in windows]
    # each window lasts --for; the next starts at its period's time, or at once when it is late
    assert starts == sorted(starts) and all(b - a >= 0.1 for a, b in zip(starts, starts[1:])), starts
    for w in windows:
        # a whole window has accesses; the last may meet the program's exit at its start
        if w["outcome"] == "detached":
            directory = os.path.join(out, w["directory"])
            assert sum(c["L"] + c["S"] for c in summary_json(directory)["accesses"].values()) > 0, w
    assert windows[0]["outcome"] == "detached", windows
    argv = [prog("data_kernels", "O2-pie"), "matmul", "10"]
    one_line_error(madtrace("record", "--every", "1", "-o", str(tmp_path / "a"), "--", *argv), 2,
                   "--every needs --for")
    one_line_error(madtrace("record", "--every", "1", "--for", "2", "-o", str(tmp_path / "b"), "--",
                            *argv), 2, "--every must be longer than --for")
