# SPDX-License-Identifier: GPL-2.0-or-later
"""The tracer daemon and its control socket.

The target, tests/progs/live_calls, runs until the test closes its stdin, so
a loaded machine never lets it finish before the test is done with it.
Oracles: the target's output, byte-identical to an untraced run of the same
number of iterations; the daemon's answers; the permissions of its socket;
the refusal of another uid; and the trace directory read back by
`madtrace summary`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from .util import MADTRACE, ROOT, check_live_output, finish_live, prog, start_ready

NOBODY = 65534
PATIENCE = 120.0       # a safety net for a loaded machine, never a measured time


@pytest.fixture
def runtime(tmp_path):
    """A private runtime directory for the daemons of one test."""
    base = tmp_path / "run"
    base.mkdir()
    return str(base)


# what the tracer needs and a command's client does not (each takes 10-60 ms to import)
HEAVY_MODULES = ("numpy", "capstone", "duckdb", "pyarrow", "elftools", "zstandard")


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


def start_daemon(runtime: str, pid: int, output, how=("daemon",)) -> int:
    """``madtrace daemon PID`` (or ``attach PID --daemon``): it returns while the
    daemon lives on.  Returns the daemon's pid."""
    result = run(runtime, *how, str(pid), "-o", str(output))
    assert result.returncode == 0, result.stderr
    daemon = int(re.search(rb"daemon (\d+) traces", result.stderr).group(1))
    assert os.path.exists(f"/proc/{daemon}")
    return daemon


def ctl_json(runtime: str, pid: int, *words: str):
    result = run(runtime, "ctl", str(pid), *words, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def ctl_until(runtime: str, pid: int, words, done):
    """``ctl PID WORDS --json`` until ``done(value)``: the target gets the time
    a loaded machine needs."""
    deadline = time.monotonic() + PATIENCE
    while True:
        value = ctl_json(runtime, pid, *words)
        if done(value):
            return value
        assert time.monotonic() < deadline, f"ctl {' '.join(words)}: still {value}"
        time.sleep(0.1)


def daemon_log_tail(runtime: str, pid: int, chars: int = 3000) -> str:
    """The end of the log of the daemon tracing ``pid`` (for a failure's message)."""
    try:
        with open(os.path.join(runtime, "madtrace", f"{pid}.log"), errors="replace") as f:
            return f.read()[-chars:]
    except OSError as exc:
        return f"(no daemon log: {exc})"


def wait_gone(pid: int) -> None:
    """Until ``pid`` has exited, every thread of it (a killed process's main
    thread is a zombie while its other threads still exit, holding its files)."""
    deadline = time.monotonic() + PATIENCE
    while not _gone(pid):
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    try:
        if open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            return False
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except OSError:
        return True


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
    argv = [prog("live_calls", "O2-pie")]
    target = start_ready(argv)          # runs until its stdin is closed
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t")
        directory = os.path.join(runtime, "madtrace")
        sock = os.path.join(directory, f"{target.pid}.sock")
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(sock).st_mode) and stat.S_IMODE(os.stat(sock).st_mode) == 0o600

        result = run(runtime, "ctl", str(target.pid), "instrument", "tick")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(b"instrumented 1 function")
        status = ctl_json(runtime, target.pid, "status")
        assert status["pid"] == target.pid and status["functions_instrumented"] == 1
        assert status["patches"] == 1 and status["dropped_events"] == 0
        text = run(runtime, "ctl", str(target.pid), "status").stdout.decode()
        assert "1 instrumented" in text and "dropped events: 0" in text
        # the client is light: what it imports to send a command and print the reply
        light = subprocess.run(
            [sys.executable, "-c", "import sys; from madtrace.cli.main import main; "
             f"code = main(['ctl', '{target.pid}', 'status']); "
             "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])), code)",
             *HEAVY_MODULES], capture_output=True, timeout=60, env=madtrace_env(runtime))
        assert light.stdout.decode().splitlines()[-1] == "[] 0", (light.stdout, light.stderr)

        # errors: one line, and the daemon goes on
        one_line(run(runtime, "ctl", str(target.pid), "frobnicate"), 2, "unknown command")
        one_line(run(runtime, "ctl", str(target.pid), "restore", "a", "b"), 2, "restore takes 1 argument")
        one_line(run(runtime, "ctl", str(target.pid), "instrument", "nope_*"), 16,
                 "no function matches 'nope_*'")
        one_line(run(runtime, "ctl", str(target.pid), "trace", "data", "in", "nope_*"), 16,
                 "no function matches 'nope_*'")
        one_line(run(runtime, "ctl", str(target.pid), "save"), 2, "save takes 1 argument, not 0")
        one_line(run(runtime, "ctl", str(target.pid), "x", "no_such_symbol"), 16,
                 "not an address, symbol or variable")
        one_line(run(runtime, "ctl", str(target.pid), "quit"), 2, "ctl PID stop")
        one_line(run(runtime, "ctl", str(target.pid)), 2, "ctl needs a command")

        # another uid: stopped by the 0700 directory / 0600 socket, and by SO_PEERCRED when
        # it gets through
        one_line(run(runtime, "ctl", str(target.pid), "status", prefix=as_nobody(False)), 12,
                 "belongs to another user")
        refused = one_line(run(runtime, "ctl", str(target.pid), "status", prefix=as_nobody(True)),
                           12, "refused")
        assert f"serves uid {os.getuid()} only, and you are uid {NOBODY}" in refused

        calls = ctl_until(runtime, target.pid, ["calls"], lambda c: c["tick"] > 0)
        # the trace so far, to a path relative to the client (the daemon runs in /)
        saved = run(runtime, "ctl", str(target.pid), "save", "snap", "--json", cwd=tmp_path)
        assert saved.returncode == 0, saved.stderr
        saved = json.loads(saved.stdout)
        assert saved["directory"] == str(tmp_path / "snap") and saved["calls"]["tick"] >= calls["tick"]
        result = run(runtime, "ctl", str(target.pid), "stop")
        assert result.returncode == 0, result.stderr
        assert b"detached from process" in result.stdout
        assert not os.path.exists(sock)
        wait_gone(daemon)               # the daemon exits right after its last reply
        one_line(run(runtime, "ctl", str(target.pid), "status"), 11, "no madtrace daemon traces")
        assert target.poll() is None    # the program keeps running, untraced
        out = finish_live(target)
    finally:
        target.kill()
    check_live_output(argv[0], out)
    assert target.returncode == 0
    summary = json.loads(run(runtime, "summary", str(tmp_path / "t"), "--json").stdout)
    assert summary["outcome"] == "detached" and summary["pid"] == target.pid
    assert summary["calls"]["tick"] >= saved["calls"]["tick"] and summary["dropped_events"] == 0
    snap = json.loads(run(runtime, "summary", str(tmp_path / "snap"), "--json").stdout)
    assert snap["outcome"] == "snapshot" and snap["calls"] == saved["calls"]


def test_target_survives_kill_9_of_the_daemon(tmp_path, runtime):
    argv = [prog("live_calls", "O2-nopie")]
    target = start_ready(argv)
    try:
        daemon = start_daemon(runtime, target.pid, tmp_path / "t")
        assert run(runtime, "ctl", str(target.pid), "instrument", "tick", "tock").returncode == 0
        ctl_until(runtime, target.pid, ["calls"], lambda c: c["tick"] > 0)
        os.kill(daemon, signal.SIGKILL)
        wait_gone(daemon)
        time.sleep(0.2)                 # the target runs on, patched, with nobody draining
        assert target.poll() is None
        out = finish_live(target)
    finally:
        target.kill()
    check_live_output(argv[0], out)
    assert target.returncode == 0
    sock = os.path.join(runtime, "madtrace", f"{target.pid}.sock")
    assert os.path.exists(sock)                       # left behind by the killed daemon
    one_line(run(runtime, "ctl", str(target.pid), "status"), 11, "removed the stale socket")
    assert not os.path.exists(sock)
    one_line(run(runtime, "ctl", str(target.pid), "status"), 11, "no madtrace daemon traces")


def test_stale_socket_does_not_stop_a_new_daemon(tmp_path, runtime):
    """A socket left by a crashed daemon (nobody listens) is removed when a
    new daemon starts for the same PID."""
    target = start_ready([prog("live_calls", "O2-pie")])
    try:
        directory = os.path.join(runtime, "madtrace")
        os.mkdir(directory, 0o700)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(os.path.join(directory, f"{target.pid}.sock"))
        stale.close()                   # bound, never listening: what a crash leaves
        daemon = start_daemon(runtime, target.pid, tmp_path / "t", how=("attach", "--daemon"))
        assert ctl_json(runtime, target.pid, "status")["pid"] == target.pid
        assert run(runtime, "ctl", str(target.pid), "stop").returncode == 0
        wait_gone(daemon)
        out = finish_live(target)
    finally:
        target.kill()
    check_live_output(target.args[0], out)
    assert json.loads(run(runtime, "summary", str(tmp_path / "t"), "--json").stdout)["outcome"] \
        == "detached"


def test_daemon_errors_and_repl_connect(tmp_path, runtime):
    one_line(run(runtime, "daemon", "999999999", "-o", str(tmp_path / "x")), 11, "no such process")
    target = start_ready([prog("live_calls", "O2-pie")])
    try:
        (tmp_path / "taken").mkdir()      # the daemon's error comes back to the command line
        one_line(run(runtime, "attach", str(target.pid), "--daemon", "-o", str(tmp_path / "taken")),
                 17, "already exists")
        start_daemon(runtime, target.pid, tmp_path / "t", how=("attach", "--daemon"))
        one_line(run(runtime, "daemon", str(target.pid), "-o", str(tmp_path / "t2")), 12,
                 "already traced")
        # repl --connect with a batch: the daemon keeps tracing after the client leaves
        batch = tmp_path / "b.txt"
        batch.write_text("instrument tock\nsleep 0.3\ncalls --json\nquit\n")
        result = run(runtime, "repl", "--connect", str(target.pid), "--batch", str(batch))
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1])["tock"] > 0
        status = ctl_json(runtime, target.pid, "status")
        assert status["functions_instrumented"] == 1
        assert run(runtime, "ctl", str(target.pid), "kill").returncode == 0
        target.wait(timeout=PATIENCE)
    finally:
        target.kill()
    assert target.returncode == -signal.SIGKILL
    summary = json.loads(run(runtime, "summary", str(tmp_path / "t"), "--json").stdout)
    assert summary["exit_signal"] == signal.SIGKILL


def test_a_daemon_that_does_not_answer_is_told_from_one_that_closed(tmp_path, monkeypatch):
    """A reply that does not come in time says so (and where the daemon's log is),
    not that the daemon closed the connection: the two have different causes."""
    from madtrace.daemon import transport
    from madtrace.errors import NoSuchProcessError
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    transport.ensure_runtime_dir()
    pid = os.getpid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(transport.socket_path(pid))
    listener.listen(2)
    try:
        for answer in (False, True):
            client_side = transport.DaemonClient.__new__(transport.DaemonClient)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(transport.socket_path(pid))
            server_side, _ = listener.accept()
            sock.settimeout(0.5)
            client_side.pid, client_side.sock, client_side.reader = pid, sock, sock.makefile("rb")
            if answer:
                server_side.close()          # closed, not silent
            with pytest.raises(NoSuchProcessError) as error:
                client_side.request({"line": "status"})
            said = str(error.value)
            if answer:
                assert "did not answer" not in said and ("closed the connection" in said or
                                                         "has ended" in said), said
            else:
                assert "did not answer within 0 s" in said or "did not answer within 1 s" in said, said
                assert transport.log_path(pid) in said
                server_side.close()
            client_side.close()
    finally:
        listener.close()
