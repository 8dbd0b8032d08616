"""The command line, end to end: exit statuses, untouched output, clean errors.

Oracle: the program run without madtrace (stdout, exit status)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from madtrace.process.tracee import Tracee

from .util import (ROOT, VARIANTS, madtrace, one_line_error, prog, run_untraced, start_ready,
                   summary_json, wait_in_syscall)


@pytest.mark.parametrize("variant", VARIANTS)
def test_record_keeps_output_and_exit_status(tmp_path, variant):
    argv = [prog("threads", variant), "3", "200000"]
    expected = run_untraced(argv)
    result = madtrace("record", "-q", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == expected.returncode == 0
    assert result.stdout == expected.stdout
    s = summary_json(tmp_path / "t")
    assert s["exit_status"] == 0 and s["threads"] == 4
    main = [name for name, m in s["modules"].items() if m["main"]]
    assert main == [f"threads-{variant}"]
    assert s["modules"]["libc.so.6"]["symbols"] > 1000


@pytest.mark.parametrize("args,status", [(["die", "6"], 128 + 6), (["segv"], 128 + 11),
                                         (["die", "15"], 128 + 15)])
def test_target_killed_by_signal(tmp_path, args, status):
    argv = [prog("signals", "O2-pie"), *args]
    expected = run_untraced(argv)
    assert expected.returncode == -(status - 128)
    result = madtrace("record", "-q", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == status
    assert result.stdout == expected.stdout
    s = summary_json(tmp_path / "t")
    assert s["exit_status"] == status and s["exit_signal"] == status - 128


@pytest.mark.parametrize("mode", [["handler"], ["fork"], ["exec", "/bin/echo"]])
@pytest.mark.parametrize("follow", [False, True])
def test_signals_fork_exec_behave_as_untraced(tmp_path, mode, follow):
    argv = [prog("signals", "O0-nopie"), *mode]
    expected = run_untraced(argv)
    extra = ["--follow-forks"] if follow else []
    result = madtrace("record", "-q", *extra, "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == expected.returncode
    assert result.stdout == expected.stdout
    s = summary_json(tmp_path / "t")
    if mode == ["fork"]:
        assert s["forks"] == 1
    if mode == ["handler"]:
        assert result.stdout == b"usr1=5 alrm=1\n"
        assert s["signals_forwarded"] >= 6


def test_default_run_prints_summary_and_start_at_main(tmp_path):
    argv = [prog("threads", "O2-nopie"), "1", "1000"]
    expected = run_untraced(argv)
    result = subprocess.run([sys.executable, "-m", "madtrace.cli.main", "--start-at", "main",
                             "--", *argv], capture_output=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.stdout
    assert b"madtrace summary of madtrace.data" in result.stderr
    assert (tmp_path / "madtrace.data" / "meta.json").exists()
    # a second run never overwrites: it picks the next free name
    again = subprocess.run([sys.executable, "-m", "madtrace.cli.main", "-q", "--", *argv],
                           capture_output=True, cwd=tmp_path, timeout=60)
    assert again.returncode == 0
    assert (tmp_path / "madtrace.data.1" / "meta.json").exists()


def test_attach_duration_then_target_finishes_unchanged(tmp_path):
    argv = [prog("threads", "O2-pie"), "4", "300000000", "ready"]
    expected = run_untraced(argv, input=b"go\n").stdout
    proc = start_ready(argv)
    try:
        result = madtrace("attach", str(proc.pid), "-q", "-o", str(tmp_path / "a"),
                          "--duration", "0.3")
        assert result.returncode == 0, result.stderr
        out, _ = proc.communicate(b"go\n", timeout=60)
    finally:
        proc.kill()
    assert b"ready\n" + out == expected
    s = summary_json(tmp_path / "a")
    assert s["threads"] == 5 and s["exit_status"] is None
    assert s["outcome"] == "detached" and s["stop_reason"] == "duration"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_tracer_signal_detaches_and_interrupted_syscall_restarts(tmp_path, sig):
    # long enough for the attach of a loaded machine (1.5 s was not, one run in nine)
    proc = start_ready([prog("blocking", "O0-pie"), "sleep", "4000"])
    try:
        wait_in_syscall(proc.pid, 230)
        env = dict(os.environ, PYTHONPATH=ROOT)
        tracer = subprocess.Popen([sys.executable, "-m", "madtrace.cli.main", "attach",
                                   str(proc.pid), "-o", str(tmp_path / "a")],
                                  stderr=subprocess.PIPE, env=env)
        while b"attached to process" not in tracer.stderr.readline():
            assert tracer.poll() is None, "madtrace ended before attaching"
        tracer.send_signal(sig)
        assert tracer.wait(timeout=30) == 0
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out == b"slept 4000\n"
    assert proc.returncode == 0
    assert summary_json(tmp_path / "a")["stop_reason"] == signal.Signals(sig).name


def test_attach_to_process_in_blocking_read(tmp_path):
    proc = start_ready([prog("blocking", "O2-nopie"), "read"])
    try:
        wait_in_syscall(proc.pid, 0)
        result = madtrace("attach", str(proc.pid), "-q", "-o", str(tmp_path / "a"),
                          "--duration", "0.2")
        assert result.returncode == 0, result.stderr
        out, _ = proc.communicate(b"after detach\n", timeout=30)
    finally:
        proc.kill()
    assert out == b"got 13 bytes: after detach\n"


# ------------------------------------------------------------------ bad input
def test_no_such_pid():
    one_line_error(madtrace("attach", "3999999", "-o", "/nonexistent-madtrace-test/x"), 11, "no such process")


def test_kernel_thread(tmp_path):
    one_line_error(madtrace("attach", "2", "-o", str(tmp_path / "k")), 13, "kernel thread")


def test_not_a_pid(tmp_path):
    one_line_error(madtrace("attach", "12ab", "-o", str(tmp_path / "k")), 2, "not a PID")
    for command in ("attach", "repl", "daemon", "ctl"):     # one rule for every command
        for pid in ("-5", "0"):
            one_line_error(madtrace(command, pid, *(["status"] if command == "ctl" else [])),
                           2, f"not a PID: '{pid}'")


def test_already_traced(tmp_path):
    proc = start_ready([prog("blocking", "O0-pie"), "read"])
    try:
        tracee = Tracee.attach(proc.pid)
        try:
            one_line_error(madtrace("attach", str(proc.pid), "-o", str(tmp_path / "a")), 12,
                           "already traced")
        finally:
            tracee.detach()
        out, _ = proc.communicate(b"x\n", timeout=30)
        assert out == b"got 2 bytes: x\n"
    finally:
        proc.kill()


def test_missing_command(tmp_path):
    one_line_error(madtrace("record", "-o", str(tmp_path / "t"), "--", "no-such-cmd-xyz"), 14,
                   "command not found")
    one_line_error(madtrace("record", "-o", str(tmp_path / "u"), "--", str(tmp_path)), 14,
                   "not an executable")


def test_non_elf_file(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00\x01not an elf file at all\n" * 10)
    junk.chmod(0o755)
    one_line_error(madtrace("record", "-o", str(tmp_path / "t"), "--", str(junk)), 15, "not an ELF")


def test_output_exists_needs_force(tmp_path):
    argv = [prog("threads", "O0-pie"), "1", "10"]
    assert madtrace("record", "-q", "-o", str(tmp_path / "t"), "--", *argv).returncode == 0
    one_line_error(madtrace("record", "-o", str(tmp_path / "t"), "--", *argv), 17, "--force")
    assert madtrace("record", "-q", "--force", "-o", str(tmp_path / "t"), "--", *argv).returncode == 0
    (tmp_path / "notrace").mkdir()
    (tmp_path / "notrace" / "precious").write_text("x")
    one_line_error(madtrace("record", "--force", "-o", str(tmp_path / "notrace"), "--", *argv), 17,
                   "not a madtrace trace directory")
    assert (tmp_path / "notrace" / "precious").exists()
    # what a recording killed before its meta.json leaves is replaced; not with a stranger in it
    killed = tmp_path / "killed"
    for sub in ("calls", "data"):
        (killed / sub).mkdir(parents=True)
    (killed / "maps.start.txt").write_text("")
    (killed / "calls" / "1.rec").write_bytes(b"")
    assert madtrace("record", "-q", "--force", "-o", str(killed), "--", *argv).returncode == 0
    assert (killed / "meta.json").exists()
    (tmp_path / "mixed" / "calls").mkdir(parents=True)
    (tmp_path / "mixed" / "precious").write_text("x")
    one_line_error(madtrace("record", "--force", "-o", str(tmp_path / "mixed"), "--", *argv), 17,
                   "not a madtrace trace directory")
    assert (tmp_path / "mixed" / "precious").exists()
    # a file is not a trace directory: --force leaves it as it is
    (tmp_path / "file").write_text("x")
    one_line_error(madtrace("record", "--force", "-o", str(tmp_path / "file"), "--", *argv), 17,
                   "is a file, not a trace directory")
    assert (tmp_path / "file").read_text() == "x"


def test_output_parent_must_exist(tmp_path):
    """A mistyped -o is an error (exit 23), not a new tree of directories."""
    argv = [prog("threads", "O0-pie"), "1", "10"]
    one_line_error(madtrace("record", "-o", str(tmp_path / "missing" / "t"), "--", *argv), 23,
                   "No such file or directory")
    assert not (tmp_path / "missing").exists()


def test_corrupt_trace_directory(tmp_path):
    one_line_error(madtrace("summary", str(tmp_path / "missing")), 18, "no such trace directory")
    (tmp_path / "bad").mkdir()
    one_line_error(madtrace("summary", str(tmp_path / "bad")), 18, "not a madtrace trace directory")
    (tmp_path / "bad" / "meta.json").write_text("{ not json")
    one_line_error(madtrace("summary", str(tmp_path / "bad")), 18, "corrupt")


def test_usage_errors(tmp_path):
    one_line_error(madtrace("record", "-o", str(tmp_path / "t")), 2, "no command given")
    one_line_error(madtrace("frobnicate"), 2, "invalid choice")
    bogus = madtrace("--bogus")
    one_line_error(bogus, 2, "unrecognized arguments: --bogus")
    assert bogus.stderr.decode().startswith("madtrace: unrecognized")     # said once
    one_line_error(madtrace("attach", "1", "--duration", "-3", "-o", str(tmp_path / "d")), 2,
                   "--duration")


def test_start_at_main_on_stripped_binary(tmp_path):
    argv = [prog("threads", "O2-pie-stripped"), "1", "10"]
    one_line_error(madtrace("record", "--start-at", "main", "-o", str(tmp_path / "t"), "--", *argv),
                   21, "stripped")
    # without --start-at main a stripped program records fine, with one warning
    result = madtrace("record", "-o", str(tmp_path / "u"), "--", *argv)
    assert result.returncode == 0
    assert result.stderr.decode().count("is stripped") == 1


def test_tracer_is_the_same_program():
    bindir = os.path.dirname(sys.executable)
    assert os.path.exists(os.path.join(bindir, "tracer")), "console script 'tracer' not installed"
    out = subprocess.run([os.path.join(bindir, "tracer"), "--version"], capture_output=True)
    assert out.returncode == 0 and out.stdout.startswith(b"madtrace ")
