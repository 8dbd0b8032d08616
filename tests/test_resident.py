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
import socket
import stat
import subprocess
import threading
import time

import pytest

from .test_daemon import MADTRACE, PATIENCE, ctl_json, madtrace_env, one_line, run, wait_gone
from .util import ROOT, check_live_output, finish_live, prog, start_ready


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


def test_a_resident_starts_on_demand_and_ends_unused(tmp_path):
    """With none running, `madtrace daemon PID` attaches by itself, says so, and starts
    a resident in the background: the next daemon is forked from it; unused for
    MADTRACE_RESIDENT_IDLE seconds it ends and its socket goes.  A bad value of the
    variable is a one-line error; --idle goes with --resident only."""
    runtime = private_runtime(tmp_path)
    sock = os.path.join(runtime, "madtrace", "resident.sock")

    def plain(*args, idle="3"):
        return subprocess.run([*MADTRACE, *args], capture_output=True, timeout=60,
                              env=dict(madtrace_env(runtime), MADTRACE_RESIDENT_IDLE=idle))

    one_line(plain("daemon", "1", idle="soon"), 2, "MADTRACE_RESIDENT_IDLE='soon'")
    one_line(plain("daemon", "1", "--idle", "5"), 2, "--idle goes with --resident")
    one_line(plain("daemon", "--stop-resident", "--idle", "5"), 2, "goes with --resident")
    assert not os.path.exists(sock)
    argv = [prog("live_calls", "O2-pie")]
    target = start_ready(argv)
    resident = 0
    try:
        first = plain("daemon", str(target.pid), "-o", str(tmp_path / "t1"))
        line = one_line(first, 0, "no resident madtrace process: started here; one starts for "
                        "the next commands (it ends after 3 s unused; MADTRACE_RESIDENT_IDLE=0")
        daemon = int(re.search(r"daemon (\d+) traces", line).group(1))
        deadline = time.monotonic() + PATIENCE
        while not os.path.exists(sock):     # it imports the tracer in the background
            assert time.monotonic() < deadline, "no resident started"
            time.sleep(0.05)
        assert plain("ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        second = plain("daemon", str(target.pid), "-o", str(tmp_path / "t2"))
        line = one_line(second, 0, "forked by the resident process")
        resident = int(re.search(r"forked by the resident process (\d+)", line).group(1))
        daemon = int(re.search(r"daemon (\d+) traces", line).group(1))
        assert tracer_of(target.pid) == daemon != resident
        assert plain("ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        wait_gone(resident)                 # 3 s after its last command
        resident = 0
        out = finish_live(target)
    finally:
        target.kill()
        if resident:
            os.kill(resident, signal.SIGTERM)
    check_live_output(argv[0], out)
    assert not os.path.exists(sock)
    with open(os.path.join(runtime, "madtrace", "resident.log")) as f:
        assert "no command for 3 s" in f.read()
    for name in ("t1", "t2"):
        summary = json.loads(run(runtime, "summary", str(tmp_path / name), "--json").stdout)
        assert summary["outcome"] == "detached"


CTL = os.path.join(ROOT, "build", "bin", "madtrace-ctl")


def ctl_client(runtime: str, *args, **kw) -> subprocess.CompletedProcess:
    """The same command through madtrace-ctl (the client that is not Python)."""
    return subprocess.run([CTL, *args], capture_output=True, timeout=60,
                          env=madtrace_env(runtime), **kw)


def same_answer(python: subprocess.CompletedProcess, c: subprocess.CompletedProcess) -> None:
    """Byte for byte, pids and other numbers aside (each command makes its own;
    the padding of a right-aligned count changes with its number of digits)."""
    def norm(data: bytes) -> bytes:
        return re.sub(rb" *\d+", b" N", data)
    assert (c.returncode, norm(c.stderr), norm(c.stdout)) == \
        (python.returncode, norm(python.stderr), norm(python.stdout))


class FakeResident:
    """A resident socket that answers every request with ``answer`` (None: closes
    the connection without a word, as a resident that died while running it)."""

    def __init__(self, runtime: str, answer: dict | None):
        os.makedirs(os.path.join(runtime, "madtrace"), mode=0o700, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(os.path.join(runtime, "madtrace", "resident.sock"))
        self.sock.listen(8)
        self.answer = answer
        self.requests: list[dict] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                for fd in fds:
                    os.close(fd)
                while not data.endswith(b"\n"):
                    more = conn.recv(1 << 20)
                    if not more:
                        break
                    data += more
                self.requests.append(json.loads(data))
                if self.answer is not None:
                    conn.sendall(json.dumps(self.answer).encode() + b"\n")

    def close(self) -> None:
        self.sock.close()


def test_madtrace_ctl_answers_as_the_python_command(tmp_path):
    """build/bin/madtrace-ctl: with a resident process, the command runs in its
    worker (no Python starts); without one, refused, or for other commands, it
    runs the Python command; the messages and exit codes are the same."""
    runtime = private_runtime(tmp_path)
    target = start_ready([prog("live_calls", "O2-pie")])
    try:
        # no resident: the Python command, as it answers
        same_answer(run(runtime, "ctl", str(target.pid), "status"),
                    ctl_client(runtime, "ctl", str(target.pid), "status"))
        same_answer(run(runtime, "daemon", "999999999"), ctl_client(runtime, "daemon", "999999999"))
        same_answer(run(runtime, "daemon", "--stop-resident"),
                    ctl_client(runtime, "daemon", "--stop-resident"))
        resident = start_resident(runtime)
        result = ctl_client(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t"),
                            "-f", "tick")
        assert result.returncode == 0, result.stderr
        assert f"forked by the resident process {resident}".encode() in result.stderr
        daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
        assert tracer_of(target.pid) == daemon != resident
        for args in (("daemon", str(target.pid), "-o", str(tmp_path / "t2")),   # already traced
                     ("daemon", "nope"), ("daemon", "999999999", "-o", str(tmp_path / "x")),
                     ("ctl", str(target.pid), "help"), ("ctl", str(target.pid), "bogus"),
                     ("ctl", str(target.pid), "instrument", "no_such_function_here"),
                     ("ctl", str(target.pid), "calls"), ("ctl", "1", "status"), ("--version",)):
            same_answer(run(runtime, *args), ctl_client(runtime, *args))
        status = ctl_client(runtime, "ctl", str(target.pid), "status", "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["functions_instrumented"] == 1
        assert ctl_client(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        # arguments go as Python's sys.argv has them: UTF-8, and other bytes (surrogateescape)
        for name in ("t\u00e9\u20ac", os.fsdecode(b"t\xff\xfe")):
            result = ctl_client(runtime, "daemon", str(target.pid), "-o", str(tmp_path / name))
            assert result.returncode == 0, result.stderr
            daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
            assert os.path.exists(os.path.join(os.fsencode(tmp_path), os.fsencode(name),
                                               b"meta.json"))
            assert ctl_client(runtime, "ctl", str(target.pid), "stop").returncode == 0
            wait_gone(daemon)
        stopped = ctl_client(runtime, "daemon", "--stop-resident")
        assert stopped.returncode == 0 and f"resident process {resident} ended".encode() in stopped.stderr
        finish_live(target)
    finally:
        target.kill()


@pytest.mark.parametrize("answer", [None, {"refused": "a test says no"}])
def test_madtrace_ctl_when_the_resident_fails_or_refuses(tmp_path, answer):
    """A resident that closes without an answer: one line, exit 20 (as the Python
    command's daemon through a resident; madtrace-ctl sends ctl there too, and
    cannot know whether it ran); one that refuses: the daemon starts here, and
    the line says why, from both clients."""
    runtime = private_runtime(tmp_path)
    fake = FakeResident(runtime, answer)
    target = start_ready([prog("live_calls", "O2-pie")])
    try:
        if answer is None:
            for args in (("daemon", str(target.pid)), ("ctl", str(target.pid), "status")):
                same_answer(run(runtime, "daemon", str(target.pid)), ctl_client(runtime, *args))
                assert fake.requests[-1]["argv"] == list(args)
                assert fake.requests[-1]["cwd"] == os.getcwd()
            one_line(ctl_client(runtime, "daemon", str(target.pid)), 20,
                     "the resident madtrace process failed while running the command")
            return
        results = []
        for name, client in (("py", run), ("c", ctl_client)):
            result = client(runtime, "daemon", str(target.pid), "-o", str(tmp_path / name))
            assert result.returncode == 0, result.stderr
            assert b"a test says no: started here" in result.stderr
            results.append(result)
            daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
            assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
            wait_gone(daemon)
        same_answer(*results)
        finish_live(target)
    finally:
        fake.close()
        target.kill()
