# SPDX-License-Identifier: GPL-2.0-or-later
"""Detaching while the target's only thread may be stopped at a vfork event.

tests/progs/vfork_loop vforks all the time from its one thread (the child
_exits at once), storing into a global and a heap block between vforks.  A
daemon attaches, turns data tracing on (each engine), lets it run and stops,
several times.  A detach's stop then finds that thread at its vfork event
stop in most cycles (5-7 of 10 when this test was written): no thread of the
process could run the system calls that restore the data engine and take
madtrace's mappings out (the child waits to run), so the protections, the
alias and the data area stayed, and the program died of SIGSEGV soon after.
The vfork now runs on to its vfork-done stop first (Controller.settle).
Oracles: the program's own checks of every vfork and its checksum, exit 0;
after each cycle no madtrace mapping in /proc/PID/maps, nothing kept
(meta.json ``released.kept``) and no restore that failed (``detach_failures``:
before, the data engine's failure was swallowed)."""

from __future__ import annotations

import json
import os
import time

import pytest

from .test_daemon import run, start_daemon, wait_gone
from .util import madtrace_maps, prog, start_ready

CYCLES = 8


@pytest.mark.parametrize("engine, variant", [("fault", "O2-nopie"), ("hybrid", "O0-pie")])
def test_detach_while_vforking_restores_everything(tmp_path, engine, variant, monkeypatch):
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", engine)
    runtime = str(tmp_path / "run")
    os.mkdir(runtime)
    target = start_ready([prog("vfork_loop", variant), "0", "ready"])
    try:
        for cycle in range(CYCLES):
            out = tmp_path / f"t{cycle}"
            daemon = start_daemon(runtime, target.pid, out)
            for words in (["trace", "data", "on"], None, ["stop"]):
                if words is None:
                    time.sleep(0.3)      # the target runs, data traced
                    continue
                result = run(runtime, "ctl", str(target.pid), *words)
                assert result.returncode == 0, (cycle, words, result.stderr.decode())
            wait_gone(daemon)
            assert target.poll() is None, f"target died in cycle {cycle}"
            assert madtrace_maps(target.pid) == [], cycle
            meta = json.loads((out / "meta.json").read_text())
            assert meta["outcome"] == "detached"
            assert meta["released"]["kept"] == [], (cycle, meta["released"])
            assert "detach_failures" not in meta, (cycle, meta["detach_failures"])
            assert meta["data_tracing"]["engine"] == engine
        out, _ = target.communicate(b"\n", timeout=120)
    finally:
        target.kill()
    assert target.returncode == 0, out
    assert out == b"rounds some checksum ok\n"
