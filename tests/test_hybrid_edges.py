# SPDX-License-Identifier: GPL-2.0-or-later
"""Two hybrid-engine cases found on the machine's bash running pyenv's script
(`madtrace record --data -- bash pyenv exec python3 ...` died of SIGSEGV, and
with no copies madtrace stopped with "cannot read ... bytes"), each reduced to
a test program.  Oracle: the program's own output, untraced."""

from __future__ import annotations

import json

import pytest

from .util import madtrace, prog, run_untraced


def record(tmp_path, argv):
    out = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "--no-functions", "--no-store", "-o", str(out),
                      "--", *argv, timeout=300)
    return result, json.loads((out / "meta.json").read_text())


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_the_heap_grown_while_traced_is_in_a_fork_child(tmp_path, variant):
    """The aliased heap grows (brk), then the program forks: the grown pages
    (mremap'd from the alias image, which is MADV_DONTFORK) must be copied into
    the child (alias.py extend: MADV_DOFORK).  Before: madtrace stopped with
    "cannot read N bytes", and the child died of SIGSEGV."""
    argv = [prog("fork_brk", variant), "256"]
    native = run_untraced(argv)
    result, _ = record(tmp_path, argv)
    assert (result.returncode, result.stdout) == (native.returncode, native.stdout), result.stderr


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_a_jump_into_the_first_bytes_of_a_copied_function_keeps_its_entry(tmp_path, variant):
    """jumper_fn jumps to target_fn + 3 (glibc's mempcpy into memmove): target_fn
    is copied (it touches a global) but its entry keeps its bytes
    (entry_redirect.py: the module's direct branches into them).  Before: the
    5-byte jump to the copy was written over them, and the program died."""
    argv = [prog("entry_jump_in", variant), "200000"]
    native = run_untraced(argv)
    result, meta = record(tmp_path, argv)
    assert (result.returncode, result.stdout) == (native.returncode, native.stdout), result.stderr
    rewriter = meta["data_tracing"]["paths"]["rewriter"]
    assert rewriter.get("entry not redirected: a branch of another function targets its first "
                        "bytes", 0) >= 1, rewriter
