"""Data access tracing (MadT page faults) against valgrind lackey, per
instruction, and the target's output unchanged."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from madtrace.binary.elf import ElfImage
from madtrace.trace.events import load_allocations

from .oracles import lackey_accesses
from .util import MADTRACE, ROOT, madtrace, prog


def sections(path: str, *names: str) -> list[tuple[int, int]]:
    image = ElfImage.load(path)
    return [(s.address, s.address + s.size) for s in image.sections if s.name in names and s.size]


def _locked_rmw(image, text, addresses) -> set[int]:
    """The instructions among ``addresses`` that are locked read-modify-writes
    other than cmpxchg (lock add/xadd/inc..., xchg with memory)."""
    from madtrace.arch.x86_64.memops import memory_accesses
    out = set()
    for address in addresses:
        code = image.read(text.offset + address - text.address, 16)
        insn = memory_accesses(code, address)
        if insn is not None and insn.atomic and "cmpxchg" not in insn.mnemonic:
            out.add(address)
    return out


def madtrace_accesses(tmp_path, argv, options=()) -> tuple[dict, dict, bytes]:
    tmp_path.mkdir(parents=True, exist_ok=True)     # -o needs its parent to exist
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(tmp_path / "t"),
                      *options, "--", *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    with open(tmp_path / "t" / "meta.json") as f:
        meta = json.load(f)
    return meta["accesses"], meta, result.stdout


def compare_with_lackey(tmp_path, program: str, variant: str, data_ranges, args=(), options=(),
                        own=None) -> dict:
    """Trace ``program`` (with ``args``; madtrace ``options``) with madtrace and
    with lackey; the executable's own instructions (those of the functions
    ``own`` names, if given) must make the same loads and stores, per
    instruction, to the ranges ``data_ranges(static_ranges, stderr)`` names.
    Returns madtrace's."""
    path = prog(program, variant)
    argv = [path, *args]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    accesses, meta, stdout = madtrace_accesses(tmp_path, argv, options)
    assert stdout == native.stdout
    image = ElfImage.load(path)
    text = image.section(".text")
    static = sections(path, ".data", ".bss")
    oracle = lackey_accesses(argv, (text.address, text.address + text.size),
                             lambda stderr: data_ranges(static, stderr))
    got, expected = named_like_madtrace(path, oracle, accesses, own)
    assert got == expected
    return got


def named_like_madtrace(path: str, oracle: dict, accesses: dict, own=None) -> tuple[dict, dict]:
    """(madtrace's accesses by the executable's own instructions (of the functions
    ``own`` names, if given), lackey's ``oracle`` {(address, kind): n} named the
    same way: func+0xoff)."""
    image = ElfImage.load(path)
    text = image.section(".text")
    expected: dict[str, dict[str, int]] = {}
    locked = _locked_rmw(image, text, {address for address, _ in oracle})
    for (address, kind), n in oracle.items():
        if kind == "L" and address in locked:
            # valgrind turns a locked read-modify-write into a load plus a
            # compare-and-swap, which lackey reports as a second load
            n -= oracle.get((address, "S"), 0)
        symbol = image.symbol_at(address)
        name = f"{symbol.name}+{address - symbol.address:#x}" if symbol \
            else f"{os.path.basename(path)}+{address:#x}"
        expected.setdefault(name, {"L": 0, "S": 0})[kind] += n
    # madtrace also records libc's instructions (printf...); the oracle covers the
    # executable's own instructions
    if own is not None:
        expected = {k: v for k, v in expected.items() if k.split("+")[0].split(".")[0] in own}
    own = {s.name for s in image.functions()} | {os.path.basename(path)} if own is None else \
        {s.name for s in image.functions() if s.name.split(".")[0] in own}
    got = {name: c for name, c in accesses.items() if name.split("+")[0] in own}
    return got, expected


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
@pytest.mark.parametrize("program", ["data_globals", "data_threads"])
def test_globals_per_instruction_equal_lackey(tmp_path, variant, program):
    """Globals of a single-threaded and of a multi-threaded program (while one
    thread has a page open, the others are held, so nothing is missed)."""
    got = compare_with_lackey(tmp_path, program, variant, lambda static, stderr: static)
    assert sum(c["S"] for c in got.values()) > 50 and sum(c["L"] for c in got.values()) > 50


def test_data_tracing_keeps_output_of_syscalls_on_traced_memory(tmp_path):
    """printf's buffer and the FILE structures live in traced .data/.bss/heap:
    the write() of that memory must not fail with EFAULT."""
    argv = [prog("calls_plt", "O0-pie"), "50"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    accesses, meta, stdout = madtrace_accesses(tmp_path, argv)
    assert stdout == native.stdout
    # their pages open for the call (fault engine), or reached through the alias (hybrid)
    dt = meta["data_tracing"]
    assert dt["syscalls_opened"] + dt["syscalls_redirected"] > 0
    assert meta["data_tracing"]["faults"] > 0


def test_genuine_crash_is_delivered(tmp_path):
    argv = [prog("signals", "O0-nopie"), "segv"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == 128 + 11
    assert result.stdout == native.stdout


def test_handler_program_with_data_tracing(tmp_path):
    argv = [prog("signals", "O0-nopie"), "handler"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "t"), "--", *argv)
    assert result.returncode == 0 and result.stdout == native.stdout


def test_function_segmented_listing(tmp_path):
    """Each call's accesses appear inside it, named from DWARF, with exact totals."""
    argv = [prog("data_globals", "O0-nopie")]
    madtrace_accesses_dir = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "-f", "fill", "-f", "sum", "-f", "move_points",
                      "-o", str(madtrace_accesses_dir), "--", *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    report = madtrace("report", str(madtrace_accesses_dir), "--kind", "segments", "--top", "2")
    assert report.returncode == 0, report.stderr
    text = report.stdout.decode()
    assert "> fill" in text and "< fill [200 accesses]" in text       # values[i] = ...
    assert "< sum [202 accesses]" in text                              # 200 loads, total L+S
    assert "S$ values[0],[.bss of data_globals-O0-nopie],fill+" in text
    assert "points[0].x" in text


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_heap_per_instruction_equal_lackey(tmp_path, variant):
    """Pointer chasing over malloc'd nodes, matrix multiply on heap arrays,
    realloc growth: the executable's own loads and stores to its data and to
    the brk heap, per instruction, equal lackey's."""
    def ranges(static, stderr: str):
        heap = [line.split() for line in stderr.splitlines() if line.startswith("heap ")][-1]
        return static + [(int(heap[1], 16), int(heap[2], 16))]

    got = compare_with_lackey(tmp_path, "data_heap", variant, ranges)
    chase = {k: v for k, v in got.items() if k.startswith("chase+")}
    assert sum(c["L"] for c in chase.values()) >= 100     # 50 nodes: next and value


def test_allocations_tracked_and_blocks_named_as_madt(tmp_path):
    argv = [prog("data_heap", "O2-nopie")]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--data", "-f", "chase", "-f", "grow", "-o",
                      str(tmp_path / "t"), "--", *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    blocks = load_allocations(tmp_path / "t")
    by_site = {}
    for b in blocks:
        by_site.setdefault(b["site"].split("+")[0], []).append(b)
    assert len(by_site["build_list"]) == 50 and all(b["size"] == 16 for b in by_site["build_list"])
    reallocs = [b for b in blocks if b["kind"] == "realloc"]
    assert len(reallocs) == 10
    # each realloc but the last released the previous block
    assert sum(1 for b in reallocs if b["freed_seq"] is not None) == 9
    ids = [b["id"] for b in blocks]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    report = madtrace("report", str(tmp_path / "t"), "--kind", "segments", "--top", "2")
    text = report.stdout.decode()
    assert re.search(r"L\$ <malloc\d{4}@build_list\+\d+>\+8,\[\[heap\]\],chase\+0x", text), text


def _ranges_from_stderr(static, stderr: str):
    """The static ranges, the brk heap and every anonymous region the program reports."""
    out = list(static)
    for line in stderr.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] in ("heap", "mmap"):
            out.append((int(words[1], 16), int(words[2], 16)))
    return out


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_special_instructions_and_mappings_equal_lackey(tmp_path, variant):
    """String instructions (rep movsb/stosq, movsq backwards, an overlapping copy),
    calls and jumps through pointers in .data, push of a global, locked and
    exchanging instructions, SSE moves, a malloc block in its own mapping, a
    realloc that moves it (mremap), an mmap'd region the program mprotects and
    partly unmaps: per instruction, the same loads and stores as lackey."""
    got = compare_with_lackey(tmp_path, "data_special", variant, _ranges_from_stderr)
    strings = {k: v for k, v in got.items() if k.startswith("strings+")}
    # rep movsb 300 + rep stosq 32 + movsq 2 + overlapping rep movsb 32, one per iteration
    assert sum(c["S"] for c in strings.values()) == 300 + 32 + 2 + 32
    assert any(k.startswith("big_block+") for k in got)          # the mmap'd block is traced
    assert any(k.startswith("protected_region+") for k in got)   # and the program's own region
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())["data_tracing"]
    assert meta["slow_path"] == 0 and meta["mapped_regions"] == 2


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_own_sigsegv_handler_recovers_and_reads_its_action(tmp_path, variant):
    """The target installs its own SIGSEGV handler while data tracing is on (madtrace
    answers its rt_sigaction), reads it back, recovers three times from NULL
    dereferences with siglongjmp, and its handler touches traced globals (a fault of
    madtrace's inside a SIGSEGV handler must not reset the action to SIG_DFL)."""
    argv = [prog("signals", variant), "segvhandler"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "t"), "--", *argv, timeout=120)
    assert result.returncode == native.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    assert b"own action: yes" in result.stdout


def test_data_in_a_function_whose_first_instruction_reads_a_global(tmp_path):
    """--data-in pass: pass's first instruction loads ``checksum`` (.data), a page
    the gate has just protected when madtrace steps that instruction over its
    breakpoint.  The step faults; the data engine records the access and carries
    the instruction out (before, the step was tried again forever: madtrace hung,
    with empty caches, where the entry is not patched by function tracing)."""
    argv = [prog("bench_data_memory", "O2-nopie"), "3", "4096"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    env = dict(os.environ, PYTHONPATH=ROOT, MADTRACE_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([*MADTRACE, "record", "-q", "--data", "--data-in", "pass", "-o",
                             str(tmp_path / "t"), "--", *argv], capture_output=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == native.stdout
    counts = madtrace("query", str(tmp_path / "t"), "SELECT kind, count(*) FROM accesses "
                      "GROUP BY ALL ORDER BY 1", "--json")
    assert counts.returncode == 0, counts.stderr.decode()
    rows = {row["kind"]: row["count_star()"] for row in json.loads(counts.stdout)}
    assert rows == {"L": 3 * 4097, "S": 3 * 4097}     # values[] and checksum, each round


@pytest.mark.parametrize("options", [["--no-functions"], [], ["--data-in", "pass"]],
                         ids=["data", "data+functions", "data-in"])
def test_target_finishes_when_the_tracer_is_killed_mid_trace(tmp_path, options):
    """madtrace is SIGKILLed while pages are protected and breakpoints are in
    (malloc/free, --data-in): the guard left in the target restores every
    protection and original byte at the next fault or trap, and the program
    finishes with its normal output."""
    argv = [prog("bench_data_memory", "O2-nopie"), "400", "4096"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    env = dict(os.environ, PYTHONPATH=ROOT)
    tracer = subprocess.Popen([*MADTRACE, "record", "--data", *options, "-o",
                               str(tmp_path / "t"), "--", *argv],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        for line in tracer.stderr:                 # tracing is on once this is logged
            if b"tracing data accesses" in line:
                break
        else:
            pytest.fail("madtrace never started data tracing")
        os.kill(tracer.pid, signal.SIGKILL)        # 400 rounds take minutes when traced
        tracer.wait(timeout=30)
        # the target inherited madtrace's stdout: end of file once it exits
        out = tracer.stdout.read()
    finally:
        if tracer.poll() is None:
            tracer.kill()
    assert out == native.stdout


def _record_data(tmp_path, argv, *options):
    tmp_path.mkdir(parents=True, exist_ok=True)     # -o needs its parent to exist
    out = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), *options, "--",
                      *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "meta.json").read_text()), result.stdout


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-pie"])
def test_selecting_what_is_traced(tmp_path, variant):
    """--data-in, --only VAR, --regions, --loads-only / --stores-only select
    exactly the accesses an unselected trace holds for that selection."""
    argv = [prog("data_globals", variant)]
    native = subprocess.run(argv, capture_output=True, timeout=60).stdout
    full, out = _record_data(tmp_path / "all", argv)
    assert out == native
    own = {k: v for k, v in full["accesses"].items()
           if k.split("+")[0] in ("fill", "sum", "count_vowels", "move_points")}

    def part(prefixes):
        return {k: v for k, v in own.items() if k.split("+")[0] in prefixes}

    inside, out = _record_data(tmp_path / "in", argv, "--data-in", "sum", "--data-in", "move_*")
    assert out == native
    assert inside["accesses"] == part(("sum", "move_points"))
    assert inside["data_tracing"]["gate"]["entries"] == 2

    values, out = _record_data(tmp_path / "only", argv, "--only", "values")
    assert out == native
    # fill() stores values[0..199], sum() loads them (sum's `total += s` is not values)
    assert all(own[k] == v for k, v in values["accesses"].items())
    assert {k.split("+")[0] for k in values["accesses"]} == {"fill", "sum"}
    assert {k: v for k, v in values["accesses"].items() if k.startswith("fill+")} == part(("fill",))
    # every element is stored once and loaded once (200 ints, or 50 vectors at -O2)
    stored = sum(c["S"] for c in values["accesses"].values())
    assert stored in (200, 50) and sum(c["L"] for c in values["accesses"].values()) == stored

    data_only, _ = _record_data(tmp_path / "regions", argv, "--regions", ".data of *")
    labels = {r[2] for r in data_only["data_tracing"]["regions"]}
    assert labels and all(label.startswith(".data of ") for label in labels)
    assert {k: v for k, v in data_only["accesses"].items() if k in own} == part(("count_vowels",))

    loads, _ = _record_data(tmp_path / "loads", argv, "--loads-only")
    stores, _ = _record_data(tmp_path / "stores", argv, "--stores-only")
    for name, counts in own.items():
        assert loads["accesses"].get(name, {"L": 0})["L"] == counts["L"]
        assert stores["accesses"].get(name, {"S": 0})["S"] == counts["S"]
    assert all(c["S"] == 0 for c in loads["accesses"].values())
    assert all(c["L"] == 0 for c in stores["accesses"].values())


def test_only_one_heap_block(tmp_path):
    """--only malloc0001-style names select one heap block's accesses."""
    argv = [prog("data_heap", "O2-nopie")]
    full, _ = _record_data(tmp_path / "all", argv)
    blocks = load_allocations(tmp_path / "all" / "t")
    target = next(b for b in blocks if b["site"].startswith("build_list"))
    only, out = _record_data(tmp_path / "one", argv, "--only", f"malloc{target['id']:04d}")
    assert out == subprocess.run(argv, capture_output=True, timeout=60).stdout
    from madtrace.trace.reader import iter_access_chunks
    chunks = [c for _, c in iter_access_chunks(str(tmp_path / "one" / "t"))]
    assert chunks and all((c["block"] == target["id"]).all() for c in chunks)
    total = sum(len(c) for c in chunks)
    assert total == sum(sum(v.values()) for v in only["accesses"].values()) >= 2


def test_bad_data_selections_are_one_line_errors(tmp_path):
    argv = [prog("data_globals", "O0-nopie")]
    for options, code, words in ((["--data-in", "nope_*"], 16, "no function matches"),
                                 (["--only", "no_such_var"], 16, "unknown variable"),
                                 (["--loads-only", "--stores-only"], 2, "not allowed with")):
        result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "x"), *options, "--", *argv)
        err = result.stderr.decode().strip()
        assert result.returncode == code and words in err and "\n" not in err, (options, err)
    result = madtrace("record", "-q", "--only", "values", "-o", str(tmp_path / "y"), "--", *argv)
    assert result.returncode == 2 and b"add --data" in result.stderr


@pytest.mark.parametrize("signum", [5, 11])
def test_target_dies_of_its_own_trap_or_fault_as_untraced(tmp_path, signum):
    """raise(SIGTRAP) / raise(SIGSEGV) with the default action while the guard is
    the action of both: the target dies of that signal, as without madtrace."""
    argv = [prog("signals", "O2-pie"), "die", str(signum)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    result = madtrace("record", "-q", "--data", "-o", str(tmp_path / "t"), "--", *argv)
    assert native.returncode == -signum
    assert result.returncode == 128 + signum and result.stdout == native.stdout


def test_cxx_new_delete_and_mappings_are_named_blocks(tmp_path):
    """operator new/delete blocks are named after their C++ call site (the malloc
    block inside is marked part_of them), and the program's own mmap/mremap/
    munmap show up as <memmap...>/<mremap...> blocks, <unmap:...> once unmapped."""
    argv = [prog("data_cxx", "O2-pie")]
    _, out = _record_data(tmp_path / "cxx", argv)
    assert out == subprocess.run(argv, capture_output=True, timeout=60).stdout
    blocks = load_allocations(tmp_path / "cxx" / "t")
    new = [b for b in blocks if b["kind"] == "new" and b["part_of"] is None]
    by_site = {}
    for b in new:
        by_site.setdefault(b["site"].split("+")[0], []).append(b)
    assert len(by_site["_Z13build_and_sumi"]) == 10 and len(by_site["_Z9array_sumi"]) == 1
    assert all(b["freed_seq"] is not None and b["name"].startswith("<freed:") for b in new)
    assert all(b["part_of"] for b in blocks if b["kind"] == "malloc" and b["site"].startswith("_Znwm"))

    _record_data(tmp_path / "maps", [prog("data_special", "O2-nopie")])
    blocks = load_allocations(tmp_path / "maps" / "t")
    kinds = [b["kind"] for b in blocks]
    assert "memmap" in kinds and "mremap" in kinds
    mapped = [b for b in blocks if b["kind"] in ("memmap", "mremap")]
    assert all(b["name"].startswith("<unmap:") for b in mapped)    # all unmapped by exit
    region = next(b for b in mapped if b["site"].startswith("protected_region"))
    assert region["size"] == 4 * 4096


def test_block_events_for_system_calls_and_mem_functions(tmp_path):
    """write() of a traced buffer is one G event, read()/getrandom() one W event,
    sized by what the call moved; memset/memcpy/memmove calls on traced memory are
    one W or Y event each instead of a fault per vector."""
    argv = [prog("data_blocks", "O2-nopie"), "5000"]
    meta, out = _record_data(tmp_path, argv)
    assert out == subprocess.run(argv, capture_output=True, timeout=60).stdout
    from madtrace.trace.block_event_records import block_events
    events = list(block_events(str(tmp_path / "t")))
    image = ElfImage.load(argv[0])
    a = image.symbols_named("a")[0].address
    b = image.symbols_named("b")[0].address
    lo, hi = min(a, b), max(a, b) + 8192
    mine = [(e["kind"], e["address"], e["size"], e.get("source")) for e in events
            if lo <= e["address"] < hi]
    assert ("W", a, 5000, None) in mine                  # memset(a, 'q', n)
    assert ("Y", b, 5000, a) in mine                     # memcpy(b, a, n)
    assert ("Y", b + 1, 4999, b) in mine                 # memmove(b + 1, b, n - 1)
    assert ("G", b, 5000, None) in mine                  # write(1, b, n)
    assert ("W", a, 16, None) in mine                    # read() of 16 bytes from a pipe
    counts = meta["data_tracing"]["block_events"]
    assert counts["Y"]["events"] >= 2 and counts["G"]["bytes"] >= 5000
    # SQL sees every block event, named like the accesses
    from madtrace.trace.query import connect
    con = connect(str(tmp_path / "t"))
    by_kind = dict(con.execute("SELECT kind, count(*) FROM block_events GROUP BY kind").fetchall())
    assert by_kind == {k: sum(e["kind"] == k for e in events) for k in "YWG"}
    assert ("Y", "memcpy", 5000, "b[0]", "a[0]") in con.execute(
        "SELECT kind, what, size, data, source_data FROM block_events").fetchall()
    # each named by its instruction in the program's code: a system call made in a
    # relocated copy of libc's read() is named read+..., not the copy's address
    named = dict(con.execute("SELECT what, min(instruction) FROM block_events GROUP BY ALL"
                             ).fetchall())
    assert named["read"].startswith(("read+", "__read")) and \
        named["write"].startswith(("write+", "__write")) and \
        named["memcpy"].startswith("main+"), named
    # placed among the thread's events: before the first access that follows it
    rows = con.execute("SELECT b.pos, b.\"order\", (SELECT count(*) FROM accesses a WHERE "
                       "a.tid = b.tid AND a.\"order\" < b.\"order\") + b.seq FROM block_events b"
                       ).fetchall()
    assert rows and all(pos == expected for pos, _, expected in rows)


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_rodata_on_request_equals_lackey(tmp_path, variant):
    """.rodata is traced only when --regions names it; its loads (a table, double
    constants, a string table) then equal lackey's per instruction."""
    path = prog("data_rodata", variant)
    argv = [path, "300"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    label = f".rodata of {os.path.basename(path)}"
    result = madtrace("record", "-q", "--data", "--no-functions", "--regions", label,
                      "-o", str(tmp_path / "t"), "--", *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    with open(tmp_path / "t" / "meta.json") as f:
        meta = json.load(f)
    assert [r[2] for r in meta["data_tracing"]["regions"]] == [label]
    image = ElfImage.load(path)
    text = image.section(".text")
    oracle = lackey_accesses(argv, (text.address, text.address + text.size),
                             sections(path, ".rodata"))
    got, expected = named_like_madtrace(path, oracle, meta["accesses"])
    assert got == expected
    assert sum(c["L"] for c in got.values()) >= 600 and not any(c["S"] for c in got.values())
    # without --regions, .rodata is not traced
    plain = madtrace("record", "-q", "--data", "--no-functions", "-o", str(tmp_path / "p"), "--",
                     *argv, timeout=300)
    assert plain.returncode == 0
    assert not any(".rodata" in r[2] for r in json.load(open(tmp_path / "p" / "meta.json"))
                   ["data_tracing"]["regions"])


def test_block_events_carry_the_heap_blocks_of_their_ranges(tmp_path):
    """Each block event is a record with the heap block that held its address (and
    its source's) then, as the tracer's block index said: the same blocks the
    block table gives by address and order (BlockIndex, the offline oracle);
    hooks_churn's heap-to-heap copies of 64 bytes among them."""
    from madtrace.trace.block_event_records import block_events
    from madtrace.trace.blocks import BlockIndex, load_allocations
    argv = [prog("hooks_churn", "O2-pie"), "200"]
    _record_data(tmp_path, argv)
    directory = str(tmp_path / "t")
    assert not os.path.exists(os.path.join(directory, "data", "block_events.json"))
    events = list(block_events(directory))
    blocks = load_allocations(directory)
    index = BlockIndex(blocks)
    for e in events:
        for address, key, freed_key in (("address", "block", "freed"),
                                        ("source", "source_block", "source_freed")):
            if e.get(address) is None:
                continue
            block, freed = index.find(e[address], e["order"])
            assert (e[key], e[freed_key]) == ((block["id"], freed) if block else (0, False)), e
    heap_copies = [e for e in events if e["kind"] == "Y" and e["size"] == 64 and e["block"]
                   and e["source_block"]]
    assert len(heap_copies) >= 10, len(heap_copies)
    assert all(e["block"] != e["source_block"] for e in heap_copies)


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_data_tracing_without_aslr(tmp_path, variant):
    """``setarch -R`` (as gdb runs programs): the libraries lie just below the
    main stack, and the code areas near them must stay inside the user address
    space (every data recording failed with mmap ENOMEM).  Functions and data
    traced, the output unchanged, the accesses those of an ASLR run."""
    import shutil
    if shutil.which("setarch") is None:
        pytest.skip("setarch is not installed")
    argv = [prog("data_heap", variant)]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    runs = []
    for name, prefix in (("aslr", []), ("no-aslr", ["setarch", "-R"])):
        out = tmp_path / name
        result = subprocess.run(prefix + MADTRACE + ["record", "-q", "--data", "-f", "main", "-o",
                                                     str(out), "--", *argv],
                                capture_output=True, timeout=300,
                                env=dict(os.environ, PYTHONPATH=ROOT))
        assert result.returncode == 0, result.stderr
        assert result.stdout == native.stdout
        meta = json.loads((out / "meta.json").read_text())
        runs.append(({k: v for k, v in meta["accesses"].items()}, meta["calls"]))
    assert runs[0] == runs[1]
    assert sum(c["L"] + c["S"] for c in runs[1][0].values()) > 100
