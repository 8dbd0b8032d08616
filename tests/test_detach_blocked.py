# SPDX-License-Identifier: GPL-2.0-or-later
"""A detach while threads are blocked in system calls on traced memory: under
the hybrid engine their pointers reach the alias for the call (data_syscalls.py
_redirect), and a stop interrupts the call, which the kernel restarts after the
detach, when the alias is gone. The restart must use the program's own
pointers: a read into a global buffer and a timed condition wait on a global
go on as if madtrace had never been there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from .util import MADTRACE, ROOT, large_anonymous_maps, madtrace_maps, prog, read_line


@pytest.mark.parametrize("engine,variant", [("hybrid", "O0-pie"), ("hybrid", "O2-nopie"),
                                            ("fault", "O2-pie")])
def test_detach_while_blocked_in_calls_on_traced_memory(tmp_path, engine, variant):
    out = tmp_path / "t"
    tracer = subprocess.Popen([*MADTRACE, "record", "--data", "--no-functions", "--data-engine",
                               engine, "-o", str(out), "--", prog("blocked_detach", variant)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert read_line(tracer, timeout=120) == b"ready\n"
        for word in (b"one", b"two"):
            tracer.stdin.write(word + b"\n")
            tracer.stdin.flush()
            assert read_line(tracer, timeout=120) == b"got " + word + b"\n"
        time.sleep(0.5)             # both threads blocked: read(0, line), the timed wait
        tracer.send_signal(signal.SIGTERM)          # a detach: the program goes on untraced
        deadline, meta = time.monotonic() + 120, {"outcome": "running"}
        while meta["outcome"] == "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            meta = json.loads((out / "meta.json").read_text())
        assert meta["outcome"] == "detached" and meta["released"]["kept"] == [], meta["released"]
        if engine == "hybrid":     # the wait restarted after a stop ran on the alias too
            assert meta["data_tracing"]["syscalls_opened"] == 0, meta["data_tracing"]
        target = meta["pid"]        # nothing of madtrace's stays mapped, the bitmap neither
        assert madtrace_maps(target) == [] and large_anonymous_maps(target) == []
        tracer.stdin.write(b"three\n")
        tracer.stdin.flush()
        assert read_line(tracer, timeout=60) == b"got three\n"
        tracer.stdin.write(b"quit\n")
        tracer.stdin.flush()
        assert read_line(tracer, timeout=60) == b"bye\n"
        tracer.stdin.close()
        assert tracer.wait(timeout=60) == 0, tracer.stderr.read()
    finally:
        if tracer.poll() is None:
            tracer.kill()
