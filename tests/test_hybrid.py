"""The hybrid data engine: faults discover the instructions that
touch traced data, rewritten code records their accesses inside the target.

Oracles: valgrind lackey per instruction (the executable's own instructions),
the program's own output (native run), and, for a signal handler that lands
in the middle of a probed loop, the program's own arithmetic (the updates it
lost tell where the handler ran between the loop's load and store)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from madtrace.binary.elf import ElfImage
from madtrace.data.instruction_table import PROBE
from madtrace.data.hybrid.paths import MOVE_ASK
from madtrace.trace.compact import InstructionColumns
from madtrace.trace.reader import iter_access_chunks

from .test_data import _ranges_from_stderr, compare_with_lackey, sections
from .util import detach_after, madtrace, prog, start_data_tracing

HYBRID = ["--data-engine", "hybrid"]


@pytest.fixture(autouse=True)
def hybrid_engine(monkeypatch):
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")


def record(tmp_path, argv, *options, timeout=300) -> tuple[dict, bytes, str]:
    tmp_path.mkdir(parents=True, exist_ok=True)     # -o needs its parent to exist
    out = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), *HYBRID,
                      *options, "--", *argv, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "meta.json").read_text()), result.stdout, str(out)


def probe_share(meta: dict) -> float:
    paths = meta["data_tracing"]["paths"]["accesses_by_path"]
    return paths["probe"] / max(paths["probe"] + paths["fault"], 1)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
@pytest.mark.parametrize("kernel, size", [("list", "3000"), ("array", "8192"),
                                          ("matmul", "40"), ("strings", "30")])
def test_kernels_per_instruction_equal_lackey(tmp_path, kernel, size, variant):
    """Pointer chasing, array passes, a matrix multiply and string loops: every
    instruction of the executable makes the loads and stores lackey sees, and
    the probes carry most of them (the faults only find the instructions)."""
    def ranges(static, stderr):
        return _ranges_from_stderr(static, stderr)

    got = compare_with_lackey(tmp_path, "data_kernels", variant, ranges, args=(kernel, size),
                              options=HYBRID)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["data_tracing"]["engine"] == "hybrid"
    assert probe_share(meta) > 0.95, meta["data_tracing"]["paths"]
    assert sum(c["L"] + c["S"] for c in got.values()) > 20000


@pytest.mark.parametrize("mode", ["fork", "brk", "madvise", "realloc", "threads", "segv"])
def test_memory_semantics_kept(tmp_path, mode):
    """fork (parent and child write the same global and heap block: neither sees
    the other's writes), brk growth and shrink (regrown memory reads zeros),
    MADV_DONTNEED/MADV_FREE (zeros), realloc that moves (mremap), several
    threads writing, the program's own SIGSEGV handler: the output equals the
    native one, and the probes carry most of the accesses."""
    argv = [prog("data_semantics", "O2-pie"), mode, "300"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, out, _ = record(tmp_path, argv)
    assert out == native.stdout
    assert probe_share(meta) > 0.5, meta["data_tracing"]["paths"]
    assert meta["dropped_events"] == 0 and meta["data_tracing"]["paths"]["dropped"] == 0


@pytest.mark.parametrize("mode", ["realloc", "threads"])
def test_semantics_per_instruction_equal_lackey(tmp_path, mode):
    """A realloc that moves (its mappings follow the program's mremap) and
    several threads writing: per instruction equal to lackey."""
    def ranges(static, stderr):
        if mode != "realloc":
            return static
        # realloc's blocks are mappings of their own: everything but the stack
        stack = int(stderr.split("stack ")[1].split()[0], 16)
        return static + [(0x10000, stack - (64 << 20)), (stack + (1 << 20), 0x7FF000000000)]

    compare_with_lackey(tmp_path, "data_semantics", "O2-nopie", ranges, args=(mode, "40"),
                        options=HYBRID, own=("touch_pages", "sum_pages", "worker"))


def test_signal_handler_in_a_probed_loop_is_recorded_in_order(tmp_path):
    """A SIGALRM handler adds to the global the hot loop increments (a load,
    then a store).  When the handler runs between the loop's load and store, its
    update is lost.  From the trace alone (the handler's accesses placed among
    the loop's), the lost updates and so the program's final value follow: an
    access recorded out of order would tell another value."""
    argv = [prog("data_semantics", "O2-nopie"), "sigloop", "3000000"]
    meta, out, directory = record(tmp_path, argv, timeout=600)
    words = out.decode().split()
    x, ticks, iterations = int(words[2]), int(words[4]), int(words[6])
    image = ElfImage.load(argv[0])
    hot = next(s for s in image.functions() if s.name.startswith("hot"))
    handler = next(s for s in image.functions() if s.name == "on_alarm")
    x_addr = next(s for s in image.symbols if s.name == "x").address
    rows = np.concatenate([c for _, c in iter_access_chunks(directory)])
    mine = rows[rows["addr"] == x_addr]
    in_hot = (mine["rip"] >= hot.address) & (mine["rip"] < hot.address + hot.size)
    in_handler = (mine["rip"] >= handler.address) & (mine["rip"] < handler.address + handler.size)
    assert int(np.count_nonzero(in_handler & (mine["kind"] == 2))) == ticks
    # the loop: load, store, load, store...; a handler store between a loop load
    # and the loop store after it is overwritten
    state, lost = None, 0
    for is_hot, kind in zip(in_hot.tolist(), mine["kind"].tolist()):
        if is_hot:
            state = "loaded" if kind == 1 else None
        elif kind == 2 and state == "loaded":
            lost += 1
    assert int(np.count_nonzero(in_hot & (mine["kind"] == 1))) == iterations
    assert x == iterations + 1000000 * (ticks - lost)
    assert probe_share(meta) > 0.9


def test_target_finishes_when_the_tracer_is_killed_in_a_probed_loop(tmp_path):
    """madtrace is SIGKILLed while the probes carry the accesses (nothing faults
    any more): the kernel sends the guard SIGSEGV (PR_SET_PDEATHSIG), which turns
    every probe back into the plain instruction and gives the pages back; the
    program finishes with its normal output."""
    argv = [prog("bench_data_memory", "O2-nopie"), "40000", "4096"]
    native = subprocess.run(argv, capture_output=True, timeout=120)
    assert output_when_killed(tmp_path, argv, after=1.0) == native.stdout


def test_target_with_an_alternate_stack_in_the_heap_finishes_when_the_tracer_is_killed(tmp_path):
    """The program keeps an alternate signal stack in the heap and a SIGSEGV
    handler that runs on it (as python3 -X faulthandler does).  The heap's pages
    are protected while data tracing: a guard run on that stack made the kernel
    fail to write the signal frame and kill the program with SIGSEGV (an
    http.server under faulthandler died at 6 of 10 SIGKILLs of the tracer).  The
    guard runs on the thread's own stack; the program finishes with its output."""
    argv = [prog("data_semantics", "O2-nopie"), "altstack", "4000"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    assert output_when_killed(tmp_path, argv, after=1.0) == native.stdout


def output_when_killed(tmp_path, argv: list[str], after: float) -> bytes:
    """The program's output when madtrace recording it is SIGKILLed ``after``
    seconds into data tracing."""
    tracer = start_data_tracing(["record", "--data", "--no-functions", *HYBRID, "-o",
                                 str(tmp_path / "t"), "--", *argv])
    try:
        import time
        time.sleep(after)
        os.kill(tracer.pid, signal.SIGKILL)
        tracer.wait(timeout=30)
        return tracer.stdout.read()
    finally:
        if tracer.poll() is None:
            tracer.kill()


def test_compact_records_are_small_and_read_back(tmp_path):
    """The list walk's accesses on disk: compressed compact records, at most 16
    bytes per access, read back in order with their heap blocks."""
    argv = [prog("bench_data_list", "O2-nopie"), "30", "4096"]
    meta, out, directory = record(tmp_path, argv)
    assert out == subprocess.run(argv, capture_output=True, timeout=60).stdout
    accesses = sum(c["L"] + c["S"] for c in meta["accesses"].values())
    size = sum(os.path.getsize(os.path.join(directory, "data", f))
               for f in os.listdir(os.path.join(directory, "data")) if f.endswith(".dat"))
    assert accesses > 200000 and size / accesses <= 16
    rows = np.concatenate([c for _, c in iter_access_chunks(directory)])
    assert len(rows) == accesses
    assert np.all(np.diff(rows["order"].astype(np.int64)) > 0)
    walk = rows[rows["block"] > 0]
    assert len(walk) > 2 * 4096 * 29            # every node's value and next, in blocks


def test_fault_engine_is_still_there(tmp_path):
    """--data-engine fault keeps the fault engine: no alias, no probe."""
    argv = [prog("data_globals", "O2-nopie")]
    out = tmp_path / "f"
    result = madtrace("record", "-q", "--data", "--no-functions", "--data-engine", "fault", "-o",
                      str(out), "--", *argv)
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())["data_tracing"]
    assert meta["engine"] == "fault" and meta["paths"] is None and meta["alias"] is None
    assert sections(argv[0], ".data")


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_calls_through_memory_take_probes(tmp_path, variant):
    """Calls through a table of pointers in .data and through a struct on the
    heap, in a hot loop: per instruction equal to lackey, every call's load on
    the probe path, and the faults do not grow with the calls (two run lengths)."""
    def ranges(static, stderr):
        return _ranges_from_stderr(static, stderr)

    compare_with_lackey(tmp_path, "data_calls_mem", variant, ranges, args=("3000",),
                        options=HYBRID)
    path = prog("data_calls_mem", variant)
    image = ElfImage.load(path)
    run = next(s for s in image.functions() if s.name == "run")
    table = InstructionColumns.load(str(tmp_path / "t"))
    ids = (table.rip >= run.address) & (table.rip < run.address + run.size)
    assert ids.any() and (table.path[ids] == PROBE).all(), table.path[ids]
    faults = []
    for n in ("2000", "20000"):
        meta, _, _ = record(tmp_path / n, [path, n])
        faults.append(meta["data_tracing"]["faults"])
    assert faults[1] <= faults[0] + 8, faults


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_code_never_copied_jumping_back_is_moved_by_the_fault_loop(tmp_path, variant):
    """data_cold_split: for each odd value step() takes a detour outside any
    function (no data access: never copied) that jumps back into step's
    original code, whose store then faults (GCC's hot/cold splitting does this:
    python3's insertdict re-entered its original code ~5000 times in a short
    script).  The fault loop moves the thread into step's copy by itself: the
    tracer's Python sees one move in MOVE_ASK + 1 only.  Per instruction equal to lackey."""
    n = 4000
    got = compare_with_lackey(tmp_path, "data_cold_split", variant,
                              lambda static, stderr: static, args=(str(n),), options=HYBRID)
    rewriter = json.loads((tmp_path / "t" / "meta.json").read_text())["data_tracing"]["paths"][
        "rewriter"]
    moves = n // 2               # one per odd value
    assert rewriter["moved_by_fault_loop"] + rewriter["moved"] >= moves, rewriter
    # the loop gives one move in MOVE_ASK + 1 to the rewriter (which may have more to do)
    assert rewriter["moved"] <= moves // (MOVE_ASK + 1) + 50, rewriter
    assert got["step+0x16"] == {"L": n, "S": n}      # the store to total (an add)


def test_detach_while_the_fault_loop_moves_threads(tmp_path):
    """madtrace is sent SIGTERM while data_cold_split re-enters step's original
    code at every odd value and the fault loop moves the thread into the copy
    (thousands of moves a second): the detach finds the thread at a move, in
    the copy or in the detour; the program then finishes untraced with the
    native output, and nothing of madtrace's is left in it."""
    argv = [prog("data_cold_split", "O2-pie"), "5000000"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    for run, pause in enumerate((0.3, 0.8)):
        tracer = start_data_tracing(["record", "--data", "--no-functions", *HYBRID,
                                     "-o", str(tmp_path / f"t{run}"), "--", *argv])
        out, err = detach_after(tracer, pause)
        assert tracer.returncode == 0, (run, err)
        assert out == native.stdout, (run, out)
        meta = json.loads((tmp_path / f"t{run}" / "meta.json").read_text())
        assert meta["outcome"] == "detached" and meta["released"]["kept"] == [], meta["released"]
        rewriter = meta["data_tracing"]["paths"]["rewriter"]
        assert rewriter["moved_by_fault_loop"] > 100, rewriter     # the detach came mid-run


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_indirect_jumps_through_a_traced_table(tmp_path, variant):
    """data_dispatch: dispatch() jumps through a writable table in .data (at
    -O2 a tail call, jmp [table + i*8]: in the copy, a stub whose load of the
    target reads the traced page); every op stores into a global.  Per
    instruction equal to lackey (the table's loads counted once each, the
    jump translated); then a detach mid-run leaves the native output."""
    n = 3000
    got = compare_with_lackey(tmp_path, "data_dispatch", variant,
                              lambda static, stderr: static, args=(str(n),), options=HYBRID)
    assert sum(c["L"] for name, c in got.items() if name.startswith("dispatch+")) == n, got
    # long enough that the detach comes mid-run (at -O0 the table's loads are probed:
    # ~20 M accesses a second; at -O2 the stub's loads fault)
    argv = [prog("data_dispatch", variant), "200000000" if variant.startswith("O0") else "3000000"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    tracer = start_data_tracing(["record", "--data", "--no-functions", *HYBRID,
                                 "-o", str(tmp_path / "d"), "--", *argv])
    out, err = detach_after(tracer, 0.5)
    assert tracer.returncode == 0, err
    assert out == native.stdout
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["outcome"] == "detached" and meta["released"]["kept"] == [], meta["released"]


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_tail_calls_through_traced_pointers_take_probes(tmp_path, variant):
    """data_tail_jumps: at -O2 via_hook() is ``jmp [rip + hook]`` and via_ops()
    ``jmp [rax + 8]``, both pointers in traced .data (CPython's PyObject_Malloc
    and type slots tail-call so: half a million faults of a short json script).
    Per instruction equal to lackey; at -O2 their loads are on the probe path
    and the faults do not grow with the calls, but with_r11()'s, whose function
    keeps a value in r11, which stays a stub (its loads fault)."""
    n = 3000
    got = compare_with_lackey(tmp_path, "data_tail_jumps", variant,
                              lambda static, stderr: static, args=(str(n),), options=HYBRID)
    for name in ("via_hook", "via_ops", "with_r11"):
        assert sum(c["L"] for at, c in got.items() if at.startswith(name + "+")) >= n, got
    if variant.startswith("O0"):
        return
    path = prog("data_tail_jumps", variant)
    image = ElfImage.load(path)
    table = InstructionColumns.load(str(tmp_path / "t"))
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    for name, path_of_jump in (("via_hook", PROBE), ("via_ops", PROBE), ("with_r11", 1)):
        function = next(s for s in image.functions() if s.name == name)
        jump = _last_instruction(path, function)
        ids = table.rip == jump
        assert ids.any() and (table.path[ids] == path_of_jump).all(), (name, table.path[ids], meta)
    faults = []
    for runs in ("2000", "20000"):
        meta, _, _ = record(tmp_path / runs, [path, runs])
        faults.append(meta["data_tracing"]["faults"])
    # with_r11's jump faults once a call (18000 more calls); the others not at all
    assert 18000 - 100 <= faults[1] - faults[0] <= 18000 + 100, faults


def _last_instruction(path: str, function) -> int:
    """The address of the last instruction of ``function`` (a symbol of ``path``)."""
    from madtrace.arch.x86_64.decode import decode_one
    with open(path, "rb") as f:
        data = f.read()
    image = ElfImage.load(path)
    text = image.section(".text")
    start = function.address - text.address + text.offset
    at, last = 0, 0
    while at < function.size:
        insn = decode_one(data[start + at:start + function.size], function.address + at,
                          detail=False)
        if insn is None or insn.mnemonic.startswith("nop") or insn.mnemonic == "int3":
            break
        last, at = function.address + at, at + insn.size
    return last


@pytest.mark.parametrize("library", ["libmtfill.so", "libmtfill-stripped.so"])
def test_code_of_a_library_loaded_after_the_start_is_relocated(tmp_path, library):
    """data_dlopen: a library dlopen'ed once tracing runs works on the heap.
    Its functions are relocated like any other (the module is learnt from the
    maps read again at its first fault), also in its stripped copy, where the
    internal fill_odd() has no symbol, only its .eh_frame entry: their accesses
    on the probe path, the program's output unchanged, and each instruction
    recorded as often as it ran (fill_add's load and store of every buf[i],
    fill_odd's of every odd one, each round)."""
    n, rounds = 1000, 20
    folder = os.path.dirname(prog("churn"))
    argv = [prog("data_dlopen", "O2-nopie"), os.path.join(folder, library), str(n), str(rounds)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, stdout, out = record(tmp_path, argv)
    assert stdout == native.stdout
    paths = meta["data_tracing"]["paths"]
    assert paths["rewriter"].get("modules learnt at a fault") == 1, paths["rewriter"]
    assert not any("libmtfill" in at for at in paths["on_faults"]), paths["on_faults"]
    table = InstructionColumns.load(out)
    image = ElfImage.load(os.path.join(folder, "libmtfill.so"))     # the symbols, unstripped
    maps = (tmp_path / "t" / "maps.end.txt").read_text().splitlines()
    base = min(int(line.split("-")[0], 16) for line in maps if line.endswith(library))
    for name, accesses in (("fill_add", 2 * n * rounds), ("fill_odd", n * rounds)):
        function = next(s for s in image.symbols if s.name == name)
        lo, hi = base + function.address, base + function.address + function.size
        ids = (table.rip >= lo) & (table.rip < hi)
        assert ids.any() and (table.path[ids] == PROBE).all(), (name, table.path[ids])
        recorded = sum(int(((chunk["rip"] >= lo) & (chunk["rip"] < hi)).sum())
                       for _tid, chunk in iter_access_chunks(out))
        assert recorded == accesses, (name, recorded)


def test_short_functions_take_the_jump_into_their_padding(tmp_path):
    """data_short_functions at -O2: get_y() is 4 bytes (``mov eax, [rdi + 4];
    ret``) and the compiler's padding follows it: its entry's jump to the copy
    takes the padding, and its calls run the copy (the moves do not grow with
    the calls).  tight_a() is 3 bytes with tight_b() right after it: no room,
    each of its calls enters the original code and is moved (a fault a call).
    Per instruction equal to lackey."""
    n = 3000
    got = compare_with_lackey(tmp_path, "data_short_functions", "O2-nopie",
                              lambda static, stderr: static, args=(str(n),), options=HYBRID)
    assert got["get_y+0x0"]["L"] == n and got["tight_a+0x0"]["L"] == n, got
    moves = []
    for runs in ("2000", "20000"):
        meta, _, _ = record(tmp_path / runs, [prog("data_short_functions", "O2-nopie"), runs])
        rewriter = meta["data_tracing"]["paths"]["rewriter"]
        moves.append(rewriter.get("moved", 0) + rewriter.get("moved_by_fault_loop", 0))
    # tight_a: one move a call, 18000 more; get_y: none
    assert 18000 - 100 <= moves[1] - moves[0] <= 18000 + 100, moves


@pytest.mark.parametrize("copy_after", ["1", "32"])
def test_functions_are_copied_once_hot(tmp_path, copy_after):
    """--copy-after N: a function is copied once N of its accesses faulted
    (cold code stays on the fault path and costs no copy); 1: at the first
    fault.  data_kernels' hot loop is copied either way; per instruction equal
    to lackey, and most accesses take the probes."""
    got = compare_with_lackey(tmp_path, "data_kernels", "O2-nopie",
                              lambda static, stderr: _ranges_from_stderr(static, stderr),
                              args=("array", "2048"), options=(*HYBRID, "--copy-after", copy_after))
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    rewriter = meta["data_tracing"]["paths"]["rewriter"]
    assert probe_share(meta) > 0.95, meta["data_tracing"]["paths"]
    assert sum(c["L"] + c["S"] for c in got.values()) > 10000
    if copy_after == "1":
        assert rewriter["functions_cold"] == 0 and "cold faults" not in rewriter
    else:
        assert rewriter["functions_cold"] >= 1 and rewriter["functions_relocated"] >= 1, rewriter


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
@pytest.mark.parametrize("mode", ["store", "add", "xchg"])
def test_fault_path_store_is_seen_by_relocated_code(tmp_path, mode, variant):
    """A store the fault path carries out (code outside any known function: the
    rewriter leaves it there) is read back at once by a relocated function,
    through the alias, without a trap in between: it must read the new value
    (the program counts stale reads; before the fault path wrote through the
    alias itself, 999 of 1000 reads were stale).  Per instruction equal to
    lackey, and the stores did take the fault path."""
    got = compare_with_lackey(tmp_path, "data_fault_store", variant,
                              lambda static, stderr: static, args=(mode, "1000"), options=HYBRID)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())["data_tracing"]
    assert meta["paths"]["on_faults_why"].get("outside any known function", 0) >= 1
    assert meta["paths"]["accesses_by_path"]["fault"] >= 1000
    assert sum(c["S"] for name, c in got.items() if name.startswith("main")) == 0
    assert sum(c["L"] for name, c in got.items() if name.startswith("get_value")) == 1001


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_locked_instruction_on_the_fault_path_stays_atomic(tmp_path, variant):
    """Four threads add to one counter with a locked add left on the fault path
    while the main thread reads it through relocated code: carried out on the
    alias (no copy in a slot), the adds stay atomic for each other (the counter
    ends at 4 N and never goes back), without the slow path's single steps.
    Per instruction equal to lackey."""
    got = compare_with_lackey(tmp_path, "data_fault_store", variant,
                              lambda static, stderr: static, args=("threads", "3000"),
                              options=HYBRID, own=("add_locked", "get_value", "adder", "main"))
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())["data_tracing"]
    assert meta["slow_path"] == 0, meta["slow_reasons"]
    assert got["add_locked+0x0"] == {"L": 12000, "S": 12000}


@pytest.mark.parametrize("engine", ["hybrid", "fault"])
def test_detach_in_a_fault_path_loop_keeps_every_store(tmp_path, engine):
    """madtrace is sent SIGTERM (a detach: the target goes on untraced) while
    the program stores on the fault path and reads back at once, one stop per
    round: the detach finds its thread at a fault, in a stub (before or after
    its instruction) or in relocated code, and moves it out; no store may be
    lost or repeated and no register changed (the program checks every
    read-back and the final value: output equal to the native one)."""
    argv = [prog("data_fault_store", "O2-nopie"), "store", "20000000"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    for run, pause in enumerate((0.2, 0.5, 0.9, 1.4)):
        tracer = start_data_tracing(["record", "--data", "--no-functions", "--data-engine",
                                     engine, "-o", str(tmp_path / f"t{run}"), "--", *argv])
        out, err = detach_after(tracer, pause)
        assert tracer.returncode == 0, (run, err)
        assert out == native.stdout, (run, out)
        meta = json.loads((tmp_path / f"t{run}" / "meta.json").read_text())
        assert meta["outcome"] == "detached" and meta["released"]["kept"] == [], meta["released"]
        # the detach came while the program ran (20 M rounds: 40 M accesses to the end);
        # before, the C fault loop kept Python's SIGTERM handler waiting to the end
        paths = meta["data_tracing"]["paths"]
        accesses = sum(paths["accesses_by_path"].values()) if paths else meta["data_tracing"]["faults"]
        assert accesses < 20_000_000, accesses


def test_a_number_on_the_stack_keeps_no_code_area(tmp_path):
    """A number on main's stack that lies inside the copies area, past the code
    written there (the program takes the middle of the area from its own maps).
    The detach takes every area out (before: "the stack holds 0x44000000,
    inside madtrace-copies-...", all kept, as churn's i * i did now and then in
    test_live_load)."""
    argv = [prog("stack_number", "O2-nopie"), "3", "copies"]
    out = tmp_path / "t"
    tracer = start_data_tracing(["record", "--data", "--no-functions", *HYBRID, "-o", str(out),
                                 "--", *argv])
    copies = []
    try:
        pid = None
        for _ in range(100):       # the copy of step() made, its area mapped
            children = open(f"/proc/{tracer.pid}/task/{tracer.pid}/children").read().split()
            pid = int(children[0]) if children else None
            maps = open(f"/proc/{pid}/maps").read() if pid else ""
            if "madtrace-copies-stack_number" in maps:
                break
            time.sleep(0.05)
        copies = [line.split()[0].split("-") for line in maps.splitlines()
                  if "madtrace-copies-stack_number" in line]
        assert copies, maps
    finally:
        stdout, stderr = detach_after(tracer, 1.5)
    assert tracer.returncode == 0, stderr
    number = int(stdout.split()[1], 16)
    assert any(int(lo, 16) <= number < int(hi, 16) for lo, hi in copies), (hex(number), copies)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["outcome"] == "detached" and meta["released"]["kept"] == [], meta["released"]
