# SPDX-License-Identifier: GPL-2.0-or-later
"""Static executables (``-static`` and ``-static-pie``): no loader, and no
thread pointer until the C library sets one (``arch_prctl(ARCH_SET_FS)``);
their main thread's TCB then lies in the brk heap, a traced region.

Before, a launched static program died with SIGSEGV: madtrace's stubs read
the thread pointer's first word (%fs:0) before there was one, and with data
tracing that word's page was protected.

Oracles: the program's own output, byte for byte; callgrind's call counts; lackey's
loads and stores per instruction of the program's own functions."""

from __future__ import annotations

import json
import subprocess

import pytest

from .oracles import callgrind_calls
from .test_data import compare_with_lackey
from .util import madtrace, prog

STATIC = ["O2-static", "O2-static-pie"]


@pytest.mark.parametrize("variant", STATIC)
def test_calls_of_a_static_executable_equal_callgrind(tmp_path, variant):
    argv = [prog("calls_recursion", variant), "12", "101"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "-f", "fib", "-f", "is_even", "-f", "is_odd", "-f", "depth_sum",
                      "-o", str(tmp_path / "t"), "--", *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    with open(tmp_path / "t" / "meta.json") as f:
        calls = json.load(f)["calls"]
    expected = callgrind_calls(argv, ["fib", "is_even", "is_odd", "depth_sum"])
    assert {name: calls.get(name, 0) for name in expected} == expected
    assert calls["fib"] == 2 * 233 - 1          # fib(12): 2 F(13) - 1 entries


@pytest.mark.parametrize("variant", ["O2-static"])      # the oracle reads link-time addresses
def test_data_of_a_static_executable_equal_lackey(tmp_path, variant):
    """Globals per instruction as lackey sees them; the TCB's page is said to
    be left out, and nothing else is."""
    got = compare_with_lackey(tmp_path, "data_globals", variant, lambda static, stderr: static,
                              own={"fill", "sum", "count_vowels", "move_points"})
    assert sum(c["S"] for c in got.values()) > 50 and sum(c["L"] for c in got.values()) > 50
    with open(tmp_path / "t" / "meta.json") as f:
        meta = json.load(f)
    untraced = meta["data_tracing"]["untraced_pages"]
    assert len(untraced) == 1 and "TCB" in next(iter(untraced.values())), untraced
    assert meta["exit_status"] == 0 and meta["signals_forwarded"] == 0


@pytest.mark.parametrize("variant", STATIC)
def test_threads_of_a_static_executable(tmp_path, variant):
    """Threads whose TCBs are the C library's (mmap'd stacks, untraced), data
    and calls traced: the program's own checks pass and its output is the same."""
    argv = [prog("threads", variant)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    for options in ([], ["--data"]):
        out = tmp_path / ("d" if options else "f")
        result = madtrace("record", "-q", *options, "-o", str(out), "--", *argv, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout == native.stdout, options


def test_a_dynamic_executable_leaves_no_page_out(tmp_path):
    """The TCBs of a dynamic program are the loader's (mmap'd, untraced): no
    page is left out."""
    result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "t"), "--",
                      prog("data_globals", "O2-pie"), timeout=300)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "t" / "meta.json") as f:
        assert json.load(f)["data_tracing"]["untraced_pages"] == {}


NO_LIBC = r"""
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
int counter;
void _start(void) {
    for (int i = 0; i < 5; i++)
        counter++;
    sys3(1, 1, (long)"hi\n", 3);
    sys3(60, counter, 0, 0);
}
"""


def test_a_static_executable_without_a_thread_pointer_runs_untraced_and_says_so(tmp_path):
    """No C library, no arch_prctl(ARCH_SET_FS): the program runs to its end as
    it would, and the trace says it was not traced, and why."""
    source = tmp_path / "nolibc.c"
    source.write_text(NO_LIBC)
    binary = tmp_path / "nolibc"
    subprocess.run(["gcc", "-O1", "-static", "-nostdlib", "-o", str(binary), str(source)], check=True)
    native = subprocess.run([str(binary)], capture_output=True, timeout=60)
    assert (native.returncode, native.stdout) == (5, b"hi\n")
    result = madtrace("record", "--data", "-o", str(tmp_path / "t"), "--", str(binary), timeout=120)
    assert (result.returncode, result.stdout) == (5, b"hi\n")
    assert b"not traced: a static executable that never set its thread pointer" in result.stderr
    with open(tmp_path / "t" / "meta.json") as f:
        assert "thread pointer" in json.load(f)["untraced"]
    summary = madtrace("summary", str(tmp_path / "t"))
    assert b"untraced : a static executable" in summary.stdout
