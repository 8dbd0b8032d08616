# SPDX-License-Identifier: GPL-2.0-or-later
"""Fault engine: a page opened for one thread's system call while another
thread runs.  A fault the other thread took just before the page opened,
reported after, was redirected to its data slot: the thread went on with the
page open, and the slot's write-back at a later stop undid its own later store
there (tests/progs/blocked_detach's mutex was left unlocked with an owner:
glibc's "__owner == 0" assertion, SIGABRT, after the detach).  Such a fault now
takes the slow path (the loop's table leaves out the pages held open)."""

from __future__ import annotations

import os
import subprocess

import pytest

from .util import MADTRACE, ROOT, prog


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_store_not_undone_by_a_slot_while_a_call_has_the_page_open(tmp_path, variant):
    r = subprocess.run([*MADTRACE, "record", "--data", "--no-functions", "--data-engine", "fault",
                        "-o", str(tmp_path / "t"), "--", prog("data_open_window", variant), "500"],
                       capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    out = r.stdout.decode()
    assert r.returncode == 0 and "errors 0 " in out, (out, r.stderr.decode()[-2000:])
