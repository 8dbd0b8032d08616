# SPDX-License-Identifier: GPL-2.0-or-later
"""report --kind cache, sharing and reuse, against independent oracles.

Contract exercised:
  madtrace record -q -o DIR --data [-f F] -- PROG ARGS
  madtrace report DIR --kind cache [--cache SPEC] | sharing [--line N] | reuse [--line N]
      [--json | --png FILE | --html FILE]
  madtrace.analysis.memory_sim.ReuseDistances

Oracles:
* cache: pycachesim (PyPI), fed with the same access stream (read from the
  trace's raw files, not from the analysis): its misses per level must agree
  within 2%; threads: one pycachesim first level per thread for the private L1;
* sharing: data_sharing.c, whose layout says the answer: pair.left and
  pair.right stored by two threads on one line (false sharing), a counter
  added to under a mutex by both (true), a padded slot per thread (not
  shared: never reported);
* reuse: the distance computed naively (an LRU stack: a line's position in it
  is its distance) on the trace's own per-thread streams and on long random
  streams that make the C side renumber its time slots.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

import numpy as np
import pytest

from madtrace.analysis.access_stream import AccessStream
from madtrace.analysis.memory_sim import ReuseDistances
from madtrace.analysis.reuse import COLD, bucket_of

from .util import madtrace, one_line_error, prog, report_json, run_untraced

cachesim = pytest.importorskip("cachesim", reason="pycachesim (make setup installs it) is the oracle")

SPEC = "L1=4K:4:64,L2=32K:8:64,L3=256K:8:64"
LEVELS = [("L1", 4096, 4), ("L2", 32768, 8), ("L3", 262144, 8)]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    base = tmp_path_factory.mktemp("memory")

    @lru_cache(maxsize=None)
    def record(
        name: str, variant: str, *args: str, functions: tuple[str, ...] = (), data: bool = True
    ) -> str:
        out = str(base / f"{name}-{variant}-{'-'.join(args)}-{data}")
        flags = [x for f in functions for x in ("-f", f)] + (["--data"] if data else [])
        result = madtrace("record", "-q", "-o", out, *flags, "--", prog(name, variant), *args)
        assert result.returncode == 0, result.stderr.decode()
        # the program's own output, the same traced and untraced
        assert result.stdout == run_untraced([prog(name, variant), *args]).stdout
        return out

    return record


def thread_streams(directory: str) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per thread index: its accesses (addr, size, kind) as the raw files hold them."""
    from madtrace.trace.reader import iter_access_chunks

    parts: dict[int, list] = {}
    for tid, chunk in iter_access_chunks(directory):
        parts.setdefault(tid, []).append(chunk)
    out = {}
    for index, tid in enumerate(sorted(parts)):
        rows = np.concatenate(parts[tid])
        out[index] = (rows["addr"].copy(), rows["size"].copy(), rows["kind"].copy())
    return out


def thirty_two_bits(addr: np.ndarray) -> np.ndarray:
    """pycachesim takes 32-bit addresses: each 16 MiB window of the address space
    numbered densely, its low 24 bits kept (every set index of LEVELS with it)."""
    high = addr >> np.uint64(24)
    _, dense = np.unique(high, return_inverse=True)
    assert dense.max() < 256
    return (dense.astype(np.uint64) << np.uint64(24)) | (addr & np.uint64((1 << 24) - 1))


def pycachesim_misses(streams: list[tuple], levels) -> list[int]:
    """The misses per level of pycachesim's hierarchy, fed each stream in turn."""
    from cachesim import Cache, CacheSimulator, MainMemory

    caches, below = [], None
    for name, size, ways in reversed(levels):
        c = Cache(name, size // 64 // ways, ways, 64, "LRU", store_to=below, load_from=below)
        caches.insert(0, c)
        below = c
    memory = MainMemory()
    memory.load_to(caches[-1])
    memory.store_from(caches[-1])
    sim = CacheSimulator(caches[0], memory)
    for addr, size, kind in streams:
        for a, s, k in zip(thirty_two_bits(addr).tolist(), size.tolist(), kind.tolist()):
            (sim.store if k == 2 else sim.load)(a, length=max(s, 1))
    return [c.MISS_count for c in caches]


# -------------------------------------------------------------------- cache
@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_cache_agrees_with_pycachesim(recorded, variant):
    d = recorded("data_kernels", variant, "matmul", "40", functions=("matmul",))
    report = report_json(d, "--kind", "cache", "--cache", SPEC)
    streams = thread_streams(d)
    assert len(streams) == 1
    expected = pycachesim_misses([streams[0]], LEVELS)
    got = [lv["misses"] for lv in report["levels"]]
    assert [lv["name"] for lv in report["levels"]] == ["L1", "L2", "L3"]
    for name, g, e in zip(("L1", "L2", "L3"), got, expected):
        assert e > 100, (name, e)  # the caches are small: every level misses
        assert abs(g - e) <= 0.02 * e, (name, got, expected)
    # the accesses' own misses, attributed: each table adds up to the levels' demand misses
    total = sum(len(s[0]) for s in streams.values())
    assert report["accesses"] == total
    for lv in report["levels"]:
        demand = lv["load_misses"] + lv["store_misses"]
        for table in ("by_data", "by_function", "by_line"):
            assert sum(r["misses"][lv["name"]] for r in report[table]) == demand, table
    assert sum(r["accesses"] for r in report["by_data"]) == total
    matmul = next(r for r in report["by_function"] if r["function"] == "matmul")
    call = next(r for r in report["by_call"] if r["function"] == "matmul")
    assert call["misses"] == matmul["misses"] and call["accesses"] == matmul["accesses"]
    # the blocks per allocation site: the three arrays come from three sites of main
    assert sum(r["misses"]["L1"] for r in report["by_site"]) == sum(
        r["misses"]["L1"] for r in report["by_data"] if r["data"].startswith("<malloc")
    )
    assert len(report["by_site"]) >= 3 and all(
        r["site"].startswith("<malloc@main+") for r in report["by_site"][:3]
    )
    # matmul's three arrays are heap blocks: most misses are theirs
    heap = sum(r["misses"]["L1"] for r in report["by_data"] if r["data"].startswith("<malloc"))
    assert heap > 0.9 * report["levels"][0]["load_misses"]
    assert any(r["file"] and r["file"].endswith("data_kernels.c") for r in report["by_line"])


def test_cache_threads_have_their_own_first_levels(recorded):
    """Private L1 and L2 per thread, a shared L3: with L3 out of the way (one
    level), the misses are those of one pycachesim L1 per thread."""
    d = recorded("data_threads", "O2-pie")
    report = report_json(d, "--kind", "cache", "--cache", "L1=1K:2:64,L2=2K:2:64")
    streams = thread_streams(d)
    assert len(streams) >= 3 and report["threads"] == len(streams)
    expected = sum(pycachesim_misses([s], [("L1", 1024, 2)])[0] for s in streams.values())
    l1 = report["levels"][0]
    assert not l1["shared"] and report["levels"][1]["shared"]
    # the threads' counters share a line: each store there takes the others' copies
    # away, and each copy taken may cost its thread one more miss
    assert l1["invalidations"] > 0
    slack = 0.02 * expected + l1["invalidations"]
    assert abs(l1["misses"] - expected) <= slack, (l1["misses"], expected, l1["invalidations"])


def test_cache_false_sharing_misses_in_exact_order(tmp_path):
    """The fault engine orders threads' accesses as they ran: pair.left and
    pair.right, stored by two threads on one line, miss in the private L1 over
    and over; each padded slot stays in its thread's L1."""
    d = str(tmp_path / "t")
    r = madtrace(
        "record",
        "-q",
        "-o",
        d,
        "--data",
        "--data-engine",
        "fault",
        "-f",
        "left",
        "-f",
        "right",
        "--",
        prog("data_sharing", "O2-pie"),
    )
    assert r.returncode == 0, r.stderr
    report = report_json(d, "--kind", "cache", "--cache", "L1=32K:8:64,L2=256K:8:64,L3=8M:16:64")
    assert report["interleaving"] == "exact"
    by_data = {row["data"]: row for row in report["by_data"]}
    pair = by_data["pair.left"]["misses"]["L1"] + by_data["pair.right"]["misses"]["L1"]
    slots = by_data["slots[0].value"]["misses"]["L1"] + by_data["slots[1].value"]["misses"]["L1"]
    assert report["levels"][0]["invalidations"] >= 100
    assert pair >= 100 and slots <= 4, (pair, slots)


def test_cache_renderings_and_errors(recorded, tmp_path):
    d = recorded("data_kernels", "O0-pie", "matmul", "40", functions=("matmul",))
    text = madtrace("report", d, "--kind", "cache", "--cache", SPEC)
    assert text.returncode == 0, text.stderr
    out = text.stdout.decode()
    for needle in (
        "L1=4K:4:64,L2=32K:8:64,L3=256K:8:64",
        "misses per data",
        "<malloc",
        "misses per function",
        "matmul",
        "misses per source line",
        "data_kernels.c:",
    ):
        assert needle in out, needle
    # the machine's own caches by default, printed
    mine = report_json(d, "--kind", "cache")
    assert mine["spec_from"] == "machine" and mine["levels"][0]["name"] == "L1"
    png = tmp_path / "cache.png"
    assert madtrace("report", d, "--kind", "cache", "--cache", SPEC, "--png", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = tmp_path / "cache.html"
    r = madtrace("report", d, "--kind", "cache", "--cache", SPEC, "--html", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert "L2 misses" in html and "data_kernels.c: its lines with their misses" in html
    for bad, needle in (
        ("L1=4K:4", "is not LEVEL=SIZE:WAYS:LINE"),
        ("L1=4X:4:64", "is not a size"),
        ("L1=4K:4:48", "power of two"),
        ("L1=4K:3:64", "multiple of"),
        ("L1=4K:4:64,L2=64K:8:128", "same line size"),
    ):
        one_line_error(madtrace("report", d, "--kind", "cache", "--cache", bad), 2, needle)
    one_line_error(madtrace("report", d, "--kind", "heatmap", "--cache", SPEC), 2, "--cache is for")


def test_memory_kinds_need_accesses(recorded):
    d = recorded("calls_recursion", "O0-pie", functions=("fib",), data=False)
    for kind in ("cache", "sharing", "reuse"):
        one_line_error(madtrace("report", d, "--kind", kind), 24, "recorded with --data")


# ------------------------------------------------------------------ sharing
def _line_of(report: dict, data: str) -> dict | None:
    found = [r for r in report["lines"] if data in r["data"]]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("variant", ["O2-pie", "O0-nopie"])
def test_sharing_false_true_and_padded(recorded, variant):
    d = recorded("data_sharing", variant, functions=("left", "right"))
    report = report_json(d, "--kind", "sharing")
    assert len(report["threads"]) == 3
    pair = _line_of(report, "pair.left")
    assert pair is not None and pair["kind"] == "false", pair
    assert _line_of(report, "pair.right") is pair
    by_data = {tuple(p["data"]): p for p in pair["per_thread"]}
    assert set(by_data) == {("pair.left",), ("pair.right",)}
    assert by_data[("pair.left",)]["stores"] == 20000 and by_data[("pair.left",)]["bytes"] == "0-7"
    assert by_data[("pair.right",)]["bytes"] == "8-15"
    assert by_data[("pair.left",)]["functions"] == ["left"]
    assert by_data[("pair.right",)]["functions"] == ["right"]
    assert pair["transfers"] >= 1
    counter = _line_of(report, "counter")
    assert counter is not None and counter["kind"] == "true"
    assert {"left", "right"} <= set(counter["functions"])
    assert sum(p["stores"] for p in counter["per_thread"]) == 400
    lock = [r for r in report["lines"] if any(x.startswith("lock") for x in r["data"])]
    assert lock and lock[0]["kind"] == "true"
    # padded per-thread slots: one line each, one thread each: never reported
    assert not any(x.startswith("slots") for r in report["lines"] for x in r["data"])
    assert report["interleaving"] in ("drain", "exact")
    transfers = [r["transfers"] for r in report["lines"]]
    assert transfers == sorted(transfers, reverse=True)
    # 8-byte lines: pair.left and pair.right no longer share one
    narrow = report_json(d, "--kind", "sharing", "--line", "8")
    assert _line_of(narrow, "pair.left") is None and _line_of(narrow, "pair.right") is None
    assert _line_of(narrow, "counter")["kind"] == "true"
    text = madtrace("report", d, "--kind", "sharing").stdout.decode()
    assert "false" in text and "pair.left" in text and "pair.right" in text


def test_sharing_one_thread_and_bad_line(recorded):
    d = recorded("data_kernels", "O0-pie", "matmul", "40", functions=("matmul",))
    report = report_json(d, "--kind", "sharing")
    assert report["lines"] == [] and len(report["threads"]) == 1
    assert "nothing is shared" in madtrace("report", d, "--kind", "sharing").stdout.decode()
    one_line_error(madtrace("report", d, "--kind", "sharing", "--line", "48"), 2, "power of two")
    one_line_error(madtrace("report", d, "--kind", "calls", "--line", "64"), 2, "--line is for")


# -------------------------------------------------------------------- reuse
def naive_distances(lines: list[int]) -> list[int]:
    """Distinct other lines since the previous use (-1: first use): the position
    in an LRU stack."""
    stack: list[int] = []
    out = []
    for line in lines:
        if line in stack:
            i = stack.index(line)
            out.append(i)
            del stack[i]
        else:
            out.append(-1)
        stack.insert(0, line)
    return out


def line_uses(addr, size, shift: int = 6) -> tuple[list[int], list[int]]:
    """Each access's lines as the analysis counts them: its first, and the next
    one when it spans two; with the access index of each use."""
    lines, owner = [], []
    for i, (a, s) in enumerate(zip(addr.tolist(), size.tolist())):
        first, last = a >> shift, (a + max(s, 1) - 1) >> shift
        lines.append(first)
        owner.append(i)
        if last != first:
            lines.append(first + 1)
            owner.append(i)
    return lines, owner


def test_reuse_distances_exact_across_renumbering():
    rng = np.random.default_rng(7)
    # 200k uses of 300 lines: the C side renumbers its time slots three times
    addr = (rng.integers(0, 300, 200_000) * 64 + rng.integers(0, 60, 200_000)).astype(np.uint64)
    size = rng.choice([1, 4, 8], 200_000).astype(np.uint16)
    reuse = ReuseDistances(64)
    first, second = [], []
    for lo in range(0, len(addr), 30_000):  # in chunks, as the analysis feeds it
        f, s = reuse.run(addr[lo : lo + 30_000], size[lo : lo + 30_000])
        first.append(f)
        second.append(s)
    reuse.close()
    f, s = np.concatenate(first), np.concatenate(second)
    got = []
    for a, b in zip(f.tolist(), s.tolist()):
        got.append(a)
        if b != -2:
            got.append(b)
    lines, _ = line_uses(addr, size)
    assert got == naive_distances(lines)


def test_reuse_distances_exact_around_the_recent_lines():
    """The C side keeps the most recent lines in a list of its own (RECENT = 32 in
    memory_sim.c): loops over about as many lines as it holds, and a mix of
    short and long distances, cross its edge both ways."""
    rng = np.random.default_rng(11)
    parts = [np.tile(np.arange(n, dtype=np.uint64), 40) for n in (31, 32, 33, 48)]
    parts.append(rng.integers(0, 40, 30_000).astype(np.uint64))
    parts.append(
        np.where(rng.random(30_000) < 0.9, rng.integers(0, 8, 30_000), rng.integers(0, 2000, 30_000))
    )
    lines = np.concatenate(parts).astype(np.uint64)
    reuse = ReuseDistances(64)
    first, second = reuse.run(lines * np.uint64(64), np.full(len(lines), 8, dtype=np.uint16))
    reuse.close()
    assert (second == -2).all()
    assert first.tolist() == naive_distances(lines.tolist())


def test_reuse_report_matches_naive(recorded):
    d = recorded("data_kernels", "O0-pie", "matmul", "12", functions=("matmul",))
    report = report_json(d, "--kind", "reuse")
    streams = thread_streams(d)
    expected = np.zeros(COLD + 1, dtype=np.int64)
    for addr, size, _kind in streams.values():
        lines, _ = line_uses(addr, size)
        expected += np.bincount(bucket_of(np.array(naive_distances(lines))), minlength=COLD + 1)
    assert report["cold"] == expected[COLD]
    assert report["histogram"] == expected[: len(report["histogram"])].tolist()
    assert not expected[len(report["histogram"]) : COLD].any()
    assert report["uses"] == int(expected.sum())
    assert sum(r["uses"] for r in report["by_data"]) == report["uses"]
    assert sum(r["uses"] for r in report["by_function"]) == report["uses"]
    assert any(r["function"] == "matmul" for r in report["by_function"])
    text = madtrace("report", d, "--kind", "reuse").stdout.decode()
    assert "reuse per data" in text and "cold" in text


def test_bucket_edges():
    d = np.array([-1, 0, 1, 2, 3, 4, 7, 8, (1 << 40) - 1, 1 << 40])
    assert bucket_of(d).tolist() == [COLD, 0, 1, 2, 2, 3, 3, 4, 40, 41]


def test_access_stream_merges_threads_by_order(recorded):
    d = recorded("data_threads", "O2-pie")
    stream = AccessStream(d, "test")
    try:
        orders, threads = [], []
        for chunk in stream.merged():
            orders.append(chunk.columns["order"])
            threads.append(np.broadcast_to(chunk.thread, len(chunk)))
        o = np.concatenate(orders)
        assert (np.diff(o.astype(np.int64)) >= 0).all()
        assert len(o) == sum(len(s[0]) for s in thread_streams(d).values())
        assert len(set(np.concatenate(threads).tolist())) == len(stream.tids)
    finally:
        stream.close()


def test_report_all_has_the_memory_kinds(recorded, tmp_path):
    d = recorded("data_sharing", "O2-pie", functions=("left", "right"))
    r = madtrace("report", d, "--kind", "all", "--json")
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)["reports"]
    assert {"cache", "sharing", "reuse"} <= set(reports)
    page = tmp_path / "all.html"
    assert madtrace("report", d, "--html", str(page)).returncode == 0
    html = page.read_text()
    assert "pair.left" in html and os.path.getsize(page) > 0
