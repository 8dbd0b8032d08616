# SPDX-License-Identifier: GPL-2.0-or-later
"""The hybrid engine's hook stubs: malloc & co. and memcpy/memmove/memset
recorded inside the target, in the thread's ring, without a ptrace stop per call
(data/heap/inline_hooks.py, hook_events.py, ring_split.py).

Programs: tests/progs/hooks_churn (malloc, a fill loop, memcpy, memset, free,
ROUNDS times; modes with fork and posix_spawn, a signal handler copying in the
middle of the hooked calls, a memcpy left by siglongjmp, a read-only source
page), hooks_threads (threads that free each other's blocks, so addresses are
reused across threads), hooks_cxx (operator new throwing bad_alloc).

Oracles: the programs' own counts of their calls and their output (native
runs); the stop counters of meta.json (``faults``, ``traps``) at two run
lengths; valgrind lackey per instruction (the executable's accesses to .data
and .bss); the naming of every heap access of a correct program (no access to
freed memory, which memcheck confirms for hooks_threads); with the stubs
switched off (MADTRACE_HOOK_STUBS=0: the breakpoints), the same block events and
a stop per call, which shows the counter counts what it should.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .test_data import _ranges_from_stderr, compare_with_lackey
from .util import madtrace, prog, start_data_tracing

HYBRID = ["--data-engine", "hybrid"]


def record(tmp_path, argv, *options, timeout=300, name="t"):
    out = tmp_path / name
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), *HYBRID,
                      *options, "--", *argv, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "meta.json").read_text()), result, str(out)


def counts(stdout: bytes) -> dict[str, int]:
    """The ``name=value`` counts a program printed."""
    return {k: int(v) for k, v in (w.split("=") for w in stdout.decode().split() if "=" in w)}


def events(meta: dict, kind: str) -> int:
    return meta["data_tracing"]["block_events"].get(kind, {}).get("events", 0)


def stops(meta: dict) -> int:
    """The ptrace stops the data engine took: faults (the fault path's), traps (the
    hooks' breakpoints), and the faults that moved a thread into a relocated copy
    (in Python, or in the fault loop)."""
    data = meta["data_tracing"]
    rewriter = data["paths"]["rewriter"]
    return data["faults"] + data["traps"] + rewriter.get("moved", 0) + \
        rewriter.get("moved_by_fault_loop", 0)


def order_report(meta: dict) -> dict:
    return meta["data_tracing"]["paths"]["hooks"]["order"]


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_stops_do_not_grow_with_the_calls(tmp_path, variant):
    """hooks_churn at 1000 and 6000 rounds (7 hooked calls a round): the same
    ptrace stops (faults: discovery; traps: none), every call recorded: a Y event
    per memcpy, a W per memset, a block per malloc, freed by its free."""
    metas = {}
    for rounds in (1000, 6000):
        argv = [prog("hooks_churn", variant), str(rounds)]
        native = subprocess.run(argv, capture_output=True, timeout=60)
        meta, result, _ = record(tmp_path, argv, name=str(rounds))
        assert result.stdout == native.stdout
        made = counts(native.stdout)
        data = meta["data_tracing"]
        assert data["traps"] == 0
        assert events(meta, "Y") == made["memcpy"]
        assert data["freed_accesses"] == 0
        hooks = data["paths"]["hooks"]
        assert hooks["breakpoints"] == {} and hooks["events"]["mem entries"] >= \
            made["memcpy"] + made["memset"]
        assert order_report(meta)["damaged_records"] == 0 and order_report(meta)["late"] == 0
        metas[rounds] = (meta, made)
    (short, few), (long, many) = metas[1000], metas[6000]
    assert stops(long) - stops(short) <= 4, (stops(short), stops(long))
    # what the library does besides the program's calls is the same at both lengths
    assert events(long, "W") - many["memset"] == events(short, "W") - few["memset"]
    alloc = lambda meta: meta["data_tracing"]["allocations"]   # noqa: E731
    assert alloc(long) - many["malloc"] == alloc(short) - few["malloc"]


def test_breakpoints_take_a_stop_per_call(tmp_path, monkeypatch):
    """The same program with the stubs switched off (MADTRACE_HOOK_STUBS=0):
    the same block events, and two stops per hooked call."""
    argv = [prog("hooks_churn", "O2-pie"), "300"]
    made = counts(subprocess.run(argv, capture_output=True, timeout=60).stdout)
    monkeypatch.setenv("MADTRACE_HOOK_STUBS", "0")
    meta, result, _ = record(tmp_path, argv)
    assert counts(result.stdout) == made
    assert meta["data_tracing"]["paths"]["hooks"] is None
    calls = made["malloc"] + made["free"] + made["memcpy"] + made["memset"]
    assert meta["data_tracing"]["traps"] >= 2 * calls
    assert events(meta, "Y") == made["memcpy"]


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_executable_accesses_equal_lackey(tmp_path, variant):
    """Per instruction of the executable, its loads and stores to .data, .bss and
    the heap (the pointers it calls through, its fill loop, what it reads back)
    equal lackey's: the stubs change nothing of the program's own accesses."""
    got = compare_with_lackey(tmp_path, "hooks_churn", variant, _ranges_from_stderr,
                              args=("300",), options=HYBRID)
    assert sum(v["L"] for v in got.values()) >= 4 * 300


def named(directory: str, function: str, heap_only: bool = False) -> tuple[int, int, int]:
    """(accesses made by the instructions of ``function`` (to the heap only:
    ``heap_only``, i.e. not to .data or .bss), those named <malloc...>, those to
    freed blocks)."""
    from madtrace.trace.query import connect
    con = connect(directory)
    heap = " AND region NOT LIKE '.%'" if heap_only else ""
    return con.execute(
        "SELECT count(*), count(*) FILTER (WHERE symbol LIKE '<malloc%'), "
        f"count(*) FILTER (WHERE freed) FROM accesses WHERE instruction LIKE '{function}+%'{heap}"
    ).fetchone()


@pytest.mark.parametrize("variant, runs", [("O0-pie", 4), ("O2-nopie", 4)])
def test_threads_free_each_others_blocks(tmp_path, variant, runs):
    """hooks_threads: 4 threads allocate, copy, free, and free each other's blocks
    (addresses come back in other threads).  A correct program (memcheck finds no
    invalid access): every access of consume() and worker() is named by the live
    block it touches, none by a freed one, in every run; every malloc is a block.
    (glibc's tcache teardown at a thread's exit, __malloc_arena_thread_freeres, a
    function without a symbol madtrace can see, reads freed chunks outside any
    hooked call: those accesses count as freed ones, with the breakpoint hooks too.)"""
    argv = [prog("hooks_threads", variant), "400", "4"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    memcheck = subprocess.run(["valgrind", "--tool=memcheck", "--error-exitcode=9", *argv],
                              capture_output=True, timeout=300)
    assert memcheck.returncode == 0 and memcheck.stdout == native.stdout
    made = counts(native.stdout)
    sizes = sum(24 + ((i + me) % 9) * 16 for me in range(4) for i in range(400))
    for run in range(runs):
        try:
            meta, result, directory = record(tmp_path, argv, name=str(run), timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"run {run}: the recording hung (a new thread left stopped was the "
                        "cause once: Tracee.hold_all resumes the threads made while held)")
        assert result.stdout == native.stdout, run
        data = meta["data_tracing"]
        assert data["allocations"] >= made["malloc"]
        assert order_report(meta)["damaged_records"] == 0 and order_report(meta)["late"] == 0
        total, live, freed = named(directory, "consume")
        assert freed == 0 and live == total, (run, total, live, freed)
        if variant.startswith("O0"):
            assert total == 2 * sizes     # each block read once, a byte at a time
        total, live, freed = named(directory, "worker", heap_only=True)
        assert freed == 0 and live == total and total >= sizes, (run, total, live, freed)
        assert data["traps"] == 0


@pytest.mark.parametrize("mode", ["signals", "storm"])
def test_signal_handler_copies_in_the_middle_of_hooked_calls(tmp_path, mode):
    """A SIGVTALRM handler copies a global with memcpy while the rounds are
    inside hooked calls (signals: a timer, every 50 us of the program's time;
    storm: sent by a second thread over and over, so that many land while a
    stub writes its group): every copy of the rounds and of the handler is
    exactly one Y event, the output is unchanged.  In a storm some signals do
    land in a group's writing, and the thread is moved back to write it again
    after the handler (rings/writer_windows.py): no group is damaged."""
    argv = [prog("hooks_churn", "O2-pie"), "20000", mode]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    for attempt in range(3):     # a storm lands in a group's writing in most runs
        meta, result, _ = record(tmp_path, argv, name=f"t{attempt}")
        assert result.stdout == native.stdout
        handler = int(result.stderr.decode().split("handler memcpy=")[1].split()[0])
        assert handler > 0
        assert events(meta, "Y") == counts(native.stdout)["memcpy"] + handler
        assert order_report(meta)["damaged_records"] == 0
        assert meta["data_tracing"]["freed_accesses"] == 0
        if mode == "signals" or meta["data_tracing"]["paths"]["hooks"]["signals_in_group_writes"]:
            return
    pytest.fail("in 3 storms no signal landed while a group was being written")


@pytest.mark.parametrize("mode", ["longjmp", "fork", "readonly"])
def test_modes_keep_the_program_and_its_events(tmp_path, mode):
    """longjmp: a memcpy from an unmapped address is left by siglongjmp (its stub's
    frame with it); fork: both processes churn, the child untraced, posix_spawn
    runs /bin/true (vfork windows); readonly: a copy from a page the program made
    read-only is not aliased and takes the breakpoint hooks (two stops)."""
    argv = [prog("hooks_churn", "O2-pie"), "1000", mode]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, result, _ = record(tmp_path, argv)
    assert result.stdout == native.stdout
    parent = counts(native.stdout.splitlines()[-1])
    data = meta["data_tracing"]
    assert events(meta, "Y") == parent["memcpy"]
    assert data["freed_accesses"] == 0
    if mode == "readonly":
        assert data["traps"] == 2 * 1000          # entry and return of each read-only copy
    else:
        assert data["traps"] == 0
    if mode == "fork":
        assert data["vfork_windows"] >= 4
    if mode == "longjmp":
        assert parent["escapes"] == 20


@pytest.mark.parametrize("variant", ["O0-pie", "O2-pie"])
def test_operator_new_throws_through_its_stub(tmp_path, variant):
    """operator new[] of an impossible size throws std::bad_alloc through the
    stubs of operator new[] and new: caught, as without madtrace (the stubs'
    return points are described to the C++ unwinder)."""
    argv = [prog("hooks_cxx", variant)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    assert native.stdout == b"caught=3\n"
    meta, result, _ = record(tmp_path, argv)
    assert result.stdout == native.stdout
    hooks = meta["data_tracing"]["paths"]["hooks"]
    assert hooks["unwind entries"] > 0 and "new" in hooks["hooked"]


def test_target_finishes_when_the_tracer_is_killed_in_hooked_calls(tmp_path):
    """madtrace is SIGKILLed while the program churns through its hook stubs: the
    guard gives every page back and turns the stubs' traps into nops, the rings
    fill up once, and the program finishes with its normal output."""
    argv = [prog("hooks_churn", "O2-pie"), "300000"]
    native = subprocess.run(argv, capture_output=True, timeout=120)
    tracer = start_data_tracing(["record", "--data", "--no-functions", *HYBRID, "-o",
                                 str(tmp_path / "t"), "--", *argv])
    try:
        time.sleep(1.0)
        os.kill(tracer.pid, signal.SIGKILL)
        tracer.wait(timeout=30)
        out = tracer.stdout.read()
    finally:
        if tracer.poll() is None:
            tracer.kill()
    assert out == native.stdout


def test_use_after_free_as_memcheck_sees_it(tmp_path, monkeypatch):
    """data_alloc makes one real use after free (memcheck: its instruction and
    offset): under the hybrid engine with the stubs, exactly that access is the
    alloc report's use after free, of the block memcheck names."""
    from .test_analyses import memcheck_invalid_read
    from .util import report_json
    path = prog("data_alloc", "O0-nopie")
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")
    result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "t"), "--", path, timeout=300)
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["data_tracing"]["paths"]["hooks"]["breakpoints"] == {}
    assert meta["data_tracing"]["traps"] == 0
    report = report_json(str(tmp_path / "t"), "--kind", "alloc")
    gone = [b for b in report["blocks"] if b["site"].startswith("main+")][2]
    function, offset, size = memcheck_invalid_read(path)
    assert report["use_after_free"] == [gone["id"]]
    assert gone["freed_accesses"] == 1 and gone["size"] == size
    first = gone["first_freed_access"]
    assert first["instruction"].startswith(function + "+") and first["offset"] == offset


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_walk_then_free_under_the_stubs(tmp_path, variant, monkeypatch):
    """tests/test_analyses.py's walk-then-free program (no use after free; the walk
    named <malloc...> in MadT text, SQL and Chrome), under the hybrid engine."""
    from .test_analyses import test_walk_then_free_names_live_blocks_and_no_false_use_after_free
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")
    test_walk_then_free_names_live_blocks_and_no_false_use_after_free(tmp_path, variant)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())["data_tracing"]
    assert meta["engine"] == "hybrid" and meta["paths"]["hooks"]["events"]["alloc returns"] > 0


def test_detach_while_a_memcpy_runs_through_the_alias(tmp_path):
    """Attached to a program that spends its time in memcpy of heap blocks (the
    calls reach them through the alias), then detached after 2 s: a thread inside
    such a memcpy runs until it returns before the alias goes, every madtrace
    mapping leaves the process, and the program's output equals a native run of
    as many rounds."""
    from .util import madtrace_maps, start_ready
    path = prog("hooks_churn", "O2-pie")
    program = start_ready([path, "0", "bulk"])
    try:
        out = tmp_path / "t"
        result = madtrace("attach", "--data", "--data-engine", "hybrid", "--no-functions", "-q",
                          "--duration", "2", "-o", str(out), str(program.pid), timeout=300)
        assert result.returncode == 0, result.stderr
        assert madtrace_maps(program.pid) == []
        program.send_signal(signal.SIGUSR1)
        stdout, _ = program.communicate(timeout=120)
    finally:
        if program.poll() is None:
            program.kill()
    rounds = counts(stdout)["rounds"]
    native = subprocess.run([path, str(rounds), "bulk"], capture_output=True, timeout=300)
    assert stdout == native.stdout
    meta = json.loads((out / "meta.json").read_text())
    assert events(meta, "Y") > 0 and meta["data_tracing"]["traps"] == 0


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_block_events_take_their_place_among_the_accesses(tmp_path, variant):
    """data_copies: each round stores ``before``, copies (or sets) a global
    buffer through libc, stores ``after``, and every 30th round sets a fresh
    malloc block.  The drain takes a batch's memcpy/memset events together,
    between its allocator events: in the trace, ordered by ``order``, every
    round still reads store before, its event, store after (then the heap
    block's memset, named by the block malloc had just returned), in the
    program's own order, for 20,000 rounds."""
    rounds = 20000
    argv = [prog("data_copies", variant), str(rounds)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, result, directory = record(tmp_path, argv)
    assert result.stdout == native.stdout
    query = ("SELECT \"order\", symbol FROM accesses WHERE symbol IN ('before', 'after') "
             "AND kind = 'S' UNION ALL SELECT \"order\", "
             "CASE WHEN data LIKE '<malloc%' THEN 'heap ' || what ELSE what END "
             "FROM block_events WHERE what IN ('memcpy', 'memmove', 'memset') ORDER BY 1")
    out = madtrace("query", directory, "--json", query)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    names = [row["symbol"] for row in rows]
    assert len({row["order"] for row in rows}) == len(rows)       # no order twice
    expected = []
    for i in range(rounds):
        expected += ["before", "memset" if i % 3 == 2 else "memcpy", "after"]
        if i % 30 == 2:
            expected.append("heap memset")
    # memmove and memcpy are one implementation in glibc: hooked as memcpy
    assert [n.replace("memmove", "memcpy") for n in names] == expected, \
        next((k, names[k:k + 6], expected[k:k + 6]) for k in range(len(expected))
             if k >= len(names) or names[k].replace("memmove", "memcpy") != expected[k])


def test_python3_events_and_sites_are_named_in_its_own_code(tmp_path):
    """python3 (the interpreter running these tests: libpython shared) making
    lists and dicts: every block event and every allocation site names an
    instruction of python3 or its libraries, never an address in madtrace's
    areas.  Its calloc tail-calls memset, and that memset returns into the stub
    that called calloc: such an event is the calloc's, from its call site
    (there were about 100 named by the stub's address)."""
    script = ("import json\nd = {'k%d' % i: [i, str(i)] for i in range(300)}\n"
              "print(len(json.dumps(d)))\n")
    argv = [sys.executable, "-S", "-c", script]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, result, directory = record(tmp_path, argv, timeout=600)
    assert result.stdout == native.stdout
    for sql in ("SELECT instruction, count(*) FROM block_events WHERE instruction IS NULL "
                "OR instruction LIKE '0x%' GROUP BY ALL",
                "SELECT site, count(*) FROM allocations WHERE site IS NULL OR site LIKE '0x%' "
                "OR site LIKE '%madtrace%' GROUP BY ALL"):
        out = madtrace("query", directory, "--json", sql)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [], sql
    assert meta["data_tracing"]["block_events"]["W"]["events"] > 100
