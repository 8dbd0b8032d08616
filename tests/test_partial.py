# SPDX-License-Identifier: GPL-2.0-or-later
"""A recording whose tracer was killed is still a trace: what reached the disk.

madtrace record is SIGKILLed while the target runs (function and data
tracing); the target still finishes with its own output (the guard in it
undoes madtrace), and summary, query, report and export read the directory:
outcome "tracer killed", partial, the calls counted from the records on disk,
with one line on stderr saying so."""

from __future__ import annotations

import json
import os
import subprocess
import time

import numpy as np
import pytest

from madtrace.trace.format import RECORD_DTYPE

from .test_capture_file import naive_chunks
from .util import MADTRACE, ROOT, check_live_output, madtrace, prog, read_line

PATIENCE = 120.0


def _entries_on_disk(records, writing: bool = False) -> int:
    """Entry records in the complete chunks of the call record files (``writing``:
    while they are written, a file without its header yet counts none)."""
    entries = 0
    for rec in records.glob("*.rec"):
        data = rec.read_bytes()
        if writing and not data.startswith(b"MADTRACE"):
            continue
        for at, n in naive_chunks(rec)[0]:
            codes = np.frombuffer(data[at + 16:at + 16 + n], dtype=RECORD_DTYPE)["code"]
            entries += int(np.count_nonzero((codes & 1) == 0))
    return entries


@pytest.mark.parametrize("data", [[], ["--data"]])
def test_killed_recording_is_readable(tmp_path, data):
    out = tmp_path / "t"
    argv = [prog("live_calls", "O2-pie")]
    tracer = subprocess.Popen([*MADTRACE, "record", "-q", *data, "-f", "tick", "-f", "tock",
                               "-o", str(out), "--", *argv], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert read_line(tracer, PATIENCE) == b"ready\n"
        records = out / "calls"
        deadline = time.monotonic() + PATIENCE
        # both functions' entries in complete chunks on disk (a first chunk can hold
        # tick's entry alone)
        while not (records.is_dir() and _entries_on_disk(records, writing=True) >= 4):
            assert time.monotonic() < deadline, "no call records reached the disk"
            time.sleep(0.05)
        with open(out / "meta.json") as f:
            running = json.load(f)
        assert running["outcome"] == "running"
        target = running["pid"]
        tracer.kill()                    # SIGKILL: no cleanup of any kind
        tracer.wait(timeout=PATIENCE)
        # the target runs on untraced; closing its stdin ends it after its round
        tracer.stdin.close()
        deadline = time.monotonic() + PATIENCE
        while os.path.exists(f"/proc/{target}") and \
                open(f"/proc/{target}/stat").read().split()[2] != "Z":
            assert time.monotonic() < deadline, "the target did not finish"
            time.sleep(0.05)
        output = tracer.stdout.read()
    finally:
        tracer.kill()
    check_live_output(argv[0], output)
    result = madtrace("summary", str(out), "--json")
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.decode().splitlines() if "cut short" in line]
    assert notes == [f"madtrace: {out}: the recording was cut short (its tracer was killed): "
                     "a partial trace, the counts of what reached the disk"]
    summary = json.loads(result.stdout)
    assert summary["outcome"] == "tracer killed" and summary["partial"] is True
    assert summary["calls"]["tick"] > 0 and summary["calls"]["tock"] > 0
    # the counts are those of the complete chunks on disk (a naive walk of the
    # capture container: tests/test_capture_file.py)
    assert sum(summary["calls"].values()) == _entries_on_disk(out / "calls")
    query = madtrace("query", str(out), "SELECT function, count(*) FROM calls GROUP BY 1 ORDER BY 1",
                     "--json")
    assert query.returncode == 0, query.stderr
    counts = {row["function"]: row["count_star()"] for row in json.loads(query.stdout)}
    # every call on disk, also those open when the tracer died
    assert counts["tick"] >= summary["calls"]["tick"] - 1
    for args in (["report", str(out), "--kind", "calls"],
                 ["export", str(out), "--format", "chrome", "-o", str(tmp_path / "t.json")]):
        done = madtrace(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert b"Traceback" not in done.stderr
