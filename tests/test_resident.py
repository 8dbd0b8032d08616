# SPDX-License-Identifier: GPL-2.0-or-later
"""The resident madtrace process (``madtrace daemon --resident``): daemons forked
from it behave as those the command starts itself.

Oracles: the target's output, byte-identical to an untraced run; the tracer
of the target (/proc/PID/status TracerPid: the daemon, never the resident);
the exit codes and one-line errors of the command without a resident; the
trace directory read back by `madtrace summary`; the socket's permissions;
the resident's process and socket gone after SIGTERM and --stop-resident."""

from __future__ import annotations

import json
import os
import re
import signal
import stat

from .test_daemon import ctl_json, one_line, run, wait_gone
from .util import check_live_output, finish_live, prog, start_ready


def private_runtime(tmp_path) -> str:
    """The runtime directory (XDG_RUNTIME_DIR) of this test's resident and daemons."""
    (tmp_path / "run").mkdir()
    return str(tmp_path / "run")


def start_resident(runtime: str) -> int:
    result = run(runtime, "daemon", "--resident")
    assert result.returncode == 0, result.stderr
    pid = int(re.search(rb"resident process (\d+) is ready", result.stderr).group(1))
    sock = os.path.join(runtime, "madtrace", "resident.sock")
    assert stat.S_ISSOCK(os.stat(sock).st_mode) and stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert len(os.listdir(f"/proc/{pid}/task")) == 1      # it forks: one thread
    return pid


def tracer_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"TracerPid:\s+(\d+)", f.read()).group(1))


def test_daemons_forked_by_the_resident(tmp_path):
    runtime = private_runtime(tmp_path)
    resident = start_resident(runtime)
    again = run(runtime, "daemon", "--resident")
    assert again.returncode == 0 and f"{resident} already runs".encode() in again.stderr
    argv = [prog("live_calls", "O2-pie")]
    target = start_ready(argv)
    try:
        result = run(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t"))
        assert result.returncode == 0, result.stderr
        assert f"forked by the resident process {resident}".encode() in result.stderr
        daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
        assert tracer_of(target.pid) == daemon != resident
        assert tracer_of(resident) == 0
        # the same errors, codes and single lines as without the resident
        one_line(run(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t2")), 12,
                 "already traced")
        one_line(run(runtime, "daemon", "999999999", "-o", str(tmp_path / "x")), 11,
                 "no such process")
        one_line(run(runtime, "daemon", "nope"), 2, "not a PID")
        # relative output paths are the client's (its working directory goes along)
        result = run(runtime, "ctl", str(target.pid), "instrument", "tick")
        assert result.returncode == 0, result.stderr
        assert ctl_json(runtime, target.pid, "status")["functions_instrumented"] == 1
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        assert tracer_of(target.pid) == 0
        # a second daemon on the same target, with a relative output directory
        result = run(runtime, "daemon", str(target.pid), "-o", "rel", cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr
        daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
        assert os.path.exists(tmp_path / "rel" / "meta.json")
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        out = finish_live(target)
    finally:
        target.kill()
        stopped = run(runtime, "daemon", "--stop-resident")
    check_live_output(argv[0], out)
    assert stopped.returncode == 0 and f"resident process {resident} ended".encode() in stopped.stderr
    wait_gone(resident)
    assert not os.path.exists(os.path.join(runtime, "madtrace", "resident.sock"))
    summary = json.loads(run(runtime, "summary", str(tmp_path / "t"), "--json").stdout)
    assert summary["outcome"] == "detached"


def test_resident_ends_on_sigterm_and_the_command_falls_back(tmp_path):
    runtime = private_runtime(tmp_path)
    resident = start_resident(runtime)
    os.kill(resident, signal.SIGTERM)
    wait_gone(resident)
    assert not os.path.exists(os.path.join(runtime, "madtrace", "resident.sock"))
    with open(os.path.join(runtime, "madtrace", "resident.log")) as f:
        assert f"resident {resident} ended" in f.read()
    target = start_ready([prog("live_calls", "O2-pie")])
    try:                                # no resident: the daemon starts here, said in its line
        result = run(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t"))
        assert result.returncode == 0, result.stderr
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1 and "no resident madtrace process: started here" in lines[0]
        daemon = int(re.search(r"daemon (\d+) traces", lines[0]).group(1))
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        finish_live(target)
    finally:
        target.kill()
    one_line(run(runtime, "daemon", "--resident", "123"), 2, "take no PID")
    result = run(runtime, "daemon", "--stop-resident")
    assert result.returncode == 0 and b"no resident process runs" in result.stderr
