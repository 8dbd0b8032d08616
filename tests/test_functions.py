"""Function tracing beyond call counts: forks, live restore, a large real
library, a tracer killed mid-trace, the patch report, rings that fill up.

Oracles: the programs' own output (byte-identical with and without tracing)
and the counts each program implies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from madtrace.binary.address_space import AddressSpace
from madtrace.calls.engine import FunctionTracer
from madtrace.process.tracee import Tracee
from madtrace.trace.reader import iter_call_chunks

from .oracles import callgrind_calls
from .util import (ROOT, VARIANTS, check_live_output, finish_live, madtrace, prog, run_untraced,
                   start_ready, summary_json)

LIBPYTHON = "libpython3.11.so.1.0"


def meta(directory) -> dict:
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("follow", [[], ["--follow-forks"]])
def test_fork_child_runs_unpatched_and_is_not_counted(tmp_path, variant, follow):
    argv = [prog("fork_calls", variant)]
    expected = run_untraced(argv)
    result = madtrace("record", "-q", *follow, "-o", str(tmp_path / "t"), "-f", "work", "--", *argv)
    assert result.returncode == expected.returncode == 0
    assert sorted(result.stdout.splitlines()) == sorted(expected.stdout.splitlines())
    m = meta(tmp_path / "t")
    assert m["calls"] == {"work": 15}   # 10 before the fork, 5 after; the child's 1000 are not ours
    assert m["dropped_events"] == 0 and m["forks"] == 1


def _python_with_libpython():
    exe = os.path.realpath(sys.executable)
    libs = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    if LIBPYTHON not in libs:
        pytest.fail(f"{exe} does not link {LIBPYTHON}; the large-library test needs it")
    return exe


def test_every_call_site_of_libpython(tmp_path):
    """All ~44k direct call sites of libpython patched; python's output unchanged."""
    python = _python_with_libpython()
    code = "import json, re; print(sorted(json.loads(json.dumps({'a': [1, 2, 3]}))), re.sub('b+', 'x', 'abbbc'))"
    expected = run_untraced([python, "-c", code])
    result = madtrace("record", "-q", "--method", "callsite", "-o", str(tmp_path / "t"),
                      "-f", f"{LIBPYTHON}:*", "--", python, "-c", code, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.stdout
    m = meta(tmp_path / "t")
    report = m["function_tracing"]["patch_report"]
    patches = sum(p["sites"] for p in report["patched"])
    assert patches > 40000, patches
    assert m["dropped_events"] == 0
    assert m["calls"]["PyObject_GetAttr"] > 0


def test_auto_method_on_libpython_is_exact_for_exported_functions(tmp_path):
    python = _python_with_libpython()
    code = "print(len([i * i for i in range(1000)]))"
    expected = run_untraced([python, "-c", code])
    result = madtrace("record", "-q", "-o", str(tmp_path / "t"), "-f", f"{LIBPYTHON}:PyList_*",
                      "-f", f"{LIBPYTHON}:list_*", "--", python, "-c", code, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected.stdout
    report = meta(tmp_path / "t")["function_tracing"]["patch_report"]
    methods = {p["function"]: p["method"] for p in report["patched"]}
    assert methods["PyList_New"] == "entry"          # exported
    assert "callsite" in methods.values()            # static helpers
    assert not report["inexact"]


def _counts(engine: FunctionTracer) -> dict:
    engine.rings.drain_all()
    return engine.call_counts()


def _run_until(tracee: Tracee, engine: FunctionTracer, done, timeout: float = 60) -> dict:
    """Let the target run a little at a time until ``done(counts)`` (a slow or
    loaded machine only makes this take longer)."""
    deadline = time.monotonic() + timeout
    while True:
        tracee.resume_all()
        time.sleep(0.05)
        tracee.stop_all()
        counts = _counts(engine)
        if done(counts) or time.monotonic() > deadline:
            return counts


def test_restore_one_function_live_then_detach(tmp_path):
    argv = [prog("live_calls", "O2-pie")]
    proc = start_ready(argv)      # runs until its stdin is closed
    try:
        tracee = Tracee.attach(proc.pid)
        engine = FunctionTracer(tracee, AddressSpace.from_pid(proc.pid), str(tmp_path))
        engine.install(["tick", "tock"])
        tracee.on_new_thread.append(engine.register_thread)
        first = _run_until(tracee, engine, lambda c: c["tick"] > 0 and c["tock"] > 0)
        assert first["tick"] > 0 and first["tock"] > 0
        assert engine.restore({"tick"}) == len(engine.plan.functions[0].site_ids)
        second = _run_until(tracee, engine, lambda c: c["tock"] > first["tock"] + 1000)
        assert second["tick"] <= first["tick"] + 1   # at most a call in flight
        assert second["tock"] > first["tock"] + 1000
        engine.detach()
        tracee.detach()
        out = finish_live(proc)
    finally:
        proc.kill()
    check_live_output(argv[0], out)
    assert proc.returncode == 0


def test_target_survives_sigkill_of_the_tracer(tmp_path):
    """Patches stay in place when the tracer dies: the trampolines keep working
    without anyone draining (the writer waits a bounded time, then drops)."""
    argv = [prog("live_calls", "O2-nopie")]
    env = dict(os.environ, PYTHONPATH=ROOT)
    # the target shares the tracer's stdin: it runs until the test closes it
    tracer = subprocess.Popen([sys.executable, "-m", "madtrace.cli.main", "record", "-o",
                               str(tmp_path / "t"), "-f", "tick", "-f", "tock", "--", *argv],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    try:
        assert tracer.stdout.readline() == b"ready\n"
        tracer.send_signal(signal.SIGKILL)
        tracer.wait(timeout=30)
        time.sleep(0.2)              # the orphaned target goes on calling tick and tock
        tracer.stdin.close()         # now it finishes
        rest = tracer.stdout.read()  # EOF once the orphaned target exits
    finally:
        tracer.kill()
    check_live_output(argv[0], rest)


@pytest.mark.parametrize("timestamps", [True, False])
def test_a_full_ring_waits_and_loses_nothing(tmp_path, timestamps):
    """The drain is held back (its lock taken) until the target has filled its
    ring and waits; then it drains again.  The target never drops a record:
    every call counted is in calls/, in order, with non-decreasing timestamps,
    and the wait is counted."""
    argv = [prog("live_calls", "O2-pie")]
    proc = start_ready(argv)      # runs until its stdin is closed
    try:
        tracee = Tracee.attach(proc.pid)
        engine = FunctionTracer(tracee, AddressSpace.from_pid(proc.pid), str(tmp_path),
                                timestamps=timestamps)
        engine.install(["tick", "tock"])
        rings, L = engine.rings, engine.injector
        ring = rings.thread_ring[proc.pid]
        with rings.lock:                              # no drain meanwhile
            tracee.resume_all()
            deadline = time.monotonic() + 120
            while rings.ring_u64(ring, L.MT_RING_WAITS) == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            waits = rings.ring_u64(ring, L.MT_RING_WAITS)
            tracee.stop_all()
        assert waits > 0, "the ring never filled up"
        first = _run_until(tracee, engine, lambda c: True)   # drained, and on a little
        _run_until(tracee, engine, lambda c: c["tick"] > first["tick"] + 1000)
        engine.detach()
        totals = rings.totals()
        counts = engine.call_counts()
        tracee.detach()
        out = finish_live(proc)
    finally:
        proc.kill()
    check_live_output(argv[0], out)
    assert totals["dropped"] == 0 and totals["ring_waits"] >= waits
    records = np.concatenate([c for _, c in iter_call_chunks(str(tmp_path))])
    entries = records[records["code"] & 1 == 0]["code"] >> 1
    calls = {name: 0 for name in counts}
    for sid, n in zip(*np.unique(entries, return_counts=True)):
        calls[engine.plan.sites[sid].function.name] += int(n)
    assert calls == counts and counts["tick"] > L.MT_RING_RECORDS // 4
    tsc = records["tsc"].astype(np.int64)
    if timestamps:
        assert tsc.min() > 0 and (np.diff(tsc) >= 0).all()
    else:
        assert not tsc.any()


def test_no_functions_flag(tmp_path):
    argv = [prog("calls_recursion", "O0-pie")]
    result = madtrace("record", "-q", "--no-functions", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == 0
    assert meta(tmp_path / "t")["calls"] == {}
    assert not (tmp_path / "t" / "functions.json").exists()


def test_patch_report_lists_methods_and_reasons(tmp_path):
    argv = [prog("calls_callbacks", "O2-nopie")]
    result = madtrace("record", "-q", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == 0
    with open(tmp_path / "t" / "functions.json") as f:
        functions = {fn["name"]: fn for fn in json.load(f)["functions"]}
    # op_* are called through a table of pointers: only entry patching sees those calls
    assert functions["op_add"]["method"] == "entry"
    assert "address taken" in functions["op_add"]["reason"]
    assert functions["main"]["method"] == "entry"


@pytest.mark.parametrize("variant", VARIANTS)
def test_cxx_exceptions_unwind_through_trampolines(tmp_path, variant):
    """C++ exceptions thrown through patched call sites are caught where they are
    without madtrace (a catch two trampolines up, a catch-and-rethrow), every
    destructor on the way runs, and the calls are counted as callgrind counts
    them; functions that would need entry patching are skipped, with the reason."""
    argv = [prog("cxx_throw", variant)]
    expected = run_untraced(argv)
    assert expected.stdout == b"sum=8585 caught=14 destroyed=99 rethrown=7\n"
    patterns = ["_Z7checkedi", "_Z6middlei", "_Z5relayi"]
    if variant.startswith("O0"):
        patterns.append("_ZN5GuardD*")       # the destructor (inlined at -O2)
    result = madtrace("record", "-o", str(tmp_path / "t"), *[a for p in patterns for a in ("-f", p)],
                      "--", *argv)
    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout
    calls = {name: n for name, n in summary_json(tmp_path / "t")["calls"].items() if n}
    assert calls == {name: n for name, n in callgrind_calls(argv, patterns).items() if n}
    functions = {f["name"]: f for f in json.loads((tmp_path / "t" / "functions.json").read_text())
                 ["functions"]}
    assert all(functions[name]["method"] == "callsite" for name in calls)
    # main is address-taken (entry patching), which C++ exceptions cannot unwind through
    whole = madtrace("record", "-o", str(tmp_path / "all"), "-f", "main", "--", *argv)
    assert whole.returncode == 0 and whole.stdout == expected.stdout
    assert b"uses C++ exceptions, which cannot unwind through an exit stub" in whole.stderr


def test_trampoline_unwind_info_reads_back():
    """The .eh_frame object registered for call-site trampolines, read by an
    independent DWARF reader (pyelftools): per trampoline call, CFA = rsp + 8,
    rsp = CFA - 8 and the return address is the original site's."""
    import io

    from elftools.dwarf.callframe import CallFrameInfo
    from elftools.dwarf.structs import DWARFStructs

    from madtrace.target.trampoline_unwind import eh_frame

    entries = [(0x7F0000001000, 0x7F0000001005, 0x401234), (0x7F0000000800, 0x7F0000000805, 0x55550)]
    blob = eh_frame(entries)
    cfi = CallFrameInfo(io.BytesIO(blob), len(blob), address=0, for_eh_frame=True,
                        base_structs=DWARFStructs(little_endian=True, dwarf_format=32,
                                                  address_size=8))
    fdes = [e for e in cfi.get_entries() if type(e).__name__ == "FDE"]
    assert [(f.header.initial_location, f.header.address_range) for f in fdes] == \
        [(b, e - b) for b, e, _ in sorted(entries)]
    for fde, (_, _, return_to) in zip(fdes, sorted(entries)):
        row = fde.get_decoded().table[0]
        assert (row["cfa"].reg, row["cfa"].offset) == (7, 8)
        assert row[7].type == "VAL_OFFSET" and row[7].arg == -8
        assert row[16].type == "VAL_EXPRESSION"
        assert row[16].arg == [0x0E, *return_to.to_bytes(8, "little")]
