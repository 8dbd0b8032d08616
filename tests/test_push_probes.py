"""``push qword ptr [m]`` on probes (hybrid data engine, insn_entries.py
``_push_plan``): the probe loads the value through the alias and stores it
where the push puts it, then pops its frame 8 bytes short.  Before, every such
push was a ptrace stop (CPython's parser passes its stack arguments so).

Oracles: valgrind lackey, in order (madtrace's lackey export against lackey's
own log, for the pushing function's data accesses), the program's own output;
for signals landing inside the probes, the program's own checksum."""

from __future__ import annotations

import json
import subprocess

import pytest

from madtrace.binary.elf import ElfImage
from madtrace.data.instruction_table import PROBE
from madtrace.trace.compact import InstructionColumns

from .test_data import sections
from .test_hybrid import output_when_killed
from .test_string_probes import _ordered_accesses, _ranges
from .util import madtrace, prog

HYBRID = ["--data-engine", "hybrid"]


@pytest.fixture(autouse=True)
def hybrid_engine(monkeypatch):
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")


def _pushed(path: str) -> tuple[int, int]:
    function = next(s for s in ElfImage.load(path).functions() if s.name == "pushed")
    return function.address, function.address + function.size


def _record(out, argv) -> tuple[dict, subprocess.CompletedProcess]:
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), *HYBRID, "--",
                      *argv, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads((out / "meta.json").read_text()), result


def _on_probes(out, meta: dict, path: str) -> None:
    """Every instruction of ``pushed`` that accesses traced data ran on a probe."""
    table = InstructionColumns.load(str(out))
    bias = next(m["bias"] for m in meta["modules"] if m["main"])
    lo, hi = (at + bias for at in _pushed(path))
    ids = (table.rip >= lo) & (table.rip < hi)
    assert ids.sum() == 4 and (table.path[ids] == PROBE).all(), table.path[ids]


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_pushes_on_probes_equal_lackey_in_order(tmp_path, variant):
    """Each push's load, RIP-relative and through registers with and without an
    index, on .data, .bss and the heap, in lackey's order; none on the fault
    path, and the program's output unchanged."""
    path = prog("data_pushes", variant)
    argv = [path, "300"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    out = tmp_path / "t"
    meta, result = _record(out, argv)
    assert result.stdout == native.stdout
    exported = tmp_path / "t.lackey"
    assert madtrace("export", str(out), "--format", "lackey", "-o", str(exported)).returncode == 0
    lackey_log = tmp_path / "lackey.log"
    run = subprocess.run(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={lackey_log}",
                          *argv], capture_output=True, timeout=300, check=True)
    code = [_pushed(path)]
    static = sections(path, ".data", ".bss")
    expected = _ordered_accesses(str(lackey_log), code, _ranges(static, run.stderr.decode()))
    got = _ordered_accesses(str(exported), code, _ranges(static, result.stderr.decode()))
    assert len(expected) == 300 * 16 * 2 * 4
    assert got == expected, next((k, g, e) for k, (g, e) in enumerate(zip(got, expected)) if g != e) \
        if len(got) == len(expected) else (len(got), len(expected))
    _on_probes(out, meta, path)
    assert not any(why == "uses the stack pointer"
                   for why in meta["data_tracing"]["paths"]["on_faults"].values())


def test_signals_inside_push_probes(tmp_path):
    """A SIGALRM every 200 us lands inside the pushes' probes: each delivery
    moves the thread out (back to the push, or on past its store and the
    frame's pop); the checksum is the native run's and each push made exactly
    one access per call."""
    path = prog("data_pushes", "O2-pie")
    rounds = 20000
    argv = [path, str(rounds), "signals"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    out = tmp_path / "t"
    meta, result = _record(out, argv)
    assert result.stdout == native.stdout
    rewriter = meta["data_tracing"]["paths"]["rewriter"]
    assert rewriter.get("threads settled", 0) > 10, rewriter
    _on_probes(out, meta, path)
    counts = {at: c for at, c in meta["accesses"].items() if at.startswith("pushed+")}
    assert len(counts) == 4 and all(c == {"L": rounds * 32, "S": 0} for c in counts.values()), counts


def test_target_finishes_when_the_tracer_is_killed_in_pushes(tmp_path):
    """madtrace killed while the program pushes on probes: it finishes alone
    with the native output (the copies stay in use, the pushes with them)."""
    argv = [prog("data_pushes", "O2-pie"), "400000"]
    native = subprocess.run(argv, capture_output=True, timeout=120)
    assert output_when_killed(tmp_path, argv, after=1.0) == native.stdout
