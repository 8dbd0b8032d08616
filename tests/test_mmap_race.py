# SPDX-License-Identifier: GPL-2.0-or-later
"""Threads that map, use and unmap memory side by side (tests/progs/data_mmap_race.c):
the kernel gives one thread the pages another has just unmapped, and the
tracer may handle the second thread's mmap before the first one's munmap
(each thread waits at the end of its own call only).  The munmap then must
not forget the pages the mmap made (data/syscalls.py ``_gone``): forgotten,
they stayed closed to the program and it died of SIGSEGV in every run.

Oracles: the program's output, byte-identical to an untraced run, in every
run; its own count of accesses to its mappings (each round stores to and
loads from each of its 4 pages once); no fatal signal in meta.json."""

from __future__ import annotations

import json
import subprocess

import pytest

from madtrace.trace.query import connect

from .util import madtrace, prog

THREADS, ROUNDS, PAGES = 4, 300, 4


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_threads_mapping_and_unmapping_side_by_side(tmp_path, variant):
    argv = [prog("data_mmap_race", variant), str(THREADS), str(ROUNDS)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    assert native.returncode == 0
    for run in range(3):
        out = tmp_path / str(run)
        result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), "--",
                          *argv, timeout=300)
        assert (result.returncode, result.stdout) == (0, native.stdout), (run, result.stderr)
        meta = json.loads((out / "meta.json").read_text())
        assert "faults_delivered" not in meta
        kinds = dict(connect(str(out)).execute(
            "SELECT kind, count(*) FROM accesses WHERE region LIKE '[anon %' "
            "AND instruction LIKE 'worker+%' GROUP BY kind").fetchall())
        assert kinds == {"L": THREADS * ROUNDS * PAGES, "S": THREADS * ROUNDS * PAGES}, run
