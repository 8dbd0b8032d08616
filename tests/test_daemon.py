# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer daemon and its control socket.

Oracles: the target's output untraced (a reference run in parallel), the
daemon's answers, the permissions of its socket, the refusal of another
uid, and the trace directory read back by `madtrace summary`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time

import pytest

from .util import MADTRACE, ROOT, prog, start_ready

ITERATIONS = "5000000"      # about 5 s
NOBODY = 65534


@pytest.fixture
def runtime(tmp_path):
    """A private runtime directory for the daemons of one test."""
    base = tmp_path / "run"
    base.mkdir()
    return str(base)


def madtrace_env(runtime: str) -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, XDG_RUNTIME_DIR=runtime)


def run(runtime: str, *args: str, prefix=(), **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *MADTRACE, *args], capture_output=True, timeout=60,
                          env=madtrace_env(runtime), **kw)


def one_line(result, code: int, needle: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == code, (result.returncode, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    return lines[0]


def start_daemon(runtime: str, pid: int, output) -> int:
    started = time.monotonic()
    result = run(runtime, "daemon", str(pid), "-o", str(output))
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 20     # it returned: the daemon lives on
    return int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))


def as_nobody(with_dac_override: bool) -> list[str]:
    """A command prefix running the client as uid nobody.  It keeps
    CAP_DAC_READ_SEARCH so that it can read madtrace and its venv wherever this
    checkout lives (a mode 0700 directory included); writing to the daemon's
    0600 socket still needs CAP_DAC_OVERRIDE, given only with_dac_override."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv (util-linux) is needed to run a client as another uid")
    caps = "+dac_override,+dac_read_search" if with_dac_override else "+dac_read_search"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            f"--inh-caps={caps}", f"--ambient-caps={caps}"]


def test_daemon_instrument_status_refuse_stop(tmp_path, runtime):
    if os.getuid() == NOBODY:
        pytest.fail("the uid check needs a test user other than nobody")
    argv = [prog("live_calls", "O2-pie"), ITERATIONS]
    expected = subprocess.Popen(argv, stdout=subprocess.PIPE)
    target = start_ready(argv)
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t")
        directory = os.path.join(runtime, "madtrace")
        sock = os.path.join(directory, f"{target.pid}.sock")
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(sock).st_mode) and stat.S_IMODE(os.stat(sock).st_mode) == 0o600

        result = run(runtime, "ctl", str(target.pid), "instrument", "tick")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(b"instrumented 1 function")
        status = json.loads(run(runtime, "ctl", str(target.pid), "status", "--json").stdout)
        assert status["pid"] == target.pid and status["functions_instrumented"] == 1
        assert status["patches"] == 1 and status["dropped_events"] == 0
        text = run(runtime, "ctl", str(target.pid), "status").stdout.decode()
        assert "1 instrumented" in text and "dropped events: 0" in text

        # errors: one line, and the daemon goes on
        one_line(run(runtime, "ctl", str(target.pid), "frobnicate"), 2, "unknown command")
        one_line(run(runtime, "ctl", str(target.pid), "restore", "a", "b"), 2, "restore takes 1 argument")
        one_line(run(runtime, "ctl", str(target.pid), "instrument", "nope_*"), 16,
                 "no function matches 'nope_*'")

        # another uid: stopped by the 0700 directory / 0600 socket, and by SO_PEERCRED when
        # it gets through
        one_line(run(runtime, "ctl", str(target.pid), "status", prefix=as_nobody(False)), 12,
                 "belongs to another user")
        refused = one_line(run(runtime, "ctl", str(target.pid), "status", prefix=as_nobody(True)),
                           12, "refused")
        assert f"serves uid {os.getuid()} only, and you are uid {NOBODY}" in refused

        calls = json.loads(run(runtime, "ctl", str(target.pid), "calls", "--json").stdout)
        assert calls["tick"] > 0
        result = run(runtime, "ctl", str(target.pid), "stop")
        assert result.returncode == 0, result.stderr
        assert b"detached from process" in result.stdout
        assert not os.path.exists(sock)
        for _ in range(100):            # the daemon exits right after its last reply
            if not os.path.exists(f"/proc/{daemon}") or open(f"/proc/{daemon}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
        else:
            pytest.fail("the daemon did not exit after ctl stop")
        out, _ = target.communicate(timeout=60)
    finally:
        target.kill()
    assert b"ready\n" + out == expected.communicate(timeout=60)[0]
    assert target.returncode == 0
    summary = json.loads(run(runtime, "summary", str(tmp_path / "t"), "--json").stdout)
    assert summary["outcome"] == "detached" and summary["pid"] == target.pid
    assert summary["calls"]["tick"] >= calls["tick"] and summary["dropped_events"] == 0


def test_target_survives_kill_9_of_the_daemon(tmp_path, runtime):
    argv = [prog("live_calls", "O2-nopie"), ITERATIONS]
    expected = subprocess.Popen(argv, stdout=subprocess.PIPE)
    target = start_ready(argv)
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t")
        assert run(runtime, "ctl", str(target.pid), "instrument", "tick", "tock").returncode == 0
        os.kill(daemon, signal.SIGKILL)
        out, _ = target.communicate(timeout=60)
    finally:
        target.kill()
    assert b"ready\n" + out == expected.communicate(timeout=60)[0]
    assert target.returncode == 0
    sock = os.path.join(runtime, "madtrace", f"{target.pid}.sock")
    assert os.path.exists(sock)                       # left behind by the killed daemon
    one_line(run(runtime, "ctl", str(target.pid), "status"), 11, "removed the stale socket")
    assert not os.path.exists(sock)
    one_line(run(runtime, "ctl", str(target.pid), "status"), 11, "no madtrace daemon traces")


def test_daemon_errors_and_repl_connect(tmp_path, runtime):
    one_line(run(runtime, "daemon", "999999999", "-o", str(tmp_path / "x")), 11, "no such process")
    target = start_ready([prog("live_calls", "O2-pie"), "3000000"])
    try:
        start_daemon(runtime, target.pid, tmp_path / "t")
        one_line(run(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t2")), 12,
                 "already traced")
        # repl --connect with a batch: the daemon keeps tracing after the client leaves
        batch = tmp_path / "b.txt"
        batch.write_text("instrument tock\nsleep 0.2\ncalls --json\nquit\n")
        result = run(runtime, "repl", "--connect", str(target.pid), "--batch", str(batch))
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1])["tock"] > 0
        status = json.loads(run(runtime, "ctl", str(target.pid), "status", "--json").stdout)
        assert status["functions_instrumented"] == 1
        assert run(runtime, "ctl", str(target.pid), "kill").returncode == 0
        target.wait(timeout=30)
    finally:
        target.kill()
    assert target.returncode == -signal.SIGKILL
    summary = json.loads(run(runtime, "summary", str(tmp_path / "t"), "--json").stdout)
    assert summary["exit_signal"] == signal.SIGKILL
