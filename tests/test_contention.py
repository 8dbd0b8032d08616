# SPDX-License-Identifier: GPL-2.0-or-later
"""No access escapes while a system call waits on traced memory (issue 14 item 7).

tests/progs/data_contend:
* ``mutex``: 4 threads each add into a global counter 4 times under a pthread
  mutex on the same .bss page as the counter, holding it 2 ms, so the others
  block in futex on a traced word.  Before, a thread blocked in futex held
  the page open and the others' accesses to it were lost silently (16, 2,
  16, 14, 15, 16, 7, 16 executions of the add in 8 runs).
* ``pipe``: a thread blocks in read() on a pipe into a buffer of a traced
  page while 3 threads store into that page.
Both run many times under ``record --data`` (the default engine; the hybrid
engine reaches the memory a system call names through its alias, so no page
is ever opened), and every run must equal valgrind lackey per instruction of
the executable (lackey runs once: these counts do not depend on the
interleaving) and the program's own output."""

from __future__ import annotations

import subprocess

import pytest

from madtrace.binary.elf import ElfImage

from .oracles import lackey_accesses
from .test_data import madtrace_accesses, named_like_madtrace, sections
from .util import prog


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
        accesses, meta, stdout = madtrace_accesses(tmp_path / str(run), argv)
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
