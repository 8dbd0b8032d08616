# SPDX-License-Identifier: GPL-2.0-or-later
"""The copier's function analyses kept on disk (data/hybrid/analysis_cache.py).

Oracles: a copy made from an analysis read back from the file is the copy made
from a fresh analysis, byte for byte with the same tables, for every function
of the test programs and of the machine's python3 (the copier itself is
checked against capstone in test_function_copy.py); a traced run that reads
its analyses from the cache records what a run that made them records (the
program's output, per-instruction access counts), and says it used them;
a damaged file is said in one line and rebuilt."""

from __future__ import annotations

import json
import marshal
import os
import shutil

import pytest

from madtrace.arch.x86_64.copy_analysis import analyse
from madtrace.arch.x86_64.function_copy import copy_function
from madtrace.data.hybrid import analysis_cache
from madtrace.target.templates import load_injector

from .test_function_copy import BITMAP, CTL, functions
from .util import madtrace, prog

PYTHON = "/usr/bin/python3"


STUBS_MOVED: dict[str, int] = {}     # functions with an indirect jump's stub, moved


def copies_equal(path: str, limit: int | None = None, stride: int = 1, bias: int = 0,
                 other: int = 0) -> int:
    """Every (``stride``-th) function of ``path``: the copy from a round-tripped
    analysis equals the copy from the fresh one.  With ``bias``: analysed as if
    the image were loaded there, kept at the ELF file's addresses, and used as
    if loaded at ``other`` (a position-independent image in two runs), against
    a fresh analysis there.  Returns how many were compared."""
    injector = load_injector()
    tables = analysis_cache._Tables()
    compared = 0
    STUBS_MOVED[path] = 0
    for k, (start, end, code) in enumerate(functions(path)):
        if k % stride:
            continue
        made = analyse(code, start + bias, end + bias)
        if not hasattr(made, "mems") or made.refusal is not None or \
                (bias != other and not analysis_cache.movable(made)):
            continue
        stored = analysis_cache.encode(made, tables, -bias)
        back = analysis_cache.decode(marshal.loads(marshal.dumps(stored)),
                                     analysis_cache._Tables(tables.stored()), other)
        start, end = start + other, end + other
        fresh = analyse(code, start, end)
        address = 0x60000000
        made = []
        for analysis in (fresh, back):
            ids = iter(range(1, 1 << 30))
            made.append(copy_function(code, start, end, address, injector,
                                      lambda mem: mem.address % 3 != 0,   # some probes, not all
                                      lambda mem, ids=ids: next(ids), CTL, BITMAP,
                                      analysis=analysis))
        a, b = made
        assert type(a) is type(b), hex(start)
        if hasattr(a, "code"):
            assert (a.code, a.old_to_new, a.probe_rows, a.unprobed, a.stub_rows, a.returns,
                    a.targets) == (b.code, b.old_to_new, b.probe_rows, b.unprobed, b.stub_rows,
                                   b.returns, b.targets), hex(start)
        else:
            assert str(a) == str(b), hex(start)
        compared += 1
        STUBS_MOVED[path] += bool(back.has_stub and bias != other)
        if limit and compared >= limit:
            break
    return compared


@pytest.mark.parametrize("name", ["data_dispatch", "data_kernels", "calls_qsort"])
def test_copies_from_a_kept_analysis_equal_fresh_ones(name):
    assert copies_equal(prog(name, "O2-nopie")) > 5


@pytest.mark.parametrize("name", ["data_dispatch", "calls_qsort"])
def test_copies_from_a_moved_analysis_equal_fresh_ones(name):
    """A position-independent program analysed in one run, used in another."""
    assert copies_equal(prog(name, "O2-pie"), bias=0x555555554000, other=0x5600aa000000) >= 4


def test_copies_from_moved_analyses_of_the_c_library():
    """libc's functions, those with an indirect jump's stub among them (its copy
    of the function's start moved with the rest)."""
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    assert copies_equal(libc, limit=200, stride=11, bias=0x7f0012340000,
                        other=0x7fabc0000000) >= 200
    assert STUBS_MOVED[libc] >= 3, STUBS_MOVED


@pytest.mark.skipif(not os.path.exists(PYTHON), reason="no python3")
def test_copies_from_kept_analyses_of_python3():
    assert copies_equal(os.path.realpath(PYTHON), limit=300, stride=7) >= 300


def test_a_warm_run_reads_its_analyses_and_records_the_same(tmp_path, monkeypatch):
    """data_globals -O2 (non-PIE): the second run takes its analyses from the
    file the first wrote, and records the same accesses; a damaged file is
    said in one line and rebuilt by the next run."""
    monkeypatch.setenv("MADTRACE_CACHE_DIR", str(tmp_path / "cache"))
    argv = [prog("data_globals", "O2-nopie")]
    runs = []
    for i in range(2):
        out = tmp_path / f"t{i}"
        result = madtrace("record", "-q", "--data", "--no-functions", "-o", str(out), "--", *argv)
        assert result.returncode == 0, result.stderr
        meta = json.loads((out / "meta.json").read_text())
        runs.append((result.stdout, meta["accesses"], meta["data_tracing"]["paths"]["rewriter"]))
    (out0, acc0, rw0), (out1, acc1, rw1) = runs
    assert out0 == out1 and acc0 == acc1
    assert rw0.get("analyses cached", 0) > 0 and "analyses from the cache" not in rw0
    assert rw1["analyses from the cache"] == rw0["analyses cached"]
    # the program's and its libraries' (kept at their ELF addresses, moved by their bias)
    files = [f for f in os.listdir(tmp_path / "cache") if f.endswith(analysis_cache.SUFFIX)]
    assert len(files) >= 2
    for name in files:
        path = tmp_path / "cache" / name
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
    result = madtrace("record", "--data", "--no-functions", "-o", str(tmp_path / "t2"), "--", *argv)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.decode().splitlines() if "analysis cache" in line]
    assert len(lines) == len(files) and all("rebuilt" in line for line in lines), result.stderr
    meta = json.loads((tmp_path / "t2" / "meta.json").read_text())
    assert meta["accesses"] == acc0
    shutil.rmtree(tmp_path / "cache")
