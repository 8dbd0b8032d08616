"""Exports of data traces: MadT's text format round trip, and the lackey
format compared with valgrind lackey's own output per instruction."""

from __future__ import annotations

import collections
import json

from madtrace.binary.elf import ElfImage
from madtrace.trace.events import load_accesses
from madtrace.trace.madt import parse_line

from .oracles import lackey_accesses, parse_lackey
from .util import madtrace, one_line_error, prog


def record_data(tmp_path, program="data_heap", variant="O0-nopie"):
    directory = tmp_path / "t"
    result = madtrace("record", "-q", "--data", "-f", "chase", "-f", "grow", "-o", str(directory),
                      "--", prog(program, variant), timeout=300)
    assert result.returncode == 0, result.stderr
    return directory


def test_madt_round_trip(tmp_path):
    """export madt (raw and symbolic) -> parse -> the same events as the store."""
    directory = record_data(tmp_path)
    raw = madtrace("export", str(directory), "--format", "madt", "--raw")
    symbolic = madtrace("export", str(directory), "--format", "madt")
    assert raw.returncode == 0 and symbolic.returncode == 0
    raw_lines = [parse_line(line) for line in raw.stdout.decode().splitlines()]
    sym_lines = [parse_line(line) for line in symbolic.stdout.decode().splitlines()]
    assert len(raw_lines) == len(sym_lines)
    assert [l["kind"] for l in raw_lines] == [l["kind"] for l in sym_lines]
    # the raw accesses are exactly the stored ones, in order, with the same sizes
    stored = collections.Counter()
    for tid, arr in load_accesses(str(directory)).items():
        for rec in arr:
            stored[("L" if rec["kind"] == 1 else "S", int(rec["addr"]), int(rec["size"]),
                    int(rec["rip"]))] += 1
    exported = collections.Counter()
    for line in raw_lines:
        if line["kind"] in "LS":
            addr, size, _region, rip = line["fields"]
            exported[(line["kind"], int(addr, 16), int(size), int(rip, 16))] += 1
    assert exported == stored
    with open(directory / "data" / "allocations.json") as f:
        blocks = json.load(f)
    kinds = collections.Counter(l["kind"] for l in sym_lines if l["kind"] in "MCRF")
    assert kinds["M"] + kinds["C"] + kinds["R"] == len(blocks)
    assert kinds["F"] == sum(1 for b in blocks if b["freed_seq"] is not None)
    # symbolic heap accesses name their block the MadT way
    chase = [l for l in sym_lines if l["kind"] == "L" and l["fields"][2].startswith("chase+")]
    assert chase and all(l["fields"][0].startswith("<malloc") and l["fields"][1] == "[heap]"
                         for l in chase)


def test_lackey_export_equals_valgrind_lackey(tmp_path):
    path = prog("data_globals", "O2-nopie")
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--data", "--no-functions", "-o", str(directory), "--",
                    path, timeout=300).returncode == 0
    out = tmp_path / "export.lackey"
    assert madtrace("export", str(directory), "--format", "lackey", "-o", str(out)).returncode == 0
    image = ElfImage.load(path)
    text = image.section(".text")
    code = (text.address, text.address + text.size)
    data = [(s.address, s.address + s.size) for s in image.sections
            if s.name in (".data", ".bss") and s.size]
    assert parse_lackey(str(out), code, data) == lackey_accesses([path], code, data)
    # never overwritten without --force
    one_line_error(madtrace("export", str(directory), "--format", "lackey", "-o", str(out)), 17,
                   "--force")


def test_export_needs_a_data_trace(tmp_path):
    directory = tmp_path / "t"
    assert madtrace("record", "-q", "--no-functions", "-o", str(directory), "--",
                    prog("data_globals", "O0-pie")).returncode == 0
    one_line_error(madtrace("export", str(directory), "--format", "madt"), 18, "without --data")
    one_line_error(madtrace("export", str(tmp_path / "nothing"), "--format", "madt"), 18, "nothing")
