"""Function tracing and the hybrid data engine together.

A function that function tracing patches at its entry, and that the hybrid
engine relocated, is called many times: each call must record its entry and
exit, then run the engine's copy (its probes), with no fault
(calls/entry_links.py).  Likewise a call made from a relocated function
through a call-site trampoline must return into the copy, not into the
original code.  The loop also calls a library function through
the PLT, whose GOT shares a page with the traced .data: those calls must
stop faulting too (data/hybrid/plt_copies.py).

Oracles: callgrind (call counts), lackey (per-instruction accesses of the
executable), the program's own output; and the engine's own counters, at
two run lengths: the moves into copies and the faults must not grow with
the number of calls (before, every call of such a function faulted once and
was moved by a ptrace stop)."""

from __future__ import annotations

import json

import pytest

from madtrace.binary.elf import ElfImage

from .oracles import callgrind_calls, lackey_accesses
from .test_data import _ranges_from_stderr, named_like_madtrace, sections
from .util import (check_live_output, finish_live, madtrace, prog, run_untraced, start_data_tracing,
                   start_ready)

HYBRID = ["--data-engine", "hybrid"]
SHORT, LONG = 300, 1500


def record(tmp_path, tag: str, argv: list[str], *options: str) -> tuple[dict, bytes]:
    out = tmp_path / tag
    result = madtrace("record", "-q", "--data", *HYBRID, "--no-store", "-o", str(out), *options,
                      "--", *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "meta.json").read_text()), result.stdout


def steady(meta: dict) -> dict:
    """What must not grow with the number of calls."""
    data = meta["data_tracing"]
    rewriter = data["paths"]["rewriter"]
    return {"moved": rewriter.get("moved", 0) + rewriter.get("moved_by_fault_loop", 0),
            "faults": data["faults"],
            "untraced_faults": data["untraced_faults"],
            "fault path accesses": data["paths"]["accesses_by_path"]["fault"]}


@pytest.mark.parametrize("method, variant", [("entry", "O0-nopie"), ("entry", "O2-nopie"),
                                             ("auto", "O2-nopie")])
def test_calls_through_trampolines_run_the_copies(tmp_path, method, variant):
    """bump() is patched at its entry (its address is taken); scale(), called
    by bump(), at its entry too (--method entry) or at its call site (auto).
    countdown() branches back to its own entry: with its entry patched, each
    such branch is a call for function tracing, so its copy keeps the jump to
    the trampoline; it must count what function tracing alone counts."""
    path = prog("data_calls", variant)
    metas = {}
    for n in (SHORT, LONG):
        argv = [path, str(n)]
        native = run_untraced(argv)
        metas[n], out = record(tmp_path, f"t{n}", argv, "--method", method, "-f", "bump",
                               "-f", "scale", "-f", "main", "-f", "countdown")
        assert out == native.stdout
    meta = metas[LONG]
    functions = json.loads((tmp_path / f"t{LONG}" / "functions.json").read_text())["functions"]
    methods = {f["name"]: f["method"] for f in functions}
    assert methods["bump"] == "entry" and methods["scale"] == ("callsite" if method == "auto" else "entry")
    # calls: callgrind's; countdown's: function tracing's without data tracing
    assert {k: meta["calls"][k] for k in ("bump", "scale")} == \
        callgrind_calls(argv, ["bump", "scale"])
    alone = madtrace("record", "-q", "--no-store", "-o", str(tmp_path / "alone"), "--method", method,
                     "-f", "countdown", "--", *argv, timeout=300)
    assert alone.returncode == 0, alone.stderr
    alone_calls = json.loads((tmp_path / "alone" / "meta.json").read_text())["calls"]
    assert meta["calls"]["countdown"] == alone_calls["countdown"] >= 1
    # accesses per instruction of the executable: lackey's
    image = ElfImage.load(path)
    text = image.section(".text")
    oracle = lackey_accesses(argv, (text.address, text.address + text.size),
                             lambda stderr: _ranges_from_stderr(sections(path, ".data", ".bss"),
                                                                stderr))
    got, expected = named_like_madtrace(path, oracle, meta["accesses"])
    assert got == expected
    assert sum(c["L"] + c["S"] for c in got.values()) > 4 * LONG
    # the calls run the copies: nothing grows with the number of calls (the longer run
    # comes second: it lays out what the first learnt, and moves fewer threads)
    short, long = steady(metas[SHORT]), steady(metas[LONG])
    assert long["moved"] <= short["moved"] and \
        dict(long, moved=0) == dict(short, moved=0), (short, long)
    rewriter = meta["data_tracing"]["paths"]["rewriter"]
    assert rewriter["entries linked"] >= 1 and rewriter["plt stubs redirected"] >= 1
    if method == "auto":
        assert rewriter["call sites returning into copies"] >= 1
    assert long["untraced_faults"] < 16


@pytest.mark.parametrize("data_off_first", [True, False])
def test_instrument_a_moved_function_live(tmp_path, monkeypatch, data_off_first):
    """The reverse order, live: data tracing moves bump() (its entry jumps to the
    copy), then `instrument` patches bump() at its entry: its calls are
    counted and go on to the copy; `restore` gives the entry back, with data
    tracing turned off before or after it; at detach the program's output is
    the untraced one.  (Before, the entry patch of function tracing took the
    data engine's jump as the function's own first bytes, and gave it back at
    restore: once data tracing was off, the program jumped into the copies
    madtrace took out at detach.)"""
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")
    target = start_ready([prog("live_calls", "O0-nopie")])     # -O2: bump() is 5 bytes
    batch = tmp_path / "commands.txt"
    off, restore = "trace data off\nsleep 0.2\n", "restore bump\nsleep 0.2\n"
    batch.write_text("trace data on\nsleep 0.5\ninstrument bump\nsleep 0.5\ncalls --json\n"
                     + (off + restore if data_off_first else restore + off) + "calls --json\n")
    try:
        result = madtrace("repl", str(target.pid), "-q", "--method", "entry", "-o",
                          str(tmp_path / "t"), "--batch", str(batch), timeout=300)
        out = finish_live(target)
    finally:
        target.kill()
    assert result.returncode == 0, result.stderr
    assert target.returncode == 0
    check_live_output(target.args[0], out)
    lines = result.stdout.decode().splitlines()
    assert "  bump (entry, 1 sites)" in lines
    counted = json.loads(next(line for line in lines if line.startswith("{")))
    final = json.loads(lines[-1])
    assert counted["bump"] > 0 and final["bump"] >= counted["bump"]
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    rewriter = meta["data_tracing"]["paths"]["rewriter"]
    assert rewriter["entries given to function tracing"] == 1
    # while instrumented, bump's calls ran its copy: few moves for many calls
    assert rewriter["moved"] + rewriter.get("moved_by_fault_loop", 0) < 50 < counted["bump"]


def test_instrument_and_restore_live_while_the_caller_runs_its_copy(tmp_path, monkeypatch):
    """main() of live_calls is moved into a copy (it touches `rounds`) and
    runs its loop there; then `instrument tick` patches tick()'s call site in
    main(): the copy's call changes with it, so tick's calls are counted;
    `restore tick` takes both out again, and the count stops.  (Before,
    calls made from the copy were never counted after a live instrument.)"""
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")
    target = start_ready([prog("live_calls", "O2-nopie")])
    batch = tmp_path / "commands.txt"
    batch.write_text("trace data on\nsleep 0.5\ninstrument tick\nsleep 0.5\ncalls --json\n"
                     "restore tick\ncalls --json\nsleep 0.5\ncalls --json\n")
    try:
        result = madtrace("repl", str(target.pid), "-q", "-o", str(tmp_path / "t"),
                          "--batch", str(batch), timeout=300)
        out = finish_live(target)
    finally:
        target.kill()
    assert result.returncode == 0, result.stderr
    assert target.returncode == 0
    check_live_output(target.args[0], out)
    lines = result.stdout.decode().splitlines()
    assert "  tick (callsite, 1 sites)" in lines
    counted, restored, final = (json.loads(line) for line in lines if line.startswith("{"))
    assert counted["tick"] > 100
    assert restored["tick"] <= final["tick"] <= restored["tick"] + 1
    rewriter = json.loads((tmp_path / "t" / "meta.json").read_text())["data_tracing"]["paths"]["rewriter"]
    assert rewriter["call sites mirrored into copies"] >= 2


def test_target_finishes_when_the_tracer_is_killed_while_calls_run_the_copies(tmp_path):
    """madtrace is SIGKILLed while bump()'s calls go from its entry trampoline
    to its copy: the guard turns the probes back into plain instructions and
    gives the pages back, the trampolines write into rings nobody reads (and
    drop), and the program finishes with its native output."""
    import os
    import signal
    import time

    argv = [prog("data_calls", "O2-nopie"), "3000000"]
    native = run_untraced(argv, timeout=120)
    tracer = start_data_tracing(["record", "--data", *HYBRID, "--method", "entry", "-f", "bump",
                                 "-f", "scale", "-o", str(tmp_path / "t"), "--", *argv])
    try:
        time.sleep(1.5)
        os.kill(tracer.pid, signal.SIGKILL)
        tracer.wait(timeout=30)
        out = tracer.stdout.read()
    finally:
        if tracer.poll() is None:
            tracer.kill()
    assert out == native.stdout
