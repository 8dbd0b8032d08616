"""String instructions on probes (hybrid data engine, arch/x86_64/string_probes.py):
movs, stos, lods, scas and cmps, with and without rep, forward and backwards,
record their accesses inside the target instead of faulting.

Oracles: valgrind lackey, in order (madtrace's lackey export against lackey's
own log, access by access, for the string instructions' functions), the
program's own output, and for signals landing inside a rep loop the
program's own checksum."""

from __future__ import annotations

import json
import subprocess

import pytest

from madtrace.binary.elf import ElfImage
from madtrace.data.instruction_table import PROBE
from madtrace.trace.compact import InstructionColumns

from .test_data import sections
from .test_hybrid import output_when_killed
from .util import detach_after, madtrace, prog, start_data_tracing

HYBRID = ["--data-engine", "hybrid"]
STRING_FUNCTIONS = ("copy_bytes", "fill_words", "move_words", "sum_bytes", "length", "same",
                    "set_bytes")


@pytest.fixture(autouse=True)
def hybrid_engine(monkeypatch):
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")


def _ordered_accesses(log: str, code: list[tuple[int, int]], data: list[tuple[int, int]]) -> list:
    """(instruction, L|S, address, size) in a lackey log's order, for instructions
    in ``code`` and data in ``data`` (lackey's M: a load, then a store); an
    address as its offset from the start of its range of ``data`` (the heap
    is elsewhere under valgrind)."""
    out, current = [], None
    with open(log) as f:
        for line in f:
            if line.startswith("I "):
                addr = int(line[3:].split(",")[0], 16)
                current = addr if any(a <= addr < b for a, b in code) else None
                continue
            if current is None or len(line) < 3 or line[0] != " " or line[1] not in "LSM":
                continue
            where, size = line[3:].strip().split(",")
            addr = int(where, 16)
            region = next((k for k, (a, b) in enumerate(data) if a <= addr < b), None)
            if region is not None:
                for kind in ("LS" if line[1] == "M" else line[1]):
                    out.append((current, kind, region, addr - data[region][0], int(size)))
    return out


def _string_code(path: str) -> list[tuple[int, int]]:
    image = ElfImage.load(path)
    return [(s.address, s.address + s.size) for s in image.functions() if s.name in STRING_FUNCTIONS]


def _ranges(static, stderr: str) -> list[tuple[int, int]]:
    heap = next(line.split()[1:] for line in stderr.splitlines() if line.startswith("heap "))
    return list(static) + [(int(heap[0], 16), int(heap[1], 16))]


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_string_instructions_on_probes_equal_lackey_in_order(tmp_path, variant):
    """Every access of the string instructions, in lackey's order (movs: the
    load, then the store; cmps: [rdi], then [rsi]; backwards under std; none
    for a count of zero), made on probes: no instruction of theirs on the
    fault path, and the faults of a run do not grow with its rounds."""
    path = prog("data_strings", variant)
    argv = [path, "300"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    out = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), *HYBRID, "--",
                      *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == native.stdout
    exported = tmp_path / "t.lackey"
    assert madtrace("export", str(out), "--format", "lackey", "-o", str(exported)).returncode == 0
    lackey_log = tmp_path / "lackey.log"
    run = subprocess.run(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={lackey_log}",
                          *argv], capture_output=True, timeout=300, check=True)
    code = _string_code(path)
    static = sections(path, ".data", ".bss")
    expected = _ordered_accesses(str(lackey_log), code, _ranges(static, run.stderr.decode()))
    got = _ordered_accesses(str(exported), code, _ranges(static, result.stderr.decode()))
    assert len(expected) > 300 * 100
    assert got == expected, next((k, g, e) for k, (g, e) in enumerate(zip(got, expected)) if g != e) \
        if len(got) == len(expected) else (len(got), len(expected))
    table = InstructionColumns.load(str(out))
    image = ElfImage.load(path)
    strings = {s.name: s for s in image.functions() if s.name in STRING_FUNCTIONS}
    for name, function in strings.items():
        if name == "set_bytes":
            continue                       # the long mode's only
        ids = (table.rip >= function.address) & (table.rip < function.address + function.size)
        assert ids.any() and (table.path[ids] == PROBE).all(), (name, table.path[ids])
    faults = []
    for rounds in ("200", "2000"):
        meta, _ = _record(tmp_path / rounds, [path, rounds])
        faults.append(meta["data_tracing"]["faults"])
        assert meta["data_tracing"]["slow_path"] == 0, meta["data_tracing"]["slow_reasons"]
    assert faults[1] - faults[0] < 50, faults


def _record(tmp_path, argv) -> tuple[dict, bytes]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), *HYBRID, "--",
                      *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "meta.json").read_text()), result.stdout


def test_signals_inside_rep_loops_are_recorded_once(tmp_path):
    """A SIGALRM every millisecond lands inside rep movsb/stosb loops of 4 KiB
    on probes: each delivery moves the thread out of the probe (back to the
    instruction with the iterations done so far, or on past the iteration);
    the checksum is the native run's and the accesses per instruction are
    exactly 4096 per call, as lackey counts them."""
    path = prog("data_strings", "O2-nopie")
    rounds = 1500
    argv = [path, str(rounds), "long"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, stdout = _record(tmp_path, argv)
    result_dir = tmp_path / "t"
    rewriter = meta["data_tracing"]["paths"]["rewriter"]
    assert rewriter.get("threads settled", 0) > 10, rewriter       # signals met the loops
    table = InstructionColumns.load(str(result_dir))
    image = ElfImage.load(path)
    counts = meta["accesses"]
    for name, kinds in (("copy_bytes", "LS"), ("set_bytes", "S")):
        function = next(s for s in image.functions() if s.name == name)
        ids = (table.rip >= function.address) & (table.rip < function.address + function.size)
        assert ids.any() and (table.path[ids] == PROBE).all(), name
        got = {k: sum(c[k] for at, c in counts.items() if at.startswith(name + "+")) for k in kinds}
        assert got == {k: rounds * 4096 for k in kinds}, (name, got)
    assert stdout == native.stdout


@pytest.mark.parametrize("how", ["detach", "kill"])
def test_target_finishes_when_left_inside_rep_loops(tmp_path, how):
    """madtrace detaches (SIGTERM; signals landing in the loops meanwhile) or is
    killed (no signals: docs/known-limits.md) while the program copies in rep
    loops on probes: the program finishes with the native output."""
    argv = [prog("data_strings", "O2-pie"), "400000", "long"] + (["quiet"] if how == "kill" else [])
    native = subprocess.run(argv, capture_output=True, timeout=120)
    if how == "detach":
        tracer = start_data_tracing(["record", "--data", "--no-functions", *HYBRID,
                                     "-o", str(tmp_path / "t"), "--", *argv])
        out, err = detach_after(tracer, 1.0)
        assert tracer.returncode == 0, err
        assert out == native.stdout
        meta = json.loads((tmp_path / "t" / "meta.json").read_text())
        assert meta["outcome"] == "detached" and meta["released"]["kept"] == [], meta["released"]
        return
    assert output_when_killed(tmp_path, argv, after=1.0) == native.stdout
