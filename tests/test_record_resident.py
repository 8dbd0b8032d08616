# SPDX-License-Identifier: GPL-2.0-or-later
"""``madtrace-ctl record ... -- CMD`` with a resident madtrace process: the
client forks the program (madtrace/process/spawn_proxy.py) and a worker of the
resident records it, without a Python starting.

Oracles: the program's output and exit code, byte-identical to an untraced
run; the Python command's trace (per-instruction access counts, call counts),
exit codes and messages; the program's parent, process group, descriptors and
signal dispositions as /proc shows them, equal to those of an untraced run
from the same client; the Python command's behaviour on SIGTERM (detach, the
program goes on)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from .test_daemon import madtrace_env, run, wait_gone
from .test_resident import CTL, FakeResident, private_runtime, same_answer, start_resident
from .util import prog

# what the program says of itself: its parent, process group, descriptors and signals
SELF = ("echo ppid=$PPID pgid=$(ps -o pgid= -p $$ | tr -d ' '); ls /proc/$$/fd; "
        "grep -E '^SigIgn' /proc/$$/status")


@pytest.fixture
def resident(tmp_path):
    runtime = private_runtime(tmp_path)
    pid = start_resident(runtime)
    yield runtime
    run(runtime, "daemon", "--stop-resident")
    wait_gone(pid)


def ctl(runtime: str, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([CTL, *args], capture_output=True, timeout=120,
                          env=madtrace_env(runtime), **kw)


def meta(directory) -> dict:
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-pie"])
def test_record_through_the_resident_equals_the_python_command(tmp_path, resident, variant):
    argv = [prog("data_globals", variant)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    python = run(resident, "record", "-q", "--data", "--no-store", "-o", str(tmp_path / "py"),
                 "--", *argv)
    c = ctl(resident, "record", "-q", "--data", "--no-store", "-o", str(tmp_path / "c"), "--", *argv)
    assert (c.returncode, c.stdout) == (python.returncode, python.stdout) == \
        (native.returncode, native.stdout)
    assert c.stderr == python.stderr == b""
    a, b = meta(tmp_path / "py"), meta(tmp_path / "c")
    assert a["accesses"] == b["accesses"] and a["accesses"]
    assert a["calls"] == b["calls"]
    assert b["outcome"] == "exited" and b["mode"] == "launch"
    # the program's own exit code is the command's
    status = ctl(resident, "record", "-q", "--no-store", "-o", str(tmp_path / "e"), "--",
                 "sh", "-c", "echo out; exit 3")
    assert (status.returncode, status.stdout) == (3, b"out\n")


def test_the_program_is_the_clients_child_with_its_descriptors_and_signals(tmp_path, resident):
    """As the Python command launches it (its process group, descriptors and
    signal dispositions: the defaults, not Python's ignored SIGPIPE), except
    that its parent is madtrace-ctl."""
    native = subprocess.Popen(["sh", "-c", SELF], stdout=subprocess.PIPE, env=madtrace_env(resident))
    own = native.communicate(timeout=60)[0].decode()
    assert f"ppid={os.getpid()} pgid={os.getpgid(0)}" in own
    c = subprocess.Popen([CTL, "record", "-q", "--no-store", "-o", str(tmp_path / "c"), "--",
                          "sh", "-c", SELF], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=madtrace_env(resident))
    out, err = c.communicate(timeout=60)
    assert c.returncode == 0, err
    assert out.decode() == own.replace(f"ppid={os.getpid()}", f"ppid={c.pid}")
    python = run(resident, "record", "-q", "--no-store", "-o", str(tmp_path / "py"), "--",
                 "sh", "-c", SELF)
    assert python.returncode == 0, python.stderr
    # the same through the Python command: it gives the program back the SIGPIPE and
    # SIGXFSZ that Python ignores (the untraced run shows what they were here)
    assert re.sub(rb"ppid=\d+", b"", python.stdout) == re.sub(rb"ppid=\d+", b"", out)


def test_errors_and_codes_are_the_python_commands(tmp_path, resident):
    existing = tmp_path / "exists"
    existing.mkdir()
    for args in (["--", "no-such-command-here"], ["--", "/etc/passwd"], ["--bogus", "--", "true"],
                 ["-o", str(existing), "--", "true"], ["--data-engine", "x", "--data", "--", "true"]):
        out = [] if "-o" in args else ["-o", str(tmp_path / "out")]
        same_answer(run(resident, "record", "-q", *out, *args),
                    ctl(resident, "record", "-q", *out, *args))
        assert not os.path.exists(tmp_path / "out")
    # the children forked for commands that never launched are gone (none waits on its pipe)
    time.sleep(0.2)
    mine = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).startswith(CTL)]
    assert mine == []


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sigterm_to_the_client_detaches_as_the_python_command(tmp_path, resident):
    script = "sleep 1; echo done"
    c = subprocess.Popen([CTL, "record", "--no-store", "-o", str(tmp_path / "c"), "--",
                          "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=madtrace_env(resident))
    deadline = time.monotonic() + 30
    while not os.path.exists(tmp_path / "c" / "meta.json") and time.monotonic() < deadline:
        time.sleep(0.02)       # written once the program runs traced
    time.sleep(0.2)
    c.send_signal(signal.SIGTERM)
    out, err = c.communicate(timeout=60)
    assert c.returncode == 0, err
    assert b"detached from process" in err and b"(SIGTERM)" in err
    assert out == b"done\n"       # the program went on untraced, to its end
    assert meta(tmp_path / "c")["outcome"] == "detached"


def test_a_resident_that_refuses_leaves_it_to_the_python_command(tmp_path):
    runtime = private_runtime(tmp_path)
    fake = FakeResident(runtime, {"refused": "not today"})
    try:
        c = ctl(runtime, "record", "-q", "--no-store", "-o", str(tmp_path / "c"), "--", "sh", "-c",
                "echo $PPID")
    finally:
        fake.close()
    assert c.returncode == 0, c.stderr
    assert fake.requests and fake.requests[0]["argv"][0] == "record" and fake.requests[0]["child"] > 0
    # the Python command launched it (exec'd in the client: same pid, its parent)
    assert int(c.stdout) != fake.requests[0]["child"]
    assert meta(tmp_path / "c")["outcome"] == "exited"


def test_the_resident_reads_the_copiers_caches_for_the_worker(tmp_path, resident):
    """The second record of a program through the resident: the worker finds the
    copier's analysis files read already (the resident read them before forking
    it), and records what the first run recorded."""
    env = dict(madtrace_env(resident), MADTRACE_CACHE_DIR=str(tmp_path / "cache"))
    argv = [prog("data_globals", "O2-pie")]
    runs = []
    for i in range(2):
        out = tmp_path / f"t{i}"
        c = subprocess.run([CTL, "record", "-q", "--data", "--no-functions", "--no-store", "-o",
                            str(out), "--", *argv], capture_output=True, timeout=120, env=env)
        assert c.returncode == 0, c.stderr
        runs.append(meta(out))
    first, second = (m["data_tracing"]["paths"]["rewriter"] for m in runs)
    assert first.get("analyses cached", 0) > 0 and \
        "analysis files read by the resident process" not in first
    assert second["analysis files read by the resident process"] >= 1
    assert second["analyses from the cache"] >= first["analyses cached"]
    assert runs[0]["accesses"] == runs[1]["accesses"]
    with open(os.path.join(resident, "madtrace", "resident.log")) as f:
        assert "warm_copier" not in f.read()
