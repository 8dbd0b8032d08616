# SPDX-License-Identifier: GPL-2.0-or-later
"""The REPL, driven for real: through a pseudo-terminal (pexpect), in batch
mode, and launched with --repl.

Oracles: the program's output untraced (a reference run in parallel), call
counts that grow while a function is instrumented and stop once restored,
and one-line errors after which the session goes on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pexpect
import pytest

from .util import ROOT, madtrace, prog, start_ready, summary_json

ITERATIONS = "5000000"      # about 5 s: long enough for the session, short enough to finish
PROMPT = "madtrace>"


def reference(argv) -> subprocess.Popen:
    """The same program untraced, running in parallel (same output expected)."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 60) -> bytes:
    out, _ = proc.communicate(timeout=timeout)
    return out


def summary(directory) -> dict:
    result = madtrace("summary", str(directory), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def spawn_repl(*args: str) -> pexpect.spawn:
    env = dict(os.environ, PYTHONPATH=ROOT, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    return pexpect.spawn(sys.executable, ["-m", "madtrace.cli.main", *args], env=env,
                         dimensions=(50, 200), timeout=30, encoding="utf-8",
                         logfile=open(os.environ["REPL_LOG"], "w") if "REPL_LOG" in os.environ else None)


def json_after(child: pexpect.spawn, line: str) -> dict:
    child.sendline(line)
    child.expect(r"(\{[^\n]*\})\r\n")
    value = json.loads(child.match.group(1))
    child.expect(PROMPT)
    return value


def test_repl_through_a_terminal(tmp_path):
    argv = [prog("live_calls", "O2-pie"), ITERATIONS]
    expected = reference(argv)
    target = start_ready(argv)
    child = spawn_repl("repl", str(target.pid), "-o", str(tmp_path / "t"))
    try:
        child.expect(PROMPT)
        child.send("instrument ti\t")          # Tab completes the function name
        child.expect("tick")
        time.sleep(0.5)     # a person's pause: prompt_toolkit finishes the completion first
        child.send("\r")
        child.expect(r"instrumented 1 function .*1 patches")
        child.expect(PROMPT)
        first = json_after(child, "calls --json")["tick"]
        child.sendline("sleep 0.3")
        child.expect(PROMPT)
        second = json_after(child, "calls --json")["tick"]
        assert 0 < first < second
        child.sendline("top 5")
        child.expect(r"\d+\s+\d+\s+[\d.]+\s+tick")
        child.expect(PROMPT)
        # errors: one line each, and the session goes on
        for line, message in [("bogus 1", "error: unknown command 'bogus'"),
                              ("instrument", "error: instrument takes at least 1 argument"),
                              ("calls now", "error: calls takes no arguments"),
                              ('x "tick', "error: malformed command"),
                              ("restore nothing_here", "error: no instrumented function"),
                              ("watch counter", "error: unknown variable: counter"),
                              ("trace data sideways", "error: usage: trace data on"),
                              ("help --json", "error: help has no --json form")]:
            child.sendline(line)
            child.expect(re.escape(message) + r"[^\r\n]*\r\n")
            child.expect(PROMPT)
        child.sendline("restore tick")
        child.expect("restored 1 function")
        child.expect(PROMPT)
        stopped = json_after(child, "calls --json")["tick"]
        child.sendline("sleep 0.3")
        child.expect(PROMPT)
        assert json_after(child, "calls --json")["tick"] <= stopped + 1   # counting stopped
        status = json_after(child, "status --json")
        assert status["functions_instrumented"] == 0 and status["functions_restored"] == 1
        assert status["threads"] == [target.pid] and status["dropped_events"] == 0
        child.sendline("detach")
        child.expect("detached from process")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        out = finish(target)
    finally:
        child.close(force=True)
        target.kill()
    assert b"ready\n" + out == finish(expected)
    assert target.returncode == 0
    s = summary(tmp_path / "t")
    assert s["outcome"] == "detached" and s["exit_status"] is None
    assert s["calls"]["tick"] >= stopped



def run_batch(tmp_path, target, batch, expected):
    """``madtrace repl PID --batch FILE`` on a running target; the target's
    output must be the untraced one.  Returns the result and its stdout lines."""
    try:
        result = madtrace("repl", str(target.pid), "-q", "-o", str(tmp_path / "t"),
                          "--batch", str(batch))
        out = finish(target)
    finally:
        target.kill()
    assert result.returncode == 0, result.stderr
    assert b"ready\n" + out == finish(expected)
    return result, result.stdout.decode().splitlines()

def test_batch_file(tmp_path):
    argv = [prog("live_calls", "O0-nopie"), ITERATIONS]
    expected = reference(argv)
    target = start_ready(argv)
    batch = tmp_path / "commands.txt"
    batch.write_text("# a comment, then a blank line\n\n"
                     "instrument tick --json\n"
                     "instrument t* --json\n"
                     "sleep 0.3\n"
                     "calls --json\n"
                     "frobnicate\n"
                     "x tick 16 --json\n"
                     "regs --json\n"
                     "funcs t* --json\n"
                     "restore all\n"
                     "calls --json\n"
                     "instrument tock\n"
                     "sleep 0.2\n"
                     "calls --json\n")
    result, lines = run_batch(tmp_path, target, batch, expected)
    first = json.loads(lines[0])
    assert [p["function"] for p in first["patched"]] == ["tick"]
    added = json.loads(lines[1])         # incremental: only what is new
    assert [p["function"] for p in added["patched"]] == ["tock"]
    calls = json.loads(lines[2])
    assert calls["tick"] > 0 and calls["tock"] > 0
    dump = json.loads(lines[3])
    assert dump["symbol"].startswith("tick (live_calls-O0-nopie)") and len(dump["hex"]) == 32
    regs = json.loads(lines[4])
    assert regs["tid"] == target.pid and regs["rip"] > 0
    funcs = {f["name"]: f for f in json.loads(lines[5])}
    assert funcs["tick"]["state"].startswith("instrumented")
    assert lines[6].startswith("restored 2 functions")
    restored = json.loads(lines[7])
    assert restored["tick"] >= calls["tick"]
    assert lines[8].startswith("instrumented 1 function")    # tock again, counting on
    final = json.loads(lines[-1])
    assert final["tock"] > restored["tock"] and final["tick"] <= restored["tick"] + 1
    errors = result.stderr.decode().splitlines()
    assert errors == ["error: commands.txt:7: unknown command 'frobnicate' (type 'help' for the list)"]
    assert summary(tmp_path / "t")["calls"]["tock"] >= final["tock"]


def test_launch_with_repl_reads_commands_from_stdin(tmp_path):
    argv = [prog("live_calls", "O2-nopie"), "400000"]
    expected = subprocess.run(argv, capture_output=True, timeout=60).stdout
    result = madtrace("--repl", "-q", "-f", "tock", "-o", str(tmp_path / "t"), "--", *argv,
                      input=b"help instrument\ncalls --json\n")
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert out.startswith("ready\n")
    assert "usage: instrument GLOB... [--json]" in out
    match = re.search(r'\{"tock": (\d+)\}', out)
    assert match and int(match.group(1)) > 0
    for line in expected.decode().splitlines():
        assert line in out


def test_attach_with_repl_and_wrong_arguments(tmp_path):
    target = start_ready([prog("live_calls", "O2-pie"), "2000000"])
    try:
        result = madtrace("attach", str(target.pid), "--repl", "-q", "-o", str(tmp_path / "t"),
                          input=b"instrument no_such_function_*\nstatus --json\n")
        out = finish(target)
    finally:
        target.kill()
    assert result.returncode == 0, result.stderr
    assert result.stderr.decode().splitlines() == [
        "error: stdin:1: no function matches 'no_such_function_*'"]
    assert json.loads(result.stdout)["functions_instrumented"] == 0
    assert out.startswith(b"a=")
    bad = madtrace("repl", "notapid")
    assert bad.returncode == 2 and bad.stderr.decode().strip() == "madtrace: not a PID: 'notapid'"


def test_data_tracing_on_and_off_live(tmp_path):
    """trace data on while the target runs, its accesses to a global are
    recorded; off restores the pages; the output is unchanged."""
    argv = [prog("live_calls", "O2-nopie"), ITERATIONS]
    expected = reference(argv)
    target = start_ready(argv)
    batch = tmp_path / "commands.txt"
    batch.write_text("trace data on\nsleep 0.3\nstatus --json\ntrace data off\n"
                     "trace data off\nsleep 0.1\n")
    result, lines = run_batch(tmp_path, target, batch, expected)
    assert lines[0].startswith("data tracing on: ")
    status = json.loads(lines[1])
    assert status["data_tracing"].startswith("on (")
    assert lines[2].startswith("data tracing off after ")
    assert "data tracing is not on" in result.stderr.decode()
    accesses = summary_json(tmp_path / "t")["accesses"]
    assert any(name.startswith("tick+") and c["L"] > 0 and c["S"] > 0
               for name, c in accesses.items()), accesses


@pytest.mark.parametrize("command", ["watch ticks", "trace data on '.bss of live_calls*'"])
def test_watch_one_variable_or_region_live(tmp_path, command):
    """Only the selected bytes are traced: the global `ticks` (written by tick())."""
    argv = [prog("live_calls", "O2-nopie"), ITERATIONS]
    expected = reference(argv)
    target = start_ready(argv)
    batch = tmp_path / "commands.txt"
    batch.write_text(f"{command}\nsleep 0.3\ntrace data off\n")
    result, lines = run_batch(tmp_path, target, batch, expected)
    assert lines[0].startswith("data tracing on: 1 regions (")
    accesses = summary_json(tmp_path / "t")["accesses"]
    assert accesses and all(name.startswith("tick+") for name in accesses), accesses
    assert sum(c["L"] + c["S"] for c in accesses.values()) > 2
