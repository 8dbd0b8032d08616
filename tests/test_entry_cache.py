# SPDX-License-Identifier: GPL-2.0-or-later
"""The copier cache (data/hybrid/entry_cache.py): the per-instruction entries of
the hybrid engine's copier kept on disk per binary.  Oracles: the entries
analysed afresh (every field equal after the round trip through the file),
lackey-exact recordings made with and without the cache giving the same
per-instruction counts, a damaged file rebuilt with one line said."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from madtrace.arch.x86_64 import copy_analysis, insn_entries
from madtrace.binary.elf import ElfImage
from madtrace.data.hybrid import entry_cache

from .util import madtrace, prog


def _fields(e: insn_entries.Entry) -> tuple:
    out = []
    for name in insn_entries.Entry.__slots__:
        value = getattr(e, name)
        if name in ("view", "error"):
            value = pickle.dumps(value) if name == "view" else repr(value)
        out.append(value)
    return tuple(out)


def _functions(path: str, limit: int = 400):
    image = ElfImage.load(path)
    data = open(path, "rb").read()
    for s in [f for f in image.functions() if f.size > 0][:limit]:
        sec = image.section_at(s.address)
        if sec is not None and sec.offset:
            off = s.address - sec.address + sec.offset
            yield data[off:off + s.size], s.address


@pytest.mark.parametrize("path", ["/usr/bin/python3", "data_kernels"])
def test_entries_read_back_equal(tmp_path, path):
    path = prog(path, "O2-nopie") if "/" not in path else os.path.realpath(path)
    for code, address in _functions(path):
        copy_analysis.analyse(code, address, address + len(code))
    fresh = dict(insn_entries.analysed)
    assert len(fresh) > 200
    file = str(tmp_path / "x.mti")
    entry_cache.write_file(file, {raw: entry_cache.encode(e) for raw, e in fresh.items()})
    stored = entry_cache.read_file(file)
    assert set(stored) == set(fresh)
    for raw, e in fresh.items():
        back = entry_cache.restore(stored[raw])
        assert _fields(back) == _fields(e), raw.hex()


def _record(tmp_path, name, quiet=True):
    out = tmp_path / name
    result = madtrace("record", *(["-q"] if quiet else []), "--data", "--no-functions", "--no-store", "--data-engine",
                      "hybrid", "-o", str(out), "--", prog("data_kernels", "O2-nopie"), "matmul",
                      "30")
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    return meta, result


def test_recordings_with_the_cache_equal_those_without(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("MADTRACE_CACHE_DIR", str(cache))
    first, r1 = _record(tmp_path, "a")
    files = sorted(p for p in os.listdir(cache) if p.endswith(".mti"))
    assert files, os.listdir(cache)
    # without the function analyses kept beside it (analysis_cache.py: with them, no
    # function is analysed again and the entries are not needed)
    for name in os.listdir(cache):
        if name.endswith(".mta"):
            os.remove(os.path.join(cache, name))
    second, r2 = _record(tmp_path, "b")
    rewriter = second["data_tracing"]["paths"]["rewriter"]
    assert rewriter["instruction entries from the copier cache"] > 100
    assert r1.stdout == r2.stdout
    assert first["accesses"] == second["accesses"]
    assert first["data_tracing"]["paths"]["accesses_by_path"] == \
        second["data_tracing"]["paths"]["accesses_by_path"]
    # a damaged file: rebuilt, said once, the recording unchanged (without the
    # function analyses kept beside it, analysis_cache.py: the entries are needed)
    for name in os.listdir(cache):
        if name.endswith(".mta"):
            os.remove(os.path.join(cache, name))
    victim = os.path.join(cache, files[0])
    raw = bytearray(open(victim, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(victim, "wb").write(bytes(raw))
    third, r3 = _record(tmp_path, "c", quiet=False)
    said = [line for line in r3.stderr.decode().splitlines() if "copier cache" in line]
    assert len(said) == 1 and "checksum mismatch" in said[0] and said[0].endswith("rebuilt"), \
        r3.stderr
    assert third["accesses"] == first["accesses"]
    entry_cache.read_file(victim)          # whole again


def test_a_file_of_another_user_is_not_read(tmp_path):
    file = str(tmp_path / "x.mti")
    entry_cache.write_file(file, {b"\x90": entry_cache.encode(insn_entries.entries([b"\x90"])[0])})
    assert entry_cache.read_file(file)
    os.chown(file, 65534, 65534)
    with pytest.raises(entry_cache.CacheFormatError, match="not owned"):
        entry_cache.read_file(file)
