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
from madtrace.inject.engine import FunctionTracer
from madtrace.process.tracee import Tracee
from madtrace.trace.reader import iter_call_chunks

from .util import (ROOT, VARIANTS, check_live_output, finish_live, madtrace, prog, run_untraced,
                   start_ready)

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


@pytest.mark.parametrize("extra", [[], ["--no-time"]])
def test_full_rings_wait_and_lose_nothing(tmp_path, extra):
    """Tracer and target on one CPU: the target fills its ring (4 MiB, 131072
    calls) before the drain gets the CPU, and waits for it each time; every
    record is kept, in order, and the waits are counted."""
    n = 1_000_000
    argv = [prog("bench_calls", "O2-pie"), str(n)]
    cpu = min(os.sched_getaffinity(0))
    out = tmp_path / "t"
    r = subprocess.run([sys.executable, "-m", "madtrace.cli.main", "record", "-q", *extra, "-o",
                        str(out), "-f", "leaf", "--", *argv], capture_output=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT),
                       preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == run_untraced(argv).stdout
    m = meta(out)
    assert m["calls"] == {"leaf": n} and m["dropped_events"] == 0
    assert m["function_tracing"]["ring_waits"] > 0
    chunks = [c for _, c in iter_call_chunks(str(out))]
    records = np.concatenate(chunks)
    assert len(records) == 2 * n
    assert (records["code"] == np.tile(np.array([0, 1], dtype=np.uint32), n)).all()
    tsc = records["tsc"].astype(np.int64)
    if extra:
        assert not tsc.any()
    else:
        assert tsc.min() > 0 and (np.diff(tsc) >= 0).all()


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
def test_cxx_exceptions_still_caught(tmp_path, variant):
    """A module using C++ exceptions is left unpatched, with the reason reported."""
    argv = [prog("cxx_throw", variant)]
    expected = run_untraced(argv)
    assert expected.stdout == b"sum=8628 caught=14\n"
    result = madtrace("record", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == expected.returncode == 0
    assert result.stdout == expected.stdout
    assert b"C++ exceptions" in result.stderr
    report = meta(tmp_path / "t")["function_tracing"]["patch_report"] \
        if (tmp_path / "t" / "functions.json").exists() else None
    assert report is None or not report["patched"]
