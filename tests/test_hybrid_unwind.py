"""C++ programs under the hybrid data engine: exceptions unwind through the
relocated copies.

Before, every function of a process with a C++ unwinder stayed on the fault
path.  Now each copy gets the unwind information of its original (call frame
rows and exception tables moved with the code) from the program's own
unwinder.  Oracles: the program's own output (its sums, its count of
exceptions caught, destructors run, rethrows), valgrind lackey per
instruction, and what the engine says it did (functions relocated, probe
share)."""

from __future__ import annotations

import json
import subprocess

import pytest

from madtrace.binary.elf import ElfImage
from madtrace.data.instruction_table import FAULT
from madtrace.trace.compact import InstructionColumns

from .test_data import compare_with_lackey
from .test_hybrid import HYBRID, output_when_killed, probe_share, record
from .util import prog

# every instruction of these (mangled names) takes a probe; main also has a push of a
# global, which stays on faults ("uses the stack pointer")
THROWERS = ("_Z7checkedl", "_Z6middlel", "_Z5relayl", "_Z6sorteri")


@pytest.fixture(autouse=True)
def hybrid_engine(monkeypatch):
    monkeypatch.setenv("MADTRACE_DATA_ENGINE", "hybrid")


def on_faults(out_dir, path: str) -> set[str]:
    """The executable's functions with an instruction left on the fault path."""
    image = ElfImage.load(path)
    table = InstructionColumns.load(out_dir)
    names = set()
    for rip in table.rip[table.path == FAULT]:
        symbol = image.symbol_at(int(rip))
        if symbol is not None:
            names.add(symbol.name.split(".")[0])
    return names


@pytest.mark.parametrize("variant", ["O0-nopie", "O2-nopie"])
def test_exceptions_through_copies_equal_lackey(tmp_path, variant):
    """Exceptions thrown, caught, rethrown and passing a destructor, all in
    relocated functions, and one thrown from a comparator through libc's qsort:
    the program's output is unchanged and every instruction of the executable
    makes the loads and stores lackey sees; the probes carry most of them."""
    got = compare_with_lackey(tmp_path, "data_throw", variant, lambda static, stderr: static,
                              args=("3000",), options=HYBRID)
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    # at -O2 a catch block lies in FUNC.cold, a function of its own
    assert {name.split("+")[0].split(".")[0] for name in got} >= set(THROWERS)
    assert not on_faults(tmp_path / "t", prog("data_throw", variant)) & set(THROWERS), \
        meta["data_tracing"]["paths"]
    assert probe_share(meta) > 0.9, meta["data_tracing"]["paths"]
    only_plt(meta)


def test_pie_program_output_and_probe_path(tmp_path):
    """A PIE build, longer run: the output equals the native one and the copies
    of the throwing functions carry their accesses (nothing left on faults for
    want of unwind information)."""
    argv = [prog("data_throw", "O2-pie"), "20000"]
    native = subprocess.run(argv, capture_output=True, timeout=60)
    meta, out, _ = record(tmp_path, argv)
    assert out == native.stdout
    assert probe_share(meta) > 0.95, meta["data_tracing"]["paths"]
    assert not on_faults(tmp_path / "t", argv[0]) & set(THROWERS), meta["data_tracing"]["paths"]
    only_plt(meta)


def only_plt(meta: dict) -> None:
    """The only code left without unwind information for its copy is code whose
    call frame rules read the instruction pointer (the PLT's)."""
    refused = meta["data_tracing"]["paths"]["rewriter"]["refused"]
    assert all("reads the instruction pointer" in why for why in refused
               if why.startswith("no unwind information")), refused


def test_exceptions_still_unwind_when_the_tracer_is_killed(tmp_path):
    """madtrace dies while the program throws through the copies: the copies
    and their unwind information stay with the program (the guard turns the
    probes back into plain accesses), which finishes with its normal output."""
    argv = [prog("data_throw", "O2-nopie"), "400000"]
    native = subprocess.run(argv, capture_output=True, timeout=120)
    assert output_when_killed(tmp_path, argv, after=2.0) == native.stdout
