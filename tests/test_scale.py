"""Per-event costs flat in program size, the symbol/DWARF cache,
bounded tracer memory, progress."""

import bisect
import random

import numpy as np

from madtrace.data.heap.block_index import BlockIndex


def _reference_find(entries: dict, address: int) -> int:
    starts = sorted(entries)
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0 and address < entries[starts[i]][0]:
        return entries[starts[i]][1]
    return 0


def test_block_index_matches_a_sorted_list_oracle():
    """Random inserts (replacing at equal starts), removals, point and batch
    lookups and range queries, against a dict + bisect model; enough entries
    to split and merge many chunks."""
    rng = random.Random(15)
    index, model = BlockIndex(), {}
    next_id = 1
    for step in range(15000):
        op = rng.random()
        if op < 0.55 or not model:
            start = rng.randrange(0, 200000) * 16
            end = start + rng.choice((1, 16, 48, 4096))
            old = index.insert(start, end, next_id)
            assert old == (model[start][1] if start in model else 0)
            model[start] = (end, next_id)
            next_id += 1
        elif op < 0.9:
            start = rng.choice(list(model)) if rng.random() < 0.9 else rng.randrange(0, 3200000)
            got = index.remove(start)
            want = model.pop(start, None)
            assert got == ((want[1], want[0]) if want else (0, 0))
        else:
            address = rng.randrange(0, 3300000)
            assert index.find(address) == _reference_find(model, address)
        if step % 5000 == 0:
            assert len(index) == len(model)
            probes = np.array([rng.randrange(0, 3300000) for _ in range(2000)], dtype=np.uint64)
            ids = np.zeros(len(probes), dtype=np.uint32)
            flags = np.zeros(len(probes), dtype=np.uint8)
            index.fill(probes, ids, flags, 1)
            want = [_reference_find(model, int(a)) for a in probes]
            assert ids.tolist() == want
            assert flags.tolist() == [1 if w else 0 for w in want]
            lo = rng.randrange(0, 3000000)
            got = index.in_range(lo, lo + 100000)
            assert got == [(s, model[s][0], model[s][1]) for s in sorted(model)
                           if lo <= s < lo + 100000]


def test_block_index_batch_lookups_in_runs_match_the_oracle():
    """Batch lookups answer the addresses that stay within the last entry
    found without searching again: runs of nearby addresses (sorted, repeated,
    walking into nested and overlapping entries, into gaps and back) must give
    what a fresh search gives, and entries that come and go between batches
    must be seen."""
    rng = random.Random(18)
    index, model = BlockIndex(), {}
    for i in range(3000):
        start = rng.randrange(0, 20000) * 8
        end = start + rng.choice((1, 8, 24, 64, 4096))
        index.insert(start, end, i + 1)
        model[start] = (end, i + 1)
    for _ in range(30):
        base = rng.randrange(0, 160000)
        walk = [base + sum(rng.choice((0, 1, 1, 4, 8, 24)) for _ in range(k)) for k in range(600)]
        probes = np.array(walk + walk[::-1] + sorted(rng.sample(walk, 200)), dtype=np.uint64)
        ids = np.zeros(len(probes), dtype=np.uint32)
        flags = np.zeros(len(probes), dtype=np.uint8)
        index.fill(probes, ids, flags, 1, cached=True)
        assert ids.tolist() == [_reference_find(model, int(a)) for a in probes]
        again = np.zeros(len(probes), dtype=np.uint32)         # from the cache now
        index.fill(probes, again, flags, 1, cached=True)
        assert np.array_equal(again, ids)
        for start in rng.sample(sorted(model), 50):      # entries come and go between batches
            index.remove(start)
            del model[start]
        start = base + rng.randrange(0, 64) * 8
        model[start] = (start + 16, 9000 + _)
        index.insert(start, start + 16, 9000 + _)
    # the answers the index remembers (its cache) go when the entries change
    def find(index, address):
        ids = np.zeros(1, dtype=np.uint32)
        index.fill(np.array([address], dtype=np.uint64), ids, np.zeros(1, dtype=np.uint8), 1,
                   cached=True)
        return int(ids[0])

    fresh = BlockIndex()
    fresh.insert(0x1000, 0x1100, 1)
    assert find(fresh, 0x1080) == 1 and find(fresh, 0x1080) == 1
    fresh.remove(0x1000)
    assert find(fresh, 0x1080) == 0
    fresh.insert(0x1000, 0x1100, 2)
    assert find(fresh, 0x1080) == 2
    fresh.insert(0x1040, 0x1090, 3)                 # nested inside: it answers now
    assert [find(fresh, a) for a in (0x1080, 0x1020, 0x10A0)] == [3, 2, 0]
    fresh.insert(0x1000, 0x1010, 4)                 # the same start, a new end and id
    assert find(fresh, 0x1008) == 4 and find(fresh, 0x1020) == 0


# ------------------------------------------------------------ the symbol cache
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

from madtrace.binary import dwarf_cache  # noqa: E402
from madtrace.cache import disk  # noqa: E402
from madtrace.binary.dwarf_lines import _read as pyelftools_lines  # noqa: E402
from madtrace.binary.dwarf_native import parse_dwarf, read_dwarf  # noqa: E402
from madtrace.binary.dwarf_vars import describe_in_variable, load_variables  # noqa: E402

from .util import madtrace, prog  # noqa: E402

NAMES_SQL = ("SELECT symbol::VARCHAR AS symbol, variable::VARCHAR AS variable, region::VARCHAR AS region, "
             "instruction::VARCHAR AS instruction, "
             "count(*) FROM accesses GROUP BY ALL ORDER BY ALL")


def _type_shape(t, depth=0):
    if t is None or depth > 4:
        return None
    return (t.kind, t.name, t.size, t.count,
            tuple((m.name, m.offset, m.size, _type_shape(m.type, depth + 1)) for m in t.members),
            _type_shape(t.target, depth + 1))


@pytest.mark.parametrize("name,variant", [("data_globals", "O0-pie"), ("data_globals", "O2-nopie"),
                                          ("symbols", "O0-pie"), ("data_cxx", "O2-pie")])
def test_dwarf_reader_matches_pyelftools(tmp_path, name, variant):
    """mtdwarf (libdw) against the pyelftools reader: the same variables, types,
    fields, scopes, and the same file:line for every line-table address."""
    path = prog(name, variant)
    assert read_dwarf(path, str(tmp_path / "out"))
    data = parse_dwarf((tmp_path / "out").read_bytes())
    with open(path, "rb") as f:
        oracle = load_variables(f)
    shape = {(v.name, v.address): (v.size, v.type_name, v.scope, v.external, v.cu,
                                   _type_shape(v.type)) for v in data.variables}
    want = {(v.name, v.address): (v.size, v.type_name, v.scope, v.external, v.cu,
                                  _type_shape(v.type)) for v in oracle}
    assert shape == want
    for v in oracle:   # every field/element name of every byte
        mine = next(x for x in data.variables if (x.name, x.address) == (v.name, v.address))
        assert [describe_in_variable(mine, o) for o in range(v.size)] == \
            [describe_in_variable(v, o) for o in range(v.size)]
    with open(path, "rb") as f:
        lines = pyelftools_lines(f)
    probes = np.unique(np.concatenate([lines.addresses, lines.addresses + 1]))
    files, numbers = data.lines.lookup(probes)
    want_files, want_numbers = lines.lookup(probes)
    got = [(data.lines.files[f] if f >= 0 else None, n if f >= 0 else 0)
           for f, n in zip(files.tolist(), numbers.tolist())]
    expected = [(lines.files[f] if f >= 0 else None, n if f >= 0 else 0)
                for f, n in zip(want_files.tolist(), want_numbers.tolist())]
    # one known difference: where a sequence ends at the address the next one
    # starts, libdw gives the new sequence's line (pyelftools' order: no line)
    differ = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert all(expected[i][0] is None and got[i][0] is not None for i in differ)
    assert len(differ) <= 4


def _with_cache(cache, *args):
    saved = os.environ["MADTRACE_CACHE_DIR"]
    os.environ["MADTRACE_CACHE_DIR"] = str(cache)
    try:
        return madtrace(*args)
    finally:
        os.environ["MADTRACE_CACHE_DIR"] = saved


def _record(directory, argv, cache, *extra):
    run = _with_cache(cache, "record", "--force", "--data", "-o", str(directory), *extra, "--",
                      *argv)
    assert run.returncode == 0, run.stderr.decode()
    return run


def _names(directory):
    run = madtrace("query", str(directory), NAMES_SQL, "--json")
    assert run.returncode == 0, run.stderr.decode()
    return run.stdout


def test_warm_cache_names_equal_cold(tmp_path):
    """The cache never changes a trace: the same program recorded with an
    empty cache and with the cache it filled names every access alike (DWARF
    variables with their fields, blocks, regions, instructions), and the
    cold run read the DWARF while the target ran."""
    cache = tmp_path / "cache"
    argv = [prog("data_globals", "O0-pie")]
    cold = _record(tmp_path / "cold", argv, cache)
    meta = json.loads((tmp_path / "cold" / "meta.json").read_text())
    assert meta["tracer"]["dwarf_read_while_running"] >= 1
    assert meta["tracer"]["peak_rss_bytes"] > 0
    entries = os.listdir(cache)
    assert any(e.endswith(".mtc") for e in entries)
    warm = _record(tmp_path / "warm", argv, cache)
    meta = json.loads((tmp_path / "warm" / "meta.json").read_text())
    assert meta["tracer"]["dwarf_read_while_running"] == 0
    assert cold.stdout == warm.stdout
    names = _names(tmp_path / "cold")
    assert b"[" in names and names == _names(tmp_path / "warm")
    assert b"values[" in names or b"config." in names or b"." in names


def _compile(source: str, out, *flags):
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-g", "-O0", "-o", str(out), str(src), *flags], check=True)


PROGRAM = """
#include <stdio.h>
struct pair { %s };
struct pair table[4];
int main(void) { for (int i = 0; i < 4; i++) table[i].b = i; printf("%%d\\n", table[3].b); return 0; }
"""


@pytest.mark.parametrize("flags", [(), ("-Wl,--build-id=none",)], ids=["build-id", "no-build-id"])
def test_cache_invalidated_when_the_binary_changes(tmp_path, flags):
    """A rebuilt binary with another layout is read again: the field names of
    the second trace are those of the new struct, not the cached ones."""
    cache = tmp_path / "cache"
    binary = tmp_path / "prog"
    _compile(PROGRAM % "long a; long b;", binary, *flags)
    _record(tmp_path / "one", [str(binary)], cache)
    first = _names(tmp_path / "one")
    assert b"table[3].b" in first
    _compile(PROGRAM % "long b; long a;", binary, *flags)   # same size, b moved
    os.utime(binary, ns=(os.stat(binary).st_atime_ns, os.stat(binary).st_mtime_ns + 10**9))
    _record(tmp_path / "two", [str(binary)], cache)
    second = _names(tmp_path / "two")
    assert b"table[3].b" in second
    # b is at offset 0 now: the stores at table[i]+0 are named .b, not .a
    rows = json.loads(second)
    assert not any(r["variable"] and r["variable"].endswith(".a") for r in rows)
    assert len([e for e in os.listdir(cache) if e.endswith(".mtc")]) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_cache_entry_is_rebuilt_and_reported(tmp_path, damage):
    cache = tmp_path / "cache"
    argv = [prog("data_globals", "O0-pie")]
    _record(tmp_path / "one", argv, cache)
    (entry,) = [cache / e for e in os.listdir(cache) if e.endswith(".mtc")]
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    elif damage == "flip":
        data[-100] ^= 0xFF
    else:
        data = bytearray(b"not a cache file")
    entry.write_bytes(bytes(data))
    listed = _with_cache(cache, "cache", "list")
    assert b"CORRUPT" in listed.stdout
    run = _record(tmp_path / "two", argv, cache)
    # said once, by whichever reads the entry first: the recording's reading of the
    # debug info while the target runs, or the summary naming the accesses
    summary = _with_cache(cache, "summary", str(tmp_path / "two"))
    assert summary.returncode == 0, summary.stderr
    stderr = run.stderr.decode() + summary.stderr.decode()
    said = [line for line in stderr.splitlines() if "symbol cache" in line]
    assert len(said) == 1 and "corrupt" in said[0] and "rebuilt" in said[0], stderr
    assert _names(tmp_path / "one") == _names(tmp_path / "two")
    header, _ = disk.read_entry(str(entry), dwarf_cache.MAGIC, dwarf_cache.FORMAT)  # intact again
    assert header["path"] == os.path.realpath(argv[0])
    again = _record(tmp_path / "three", argv, cache)
    summary = _with_cache(cache, "summary", str(tmp_path / "three"))
    assert "symbol cache" not in again.stderr.decode() + summary.stderr.decode()


def test_cache_list_and_clear(tmp_path):
    cache = tmp_path / "cache"
    _record(tmp_path / "t", [prog("data_globals", "O0-nopie")], cache)
    listed = json.loads(_with_cache(cache, "cache", "list", "--json").stdout)
    assert [e["binary"] for e in listed["entries"]] == [os.path.realpath(prog("data_globals", "O0-nopie"))]
    assert listed["entries"][0]["ok"]
    # the call-site scans of what --data relocated (libc at least: calls/scan_cache.py)
    assert listed["scans"] and all(e["ok"] for e in listed["scans"])
    cleared = _with_cache(cache, "cache", "clear")
    assert cleared.returncode == 0
    # and the symbol tables of every file it parsed (binary/elfcache.py)
    assert listed["symbol_tables"] and all(e["ok"] for e in listed["symbol_tables"])
    # and the copier's instruction entries of what the hybrid engine copied
    # (data/hybrid/entry_cache.py), each named with its binary
    assert listed["copier_entries"] and all(e["ok"] and e["binary"] for e in listed["copier_entries"])
    # and its function analyses (data/hybrid/analysis_cache.py)
    assert listed["copier_analyses"] and all(e["ok"] and e["binary"] for e in listed["copier_analyses"])
    assert listed["relocated_functions"] and \
        all(e["ok"] and e["binary"] for e in listed["relocated_functions"])
    removed = 1 + len(listed["scans"]) + len(listed["symbol_tables"]) + \
        len(listed["copier_entries"]) + len(listed["copier_analyses"]) + \
        len(listed["relocated_functions"])
    assert f"removed {removed} entries".encode() in cleared.stdout
    assert json.loads(_with_cache(cache, "cache", "list", "--json").stdout) == \
        {"directory": str(cache), "entries": [], "scans": [], "symbol_tables": [],
         "copier_entries": [], "copier_analyses": [], "relocated_functions": []}
    shutil.rmtree(cache)
    assert _with_cache(cache, "cache", "list").returncode == 0


def test_page_protections_match_a_page_dict():
    """The run-based page table against a dict page -> prot, under random
    range sets, drops, single-page edits and queries."""
    from madtrace.data.regions import PAGE, PageProtections
    rng = random.Random(3)
    table, model = PageProtections(), {}
    for _ in range(3000):
        start = rng.randrange(0, 400) * PAGE
        end = start + rng.randrange(1, 40) * PAGE
        op = rng.random()
        if op < 0.35:
            prot = rng.choice((0, 1, 3, 5))
            table.set_range(start, end, prot)
            model.update({p: prot for p in range(start, end, PAGE)})
        elif op < 0.6:
            table.drop_range(start, end)
            for p in range(start, end, PAGE):
                model.pop(p, None)
        elif op < 0.7:
            table[start] = 7
            model[start] = 7
        elif op < 0.8:
            assert table.pop(start, None) == model.pop(start, None)
        else:
            assert table.pages_in(start, end) == sorted(p for p in model if start <= p < end)
            gaps = [p for a, b in table.gaps(start, end) for p in range(a, b, PAGE)]
            assert gaps == [p for p in range(start, end, PAGE) if p not in model]
        assert len(table) == len(model)
    assert dict(table.items()) == model and sorted(table) == sorted(model)
    runs = table.runs()
    assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:]))
    assert not any(a[1] == b[0] and a[2] == b[2] for a, b in zip(runs, runs[1:]))  # joined
