# SPDX-License-Identifier: GPL-2.0-or-later
"""What a recording says while the target runs (madtrace/recording/status_line.py).

Contract exercised:
  madtrace record --data -o DIR -- PROG ARGS   on a terminal (a pty) and not
  status_line.status_text(elapsed, counts, rate)

Oracles: the program's own output, whole and in order, on the same terminal;
the terminal given back (its scroll region reset); nothing of the line when
stderr is a pipe or with -q; the trace's own access count as an upper bound
of what the line said.
"""

from __future__ import annotations

import re

import pexpect

from madtrace.recording.status_line import status_text

from .util import ROOT, madtrace, prog, summary_json

ESC = "\x1b"


def test_status_text():
    line = status_text(12.4, {"call_records": 3_402_118, "accesses": 45_200_000, "on_faults": 12_044,
                              "relocated": 123, "dropped": 0}, 3_600_000.0)
    assert line == ("madtrace: recording 12 s: 3.4 M call records, 45.2 M accesses (3.6 M/s, "
                    "12,044 on faults), 123 relocated, 0 dropped")
    assert status_text(2, {"accesses": 10, "on_faults": 10}, None) == \
        "madtrace: recording 2 s: 10 accesses (10 on faults)"


def test_status_line_on_a_terminal(tmp_path):
    # the line comes after the first second: the program runs about 3 s traced
    out = str(tmp_path / "t")
    child = pexpect.spawn(f"{ROOT}/.venv/bin/python", ["-m", "madtrace.cli.main", "record", "--data",
                          "-o", out, "--", prog("data_kernels", "O2-pie"), "matmul", "400"],
                          cwd=ROOT, timeout=300, encoding="utf-8", dimensions=(30, 200))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    text = child.before
    lines = re.findall(r"\x1b\[30;1H\x1b\[K(madtrace: recording [^\x1b]*)\x1b8", text)
    assert lines, text[-2000:]
    said = [int(float(m.group(1)) * (1e6 if m.group(2) else 1)) for m in
            (re.search(r"([\d.,]+?)( M)? accesses", line.replace(",", "")) for line in lines) if m]
    assert said and said == sorted(said)
    total = sum(c["L"] + c["S"] for c in summary_json(out)["accesses"].values())
    assert said[-1] <= total * 1.01       # "53.1 M" rounds
    # the region claimed, then given back with the last row cleared, once
    assert text.count(f"{ESC}[1;29r") == 1 and text.count(f"{ESC}[r") == 1
    assert text.index(f"{ESC}[1;29r") < text.index(lines[0]) < text.index(f"{ESC}[r")
    # the program's output, whole, between them (it scrolls above the status row)
    assert "matmul 400: " in text


def test_no_status_line_without_a_terminal(tmp_path):
    for quiet in ([], ["-q"]):
        out = str(tmp_path / f"t{len(quiet)}")
        r = madtrace("record", *quiet, "--data", "-o", out, "--", prog("data_kernels", "O2-pie"),
                     "matmul", "200")
        assert r.returncode == 0, r.stderr
        assert b"recording " not in r.stderr and b"\x1b[" not in r.stderr
