# SPDX-License-Identifier: GPL-2.0-or-later
"""No access escapes while a system call waits on traced memory.

tests/progs/data_contend:
* ``mutex``: 4 threads each add into a global counter 4 times under a pthread
  mutex on the same .bss page as the counter, holding it 2 ms, so the others
  block in futex on a traced word.  Before, a thread blocked in futex held
  the page open and the others' accesses to it were lost silently (16, 2,
  16, 14, 15, 16, 7, 16 executions of the add in 8 runs).
* ``pipe``: a thread blocks in read() on a pipe into a buffer of a traced
  page while 3 threads store into that page.
Both run many times under ``record --data --data-engine hybrid`` (the hybrid
engine reaches the memory a system call, memcpy or memset names through its
alias, so no page is ever opened), and every run must equal valgrind lackey
per instruction of the executable (lackey runs once: these counts do not
depend on the interleaving) and the program's own output.  The fault engine
cannot keep the page closed while futex waits: it must say so (a warning with
the windows and their pages, meta.json ``open_windows``)."""

from __future__ import annotations

import json
import subprocess

import pytest

from madtrace.binary.elf import ElfImage

from .oracles import lackey_accesses
from .test_data import madtrace_accesses, named_like_madtrace, sections
from .util import madtrace, prog

HYBRID = ("--data-engine", "hybrid")


def runs_equal_lackey(tmp_path, variant: str, mode: str, runs: int) -> list[dict]:
    path = prog("data_contend", variant)
    argv = [path, mode]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    assert native.returncode == 0, native.stdout
    text = ElfImage.load(path).section(".text")
    oracle = lackey_accesses(argv, (text.address, text.address + text.size),
                             sections(path, ".data", ".bss"))
    metas = []
    for run in range(runs):
        accesses, meta, stdout = madtrace_accesses(tmp_path / str(run), argv, HYBRID)
        assert stdout == native.stdout, run
        got, expected = named_like_madtrace(path, oracle, accesses)
        assert got == expected, (run, meta["data_tracing"])
        assert meta["dropped_events"] == 0
        metas.append(meta)
    return metas


@pytest.mark.parametrize("variant, runs", [("O2-nopie", 20), ("O0-nopie", 4)])
def test_mutex_on_the_page_of_its_counter(tmp_path, variant, runs):
    metas = runs_equal_lackey(tmp_path, variant, "mutex", runs)
    # the threads did block on the traced lock, and no page was opened for it
    assert any(m["data_tracing"].get("syscalls_redirected", 0) > 0 for m in metas)
    assert all(m["data_tracing"]["open_windows"] == 0 for m in metas)


@pytest.mark.parametrize("variant, runs", [("O2-nopie", 10), ("O0-nopie", 4)])
def test_read_blocked_into_a_page_others_write(tmp_path, variant, runs):
    metas = runs_equal_lackey(tmp_path, variant, "pipe", runs)
    assert all(m["data_tracing"]["open_windows"] == 0 for m in metas)


def test_fault_engine_says_what_it_may_have_missed(tmp_path):
    out = tmp_path / "t"
    result = madtrace("record", "--data", "--data-engine", "fault", "--no-functions", "-o", str(out),
                      "--", prog("data_contend", "O2-nopie"), "mutex", timeout=300)
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())["data_tracing"]
    assert meta["open_windows"] > 0 and meta["open_window_pages"], meta
    warning = [line for line in result.stderr.decode().splitlines() if "may be missing" in line]
    assert len(warning) == 1 and f"{meta['open_windows']} times" in warning[0], result.stderr
    shown = madtrace("summary", str(out))
    summary = (shown.stdout + shown.stderr).decode()
    assert "warning" in summary and "may be missing" in summary, summary
    # the page of the mutex and its counter (nm: the program's one aligned struct)
    nm = subprocess.run(["nm", prog("data_contend", "O2-nopie")], capture_output=True, text=True)
    page = next(int(line.split()[0], 16) for line in nm.stdout.splitlines() if line.endswith(" page"))
    assert f"{page:#x}" in meta["open_window_pages"], meta
