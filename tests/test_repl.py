# SPDX-License-Identifier: GPL-2.0-or-later
"""The REPL, driven for real: through a pseudo-terminal (pexpect), in batch
mode, and launched with --repl.

The target, tests/progs/live_calls, runs until the test closes its stdin, so
a slow or loaded machine only makes a test take longer, never lets the
target finish first.  Oracles: the program's own output, byte-identical to
an untraced run of the same number of iterations; its own counter of tick()
calls (the global `ticks`, read with `x`); call counts that grow while a
function is instrumented and stop once restored; the variables named by
the MadT export; and one-line errors after which the session goes on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pexpect
import pytest

from madtrace.live import registry
from madtrace.live.completion import CommandCompleter
from madtrace.trace.madt import parse_line

from .util import (ROOT, check_live_output, finish_live, madtrace, prog, start_ready,
                   summary_json)

PROMPT = "madtrace>"
PATIENCE = 120.0       # a safety net for a loaded machine, never a measured time


def spawn_repl(*args: str, state=None) -> pexpect.spawn:
    env = dict(os.environ, PYTHONPATH=ROOT, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)       # where the history goes
    return pexpect.spawn(sys.executable, ["-m", "madtrace.cli.main", *args], env=env,
                         dimensions=(50, 200), timeout=60, encoding="utf-8",
                         logfile=open(os.environ["REPL_LOG"], "w") if "REPL_LOG" in os.environ else None)


def expect_shown(child: pexpect.spawn, text: str) -> None:
    """``text`` on the terminal, maybe with escape sequences between its letters
    (prompt_toolkit redraws a completed word in pieces)."""
    child.expect(r"(?:\x1b\[[?0-9;]*[A-Za-z])*".join(map(re.escape, text)))


def json_after(child: pexpect.spawn, line: str) -> dict:
    child.sendline(line)
    child.expect(r"(\{[^\n]*\})\r\n")
    value = json.loads(child.match.group(1))
    child.expect(PROMPT)
    return value


def poll_repl(child: pexpect.spawn, line: str, done):
    """Run ``line`` (a --json command) until ``done(value)``: the target gets
    time to run between tries, as much as a loaded machine needs."""
    deadline = time.monotonic() + PATIENCE
    while True:
        value = json_after(child, line)
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{line}: still {value}"
        child.sendline("sleep 0.1")
        child.expect(PROMPT)


def ticks_of(child: pexpect.spawn) -> int:
    """The target's own count of tick() calls (its global `ticks`)."""
    dump = json_after(child, "x ticks 8 --json")
    return int.from_bytes(bytes.fromhex(dump["hex"]), "little")


def madt_accesses(directory) -> list[tuple[str, str, str]]:
    """(L|S, accessed symbol+offset, accessing function) of every data access,
    as `madtrace export --format madt` names them."""
    result = madtrace("export", str(directory), "--format", "madt")
    assert result.returncode == 0, result.stderr
    out = []
    for line in result.stdout.decode().splitlines():
        parsed = parse_line(line)
        if parsed["kind"] in "LS":
            what, _region, where = parsed["fields"][:3]
            out.append((parsed["kind"], what, where.rsplit("+", 1)[0]))
    return out


def test_repl_through_a_terminal(tmp_path):
    argv = [prog("live_calls", "O2-pie")]
    target = start_ready(argv)          # runs until its stdin is closed
    child = spawn_repl("repl", str(target.pid), "-o", str(tmp_path / "t"), state=tmp_path / "state")
    try:
        child.expect(PROMPT)
        child.send("watch tic\t")             # Tab completes a variable name...
        expect_shown(child, "watch ticks")
        child.send("\x03")                    # ...and Ctrl-C drops the line
        child.expect(PROMPT)
        child.send("instrument ti\t")         # Tab completes a function name
        expect_shown(child, "instrument tick")
        time.sleep(0.5)     # a person's pause: prompt_toolkit finishes the completion first
        child.send("\r")
        child.expect(r"instrumented 1 function .*1 patches")
        child.expect(PROMPT)
        first = poll_repl(child, "calls --json", lambda c: c["tick"] > 0)["tick"]
        second = poll_repl(child, "calls --json", lambda c: c["tick"] > first)["tick"]
        assert 0 < first < second
        child.sendline("top 5")
        child.expect(r"calls +new +per s +function\r\n +\d+ +\d+ +[\d.]+ +tick\r\n")
        child.expect(PROMPT)
        # Ctrl-C while a command runs cancels that command; the session goes on
        child.sendline("sleep 600")
        time.sleep(1)
        child.send("\x03")
        child.expect(r"error: sleep: interrupted\r\n")
        child.expect(PROMPT)
        # errors: one line each, and the session goes on
        (tmp_path / "taken").mkdir()
        for line, message in [("bogus 1", "error: unknown command 'bogus'"),
                              ("instrument", "error: instrument takes at least 1 argument"),
                              ("calls now", "error: calls takes no arguments"),
                              ('x "tick', "error: malformed command"),
                              ("restore nothing_here", "error: no instrumented function"),
                              ("watch counter", "error: unknown variable: counter"),
                              ("trace data sideways", "error: usage: trace data on"),
                              ("trace data in", "error: trace data: 'in' needs at least one"),
                              ("trace data on in nope_*", "error: trace data in: no function matches"),
                              ("save", "error: save takes 1 argument, not 0"),
                              ("save --forced x", "error: save: unknown option --forced"),
                              (f"save {tmp_path / 'taken'}", "already exists (use --force"),
                              (f"save {tmp_path / 't' / 'inside'}", "the trace directory of this session"),
                              ("top 0", "error: top: not a positive number"),
                              ("help --json", "error: help has no --json form")]:
            child.sendline(line)
            child.expect(re.escape(message) + r"[^\r\n]*\r\n")
            child.expect(PROMPT)
        # the trace so far, the target still running
        saved = json_after(child, f"save {tmp_path / 'snap'} --json")
        assert saved["calls"]["tick"] >= second and saved["dropped_events"] == 0
        child.sendline("restore tick")
        child.expect("restored 1 function")
        child.expect(PROMPT)
        stopped = json_after(child, "calls --json")["tick"]
        # the target goes on calling tick (its own counter moves), our count does not
        ticks = ticks_of(child)
        deadline = time.monotonic() + PATIENCE
        while ticks_of(child) < ticks + 5000:
            assert time.monotonic() < deadline, "the target stopped calling tick"
            child.sendline("sleep 0.1")
            child.expect(PROMPT)
        assert json_after(child, "calls --json")["tick"] <= stopped + 1   # counting stopped
        status = json_after(child, "status --json")
        assert status["functions_instrumented"] == 0 and status["functions_restored"] == 1
        assert status["patches"] == 0
        assert status["threads"] == [target.pid] and status["dropped_events"] == 0
        child.send("\x1b[A\r")                 # Up: the history gives the last line back
        child.expect(r"\{\"pid\": %d, [^\n]*\}\r\n" % target.pid)
        child.expect(PROMPT)
        child.sendline("detach")
        child.expect("detached from process")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        out = finish_live(target)
    finally:
        child.close(force=True)
        target.kill()
    check_live_output(argv[0], out)     # the program's output is the untraced one
    assert target.returncode == 0
    history = (tmp_path / "state" / "madtrace" / "history").read_text()
    assert "\n+instrument tick\n" in history and "\n+status --json\n" in history
    s = summary_json(tmp_path / "t")
    assert s["outcome"] == "detached" and s["exit_status"] is None
    assert s["calls"]["tick"] >= stopped
    snap = summary_json(tmp_path / "snap")
    assert snap["outcome"] == "snapshot" and snap["exit_status"] is None
    assert snap["calls"] == saved["calls"] and snap["pid"] == target.pid
    # the records saved are those counted: the report rebuilds the count from calls/*.rec
    report = madtrace("report", str(tmp_path / "snap"), "--json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["functions"]["tick"]["calls"] == saved["calls"]["tick"]


def run_batch(tmp_path, target, batch, **kw):
    """``madtrace repl PID --batch FILE`` on a running target, which then
    finishes; its output must be the untraced one.  Returns the result and
    its stdout lines."""
    try:
        result = madtrace("repl", str(target.pid), "-q", "-o", str(tmp_path / "t"),
                          "--batch", str(batch), **kw)
        out = finish_live(target)
    finally:
        target.kill()
    assert result.returncode == 0, result.stderr
    check_live_output(target.args[0], out)
    assert target.returncode == 0
    return result, result.stdout.decode().splitlines()


def test_batch_file(tmp_path):
    target = start_ready([prog("live_calls", "O0-nopie")])
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
    result, lines = run_batch(tmp_path, target, batch)
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
    assert summary_json(tmp_path / "t")["calls"]["tock"] >= final["tock"]


def test_save_snapshots_while_the_target_runs(tmp_path):
    """save DIR writes what detach writes (and summary, report, export read
    it), never over an existing directory without --force, and the session
    goes on: a later snapshot has more."""
    target = start_ready([prog("live_calls", "O2-nopie")])
    batch = tmp_path / "commands.txt"
    one, two = tmp_path / "one", tmp_path / "two"
    batch.write_text(f"instrument tick tock --json\nwatch ticks --json\nsleep 0.3\nsave {one} --json\n"
                     f"sleep 0.2\nsave {one}\nsave {one} --force --json\nsave two --json\n")
    # 'save two' is relative to where the REPL runs
    result, lines = run_batch(tmp_path, target, batch, cwd=tmp_path)
    assert json.loads(lines[1])["regions"][0][2] == "ticks"
    first, again, second = (json.loads(line) for line in lines[2:5])
    assert result.stderr.decode().splitlines() == [
        f"error: commands.txt:6: {one} already exists (use --force to overwrite it)"]
    assert first["calls"]["tick"] > 0 and first["accesses"] > 0
    assert again["calls"]["tick"] >= first["calls"]["tick"]
    assert second["directory"] == "two" and second["calls"]["tick"] >= again["calls"]["tick"]
    assert summary_json(two)["calls"] == second["calls"]
    snap = summary_json(one)
    assert snap["outcome"] == "snapshot" and snap["calls"] == again["calls"]
    assert sum(c["L"] + c["S"] for c in snap["accesses"].values()) == again["accesses"]
    human = madtrace("summary", str(one)).stdout.decode()
    assert "still running: a snapshot" in human
    accesses = madt_accesses(one)           # data/ saved too, named by the export
    assert len(accesses) == again["accesses"]
    # the snapshot's store is built by its first query: SQL counts what the save counted
    assert not (one / "store").exists()
    count = madtrace("query", str(one), "SELECT count(*) AS n FROM accesses", "--json")
    assert json.loads(count.stdout) == [{"n": again["accesses"]}], count.stderr
    assert {what for _, what, _ in accesses} == {"ticks+0"}
    final = summary_json(tmp_path / "t")    # the session's own directory is untouched
    assert final["outcome"] == "detached" and final["calls"]["tick"] >= second["calls"]["tick"]


def test_launch_with_repl_and_a_batch_file(tmp_path):
    """madtrace --repl --batch FILE -- CMD: the program keeps its own stdin."""
    argv = [prog("live_calls", "O2-nopie")]
    batch = tmp_path / "commands.txt"
    batch.write_text("help instrument\nsleep 0.3\ncalls --json\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    tracer = subprocess.Popen([sys.executable, "-m", "madtrace.cli.main", "--repl", "-q",
                               "-f", "tock", "-o", str(tmp_path / "t"), "--batch", str(batch),
                               "--", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    try:
        tracer.wait(timeout=PATIENCE)       # the batch is done: detached, the target runs on
        tracer.stdin.close()                # the target's stdin: now it finishes
        out = tracer.stdout.read().decode()  # the REPL's output and the target's
        err = tracer.stderr.read().decode()
    finally:
        tracer.kill()
    assert tracer.returncode == 0, err
    # the program's lines and the REPL's, in whatever order they were written
    assert re.search(r"^ready$", out, re.M), out
    assert "usage: instrument GLOB... [--json]" in out
    match = re.search(r'\{"tock": (\d+)\}', out)
    assert match and int(match.group(1)) > 0
    check_live_output(argv[0], re.search(r"^iterations=.*\n", out, re.M).group(0).encode())
    assert summary_json(tmp_path / "t")["calls"]["tock"] >= int(match.group(1))


def test_attach_with_repl_and_wrong_arguments(tmp_path):
    target = start_ready([prog("live_calls", "O2-pie")])
    try:
        result = madtrace("attach", str(target.pid), "--repl", "-q", "-o", str(tmp_path / "t"),
                          input=b"instrument no_such_function_*\nfuncs mall*\n"
                                b"funcs malloc --json\nstatus --json\n")
        out = finish_live(target)
    finally:
        target.kill()
    assert result.returncode == 0, result.stderr
    errors = result.stderr.decode().splitlines()
    assert errors[0] == "error: stdin:1: no function matches 'no_such_function_*'"
    # a glob that names nothing in the executable but matches in a library: say where
    assert re.fullmatch(r"error: stdin:2: no function of live_calls-O2-pie matches 'mall\*'; "
                        r"did you mean 'libc\.so\.6:mall\*' \(\d+ functions\)\?", errors[1]), errors
    assert len(errors) == 2
    lines = result.stdout.decode().splitlines()
    # a bare name the executable does not define: the library's definition
    assert [f["module"] for f in json.loads(lines[0])] == ["libc.so.6"]
    lines = lines[1:]
    assert json.loads(lines[0])["functions_instrumented"] == 0
    check_live_output(target.args[0], out)
    for args, message in [(("repl", "notapid"), "madtrace: not a PID: 'notapid'"),
                          (("attach", "1", "--batch", "x"), "madtrace: --batch goes with --repl"),
                          (("record", "--batch", "x", "--", "true"),
                           "madtrace: --batch goes with --repl")]:
        bad = madtrace(*args)
        assert bad.returncode == 2 and bad.stderr.decode().strip() == message
    both = madtrace("attach", "1", "--repl", "--daemon")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr.decode()


def test_data_tracing_on_and_off_live(tmp_path):
    """trace data on while the target runs, its accesses to globals are
    recorded; off restores the pages; the output is unchanged."""
    target = start_ready([prog("live_calls", "O2-nopie")])
    batch = tmp_path / "commands.txt"
    batch.write_text("trace data on\nsleep 0.3\nstatus --json\ntop\ntrace data off --json\n"
                     "trace data off\nsleep 0.1\n")
    result, lines = run_batch(tmp_path, target, batch)
    assert lines[0].startswith("data tracing on: ")
    status = json.loads(lines[1])
    assert status["data_tracing"].startswith("on (")
    assert lines[2].split() == ["accesses", "new", "per", "s", "function"]
    assert re.match(r" +\d+ +\d+ +[\d.]+ +bump$", lines[3])    # bump makes most accesses
    off = json.loads(lines[-1])
    assert off["message"].startswith("data tracing off after ") and not off["on"]
    assert "data tracing is not on" in result.stderr.decode()
    accessed = {(what.split("+")[0], where) for _, what, where in madt_accesses(tmp_path / "t")}
    assert {("ticks", "bump"), ("tocks", "bump")} <= accessed


@pytest.mark.parametrize("command", ["trace data on", "watch ticks"])
def test_detach_while_data_tracing(tmp_path, command):
    """Detach (the end of the batch) with data tracing still on: the stops
    madtrace caused (a fault, a stub's trap) are finished, not delivered to
    the target as its own signals; pages are restored; the output is the
    untraced one (run_batch checks it)."""
    target = start_ready([prog("live_calls", "O2-pie")])
    batch = tmp_path / "commands.txt"
    batch.write_text(f"instrument tick\n{command}\nsleep 0.3\n")
    run_batch(tmp_path, target, batch)
    summary = summary_json(tmp_path / "t")
    assert summary["calls"]["tick"] > 0 and summary["accesses"]


@pytest.mark.parametrize("command", ["watch ticks", "trace data on '.bss of live_calls*'"])
def test_watch_one_variable_or_region_live(tmp_path, command):
    """Only the selected bytes are traced: the global `ticks` (written by bump()
    for tick()), or the .bss of the program (ticks and tocks, not the
    `rounds` of its .data)."""
    target = start_ready([prog("live_calls", "O2-nopie")])
    batch = tmp_path / "commands.txt"
    batch.write_text(f"{command}\nsleep 0.3\ntrace data off\n")
    result, lines = run_batch(tmp_path, target, batch)
    assert lines[0].startswith("data tracing on: 1 regions (")
    accesses = madt_accesses(tmp_path / "t")
    variables = {what.split("+")[0] for _, what, _ in accesses}
    wanted = {"ticks"} if command.startswith("watch") else {"ticks", "tocks"}
    assert variables == wanted, variables
    assert {where for _, _, where in accesses} == {"bump"}
    assert {kind for kind, _, _ in accesses} == {"L", "S"}


def test_trace_data_only_inside_a_function(tmp_path):
    """trace data in tick: the accesses made while a thread is inside tick(),
    the nested bump() included: to `ticks` only; bump() for tock() and main's
    `rounds` are outside."""
    target = start_ready([prog("live_calls", "O2-nopie")])
    batch = tmp_path / "commands.txt"
    batch.write_text("trace data in tick --json\nsleep 0.3\nstatus --json\ntrace data off\n")
    result, lines = run_batch(tmp_path, target, batch)
    on = json.loads(lines[0])
    assert on["on"] and on["inside"] == ["tick"]
    assert "only inside tick" in json.loads(lines[1])["data_tracing"]
    accesses = madt_accesses(tmp_path / "t")
    assert accesses and {(what, where) for _, what, where in accesses} == {("ticks+0", "bump")}
    assert {kind for kind, _, _ in accesses} == {"L", "S"}


class FakeBackend:
    def __init__(self):
        self.asked = []

    def complete(self, kind, word):
        self.asked.append(kind)
        return {"functions": ["tick", "tock", "bump"], "variables": ["ticks", "tocks"],
                "regions": ["'.bss of prog'", "'[heap]'"]}.get(kind, [])


@pytest.mark.parametrize("text, word, expected", [
    ("sa", "sa", ["save"]),
    ("trace ", "", ["data", "--json"]),
    ("trace data ", "", ["on", "off", "in", "--json"]),
    ("trace data on .b", ".b", ["'.bss of prog'"]),
    ("trace data on '[h", "'[h", ["'[heap]'"]),
    ("trace data on '.bss of prog' i", "i", ["in"]),
    ("trace data on in t", "t", ["tick", "tock"]),
    ("trace data in b", "b", ["bump"]),
    ("watch t", "t", ["ticks", "tocks"]),
    ("save --force -", "-", ["--json"]),
    ("help sl", "sl", ["sleep"]),
])
def test_completion_of_arguments(text, word, expected):
    """What Tab offers after each kind of argument (the names come from the
    session; the REPL test above completes real ones through a terminal)."""
    found_word, found = CommandCompleter(FakeBackend()).candidates(text)
    assert found_word == word
    assert [c for c in found if c.startswith(word) or c.lstrip("'").startswith(word.lstrip("'"))] \
        == expected


def test_help_comes_from_each_command():
    """help lists every registered command with its usage and summary, and
    'help CMD' prints the command's own docstring."""
    listing = madtrace("ctl", "1", "help")          # help runs in the client: no daemon needed
    assert listing.returncode == 0
    text = listing.stdout.decode()
    help_command = registry.lookup("help")
    for command in registry.all_commands():
        assert f"  {command.usage}" in text and command.summary in text
        detail = help_command.run_frontend(None, [command.name])
        assert detail.startswith(f"usage: {command.usage}\n")
        assert command.description in detail and command.description
    assert {"save", "trace", "watch", "top", "x", "regs", "maps"} <= set(registry.names())
