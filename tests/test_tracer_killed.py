# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer SIGKILLed while a thread is lent to one of its remote system calls.

A remote call gives the thread the call's registers; with no tracer left, the
call page's restore code gives it back the registers saved at the scope's
start (process/call_page.py).  Those registers must be a place the program
can go on from without its tracer:

* at a --data-in function's entry breakpoint, the gate protects the pages
  (mprotect) before the function runs; the thread stood one byte after the
  int3, in the middle of the function's first instruction: bench_data_memory's
  ``mov checksum(%rip), %ecx`` ran as ``or eax, imm32`` and the program printed
  a wrong checksum (1 kill in 10 of the random kills of test_data);
* at the gate's return trap, the pages go back (mprotect): the thread stood
  one byte after the trap and the program died;
* at the entry-point stub (launch), the stub page is unmapped while the thread
  was still in it: the program died;
* just after the tracer took the stop of a breakpoint or a return trap: the
  kernel never delivers that SIGTRAP again, so the thread resumed one byte
  after the int3 (the middle of the instruction, or the next trap).  Each
  breakpoint now covers its whole first instruction with int3s, each trap is
  two: the thread meets another int3 and the guard sends it back.

``MADTRACE_TEST_KILL_AT=POINT:N`` makes the tracer kill itself the Nth time it
reaches POINT (process/kill_points.py).  Oracle: the program's own output,
byte for byte, and where each kill happened (stderr).
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from .util import MADTRACE, ROOT, prog

ARGV = [prog("bench_data_memory", "O2-nopie"), "20", "4096"]


def killed_at(tmp_path, call: str, *options: str) -> tuple[subprocess.CompletedProcess, int]:
    """A recording whose tracer kills itself at kill point ``call``; returns it and
    the address it names (where the lent or stopped thread was)."""
    env = dict(os.environ, PYTHONPATH=ROOT, MADTRACE_TEST_KILL_AT=call)
    # the program inherits the tracer's stdout: its output ends when it does
    result = subprocess.run([*MADTRACE, "record", "--data", *options, "-o", str(tmp_path / "t"),
                             "--", *ARGV], capture_output=True, timeout=120, env=env)
    match = re.search(rb"test kill at \S+ #\d+ \(thread \d+ (?:lent from|at) (0x[0-9a-f]+)\)",
                      result.stderr)
    assert match, (call, result.stderr[-2000:])          # the kill happened where asked
    assert result.returncode == -9
    return result, int(match.group(1), 16)


def function_address(path: str, name: str) -> int:
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    return next(int(f[0], 16) for f in (line.split() for line in out.splitlines()) if f[-1] == name)


@pytest.mark.parametrize("nth", range(1, 7))
def test_killed_in_a_data_in_gate_call_leaves_the_program_right(tmp_path, nth):
    """The gate's first calls: the arm at pass's entry (mprotect 1: every page,
    2-3: the slow path opening and closing the page of ``checksum``, the
    instruction under the breakpoint), the disarm at its return trap (4-6)."""
    native = subprocess.run(ARGV, capture_output=True, timeout=60)
    result, lent_from = killed_at(tmp_path, f"mprotect:{nth}", "--data-in", "pass", "-f", "fill")
    assert result.stdout == native.stdout
    if nth == 1:
        # the thread was lent from the breakpoint itself, not from the byte after it
        assert lent_from == function_address(ARGV[0], "pass")


def test_killed_while_the_entry_stub_goes_leaves_the_program_right(tmp_path):
    native = subprocess.run(ARGV, capture_output=True, timeout=60)
    result, lent_from = killed_at(tmp_path, "munmap:1")
    assert result.stdout == native.stdout
    # lent from the program's entry point, not from the stub being unmapped
    assert lent_from == function_address(ARGV[0], "_start")


@pytest.mark.parametrize("point", ["breakpoint:1", "breakpoint:2", "return-trap:1",
                                   "return-trap:2"])
def test_killed_after_taking_a_hook_stop_leaves_the_program_right(tmp_path, point):
    """The stop of pass's entry breakpoint or of its return trap taken, then the
    tracer dies: the thread runs on one byte after the int3."""
    native = subprocess.run(ARGV, capture_output=True, timeout=60)
    result, at = killed_at(tmp_path, point, "--data-in", "pass", "-f", "fill")
    assert result.stdout == native.stdout
    if point.startswith("breakpoint"):
        assert at == function_address(ARGV[0], "pass")


@pytest.mark.parametrize("call", ["memfd_create:1", "ftruncate:1", "mmap:1", "close:1"])
def test_killed_while_the_call_page_is_mapped_leaves_the_program_right(tmp_path, call):
    """The first calls in a new image map the call page itself: made through a
    ``syscall; ret`` with the entry pushed, a thread left there by a dead tracer
    returns to the image's entry (the dynamic loader's) and the program runs."""
    native = subprocess.run(ARGV, capture_output=True, timeout=60)
    env = dict(os.environ, PYTHONPATH=ROOT, MADTRACE_TEST_KILL_AT=call)
    result = subprocess.run([*MADTRACE, "record", "--data", "-o", str(tmp_path / "t"), "--", *ARGV],
                            capture_output=True, timeout=120, env=env)
    assert re.search(rb"test kill at \S+ #1 \(thread \d+ lent from", result.stderr), result.stderr
    assert result.stdout == native.stdout
