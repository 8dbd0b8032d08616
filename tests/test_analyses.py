# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace report --kind heatmap|alloc|numa|source and the PNG/HTML outputs.

Contract exercised:
  madtrace record --data -o DIR -- PROG
  madtrace report DIR --kind KIND [--json] [--png FILE] [--html FILE] [--force]
                  [--topology FILE]

Oracles: valgrind lackey: per page (the heat map of the executable's
.data/.bss), per instruction placed on source lines by binutils' addr2line
(the HTML annotation); valgrind memcheck (the use after free: its
instruction and offset); the programs' structure (data_alloc: a block never
touched, K stores and K loads; data_numa: which thread, bound where, touches
which array N times); nm (where variables are); a naive recount of the raw
access files (per-page counts of the heat map).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from functools import lru_cache
from html.parser import HTMLParser

import numpy as np
import pytest

from madtrace.binary.elf import ElfImage
from madtrace.report import png
from madtrace.trace.events import load_allocations

from .util import madtrace, one_line_error, prog, report_json

SHIFT = 12


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """recorded(name, variant, *options) -> (trace directory, stdout), once per module."""
    base = tmp_path_factory.mktemp("analyses")

    @lru_cache(maxsize=None)
    def record(name: str, variant: str, *options: str) -> tuple[str, str]:
        out = str(base / f"{name}-{variant}{''.join(options)}")
        result = madtrace("record", "-q", "--data", "-o", out, *options, "--",
                          prog(name, variant), timeout=300)
        if result.returncode == 77:
            pytest.skip(result.stderr.decode().strip())
        assert result.returncode == 0, result.stderr
        return out, result.stdout.decode()
    return record


def raw_accesses(directory: str) -> np.ndarray:
    """Every access row of the trace (either engine's files)."""
    from madtrace.trace.reader import iter_access_chunks
    return np.concatenate([chunk for _, chunk in iter_access_chunks(directory)])


def symbol_address(path: str, name: str) -> int:
    for line in subprocess.run(["nm", path], capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise KeyError(name)


@lru_cache(maxsize=None)
def lackey_log(path: str) -> str:
    """valgrind lackey --trace-mem=yes of one run of ``path`` (non-PIE: same addresses)."""
    return subprocess.run(["valgrind", "--tool=lackey", "--trace-mem=yes", "--log-fd=2", path],
                          capture_output=True, text=True, timeout=300).stderr


def data_ranges(path: str) -> list[tuple[int, int]]:
    return [(s.address, s.address + s.size) for s in ElfImage.load(path).sections
            if s.name in (".data", ".bss") and s.size]


# ------------------------------------------------------------------ heatmap
def test_heatmap_counts_every_page_and_png_shows_them(recorded, tmp_path):
    directory, _ = recorded("data_globals", "O0-nopie")
    report = report_json(directory, "--kind", "heatmap")
    # naive recount of the raw access files: accesses per page (both pages of a straddler)
    acc = raw_accesses(directory)
    expected: dict[int, list[int]] = {}
    for a in acc:
        first, last = int(a["addr"]) >> SHIFT, (int(a["addr"]) + int(a["size"]) - 1) >> SHIFT
        for page in {first, last}:
            expected.setdefault(page, [0, 0])[int(a["kind"]) - 1] += 1
    got: dict[int, list[int]] = {}
    for region in report["regions"]:
        for address, loads, stores, _blocks in region.get("touched", []):
            entry = got.setdefault(address >> SHIFT, [0, 0])
            entry[0] += loads
            entry[1] += stores
    assert got == {p: c for p, c in expected.items() if c != [0, 0]}
    # the report's totals count each access once (its pages count a straddler on each)
    assert (report["loads"], report["stores"]) == (int((acc["kind"] == 1).sum()),
                                                   int((acc["kind"] == 2).sum()))
    labels = [r["label"] for r in report["regions"]]
    exe = os.path.basename(prog("data_globals", "O0-nopie"))
    assert f".bss of {exe}" in labels and "[stack]" in labels
    assert [r["start"] for r in report["regions"]] == sorted(r["start"] for r in report["regions"])
    bss = next(r for r in report["regions"] if r["label"] == f".bss of {exe}")
    values = symbol_address(prog("data_globals", "O0-nopie"), "values")
    page_row = next(t for t in bss["touched"] if t[0] == values & ~0xFFF)
    assert page_row[1] >= 200 and page_row[2] >= 200        # fill() stores, sum() loads
    assert not next(r for r in report["regions"] if r["label"] == "[stack]")["traced"]
    # lackey, every instruction (libc's too), to the executable's .data/.bss: per page the
    # same loads and stores as the heat map's rows of those regions
    lackey_pages: dict[int, list[int]] = {}
    ranges = data_ranges(prog("data_globals", "O0-nopie"))
    for line in lackey_log(prog("data_globals", "O0-nopie")).splitlines():
        if len(line) > 3 and line[0] == " " and line[1] in "LSM":
            address, size = (int(x, 16) if i == 0 else int(x)
                             for i, x in enumerate(line[3:].split(",")))
            if any(lo <= address < hi for lo, hi in ranges):
                for kind in ("LS" if line[1] == "M" else line[1]):
                    for page in {address >> SHIFT, (address + size - 1) >> SHIFT}:
                        lackey_pages.setdefault(page, [0, 0])[kind == "S"] += 1
    ours: dict[int, list[int]] = {}
    for region in report["regions"]:
        if region["label"] in (f".data of {exe}", f".bss of {exe}"):
            for address, loads, stores, _blocks in region["touched"]:
                entry = ours.setdefault(address >> SHIFT, [0, 0])
                entry[0] += loads
                entry[1] += stores
    assert ours == lackey_pages

    # the picture: expected size, the values[] cell coloured, untraced cells grey
    out = tmp_path / "heat.png"
    result = madtrace("report", directory, "--kind", "heatmap", "--png", str(out))
    assert result.returncode == 0, result.stderr
    from madtrace.analysis.heatmap import heatmap
    model = heatmap(directory)
    boxes, height = png.layout(model)
    from PIL import Image
    image = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert image.shape == (height, png.WIDTH, 3)
    index = [r.label for r in model.regions].index(f".bss of {exe}")
    region = model.regions[index]
    x, y = png.cell_origin(boxes[index], ((values & ~0xFFF) - region.first_page) >> SHIFT)
    r, g, b = image[y + 3, x + 3]
    assert not (r == g == b), "an accessed page is drawn in colour"
    assert r > b + 40                                       # YlOrRd: red/orange, not blue
    stack = [r.label for r in model.regions].index("[stack]")
    x, y = png.cell_origin(boxes[stack], 0)
    grey = tuple(round(255 * c) for c in png.GREY)
    assert tuple(image[y + 3, x + 3]) == pytest.approx(grey, abs=2)
    heap = [r.label for r in model.regions].index("[heap]")
    untouched = next(k for k, v in enumerate(model.regions[heap].cell_values()) if v == 0)
    x, y = png.cell_origin(boxes[heap], untouched)
    assert tuple(image[y + 3, x + 3]) == pytest.approx(tuple(round(255 * c) for c in png.UNTOUCHED),
                                                       abs=2)


# -------------------------------------------------------------------- alloc
def memcheck_invalid_read(path: str) -> tuple[str, int, int]:
    """(function, offset in the block, block size) of memcheck's first invalid read."""
    r = subprocess.run(["valgrind", "--tool=memcheck", path], capture_output=True, text=True,
                       timeout=120)
    text = r.stderr
    at = re.search(r"Invalid read of size \d+\n==\d+==\s+at 0x[0-9A-F]+: (\w+)", text)
    inside = re.search(r"Address 0x[0-9a-f]+ is (\d+) bytes inside a block of size (\d+) free'd",
                       text)
    assert at and inside, text
    return at.group(1), int(inside.group(1)), int(inside.group(2))


def test_alloc_blocks_sites_untouched_and_use_after_free(recorded):
    path = prog("data_alloc", "O0-nopie")
    directory, stdout = recorded("data_alloc", "O0-nopie")
    assert stdout.startswith("s=600 ")
    report = report_json(directory, "--kind", "alloc")
    blocks = {b["id"]: b for b in report["blocks"]}
    main = [b for b in report["blocks"] if b["site"].startswith("main+")]
    never, kept, gone, zeroed = main[0], main[1], main[2], main[3]   # allocation order
    assert (never["kind"], never["size"], kept["size"], gone["size"]) == ("malloc", 40, 128, 64)
    assert zeroed["kind"] == "calloc"
    assert never["id"] in report["untouched"] and not never["touched"]
    assert (kept["loads"], kept["stores"], kept["bytes"]) == (16, 16, 256)
    assert kept["freed_accesses"] == 0 and kept["id"] not in report["untouched"]
    # the use after free: as memcheck sees it
    function, offset, size = memcheck_invalid_read(path)
    assert report["use_after_free"] == [gone["id"]]
    assert gone["freed_accesses"] == 1 and gone["size"] == size
    first = gone["first_freed_access"]
    assert first["instruction"].startswith(function + "+") and first["offset"] == offset
    # sites add their blocks up
    for site in report["sites"]:
        members = [b for b in blocks.values() if b["site"] == site["site"]
                   and b.get("part_of") is None]
        assert site["blocks"] == len(members)
        assert site["loads"] == sum(b["loads"] for b in members)
        assert site["untouched_blocks"] == sum(not b["touched"] for b in members)
    text = madtrace("report", directory, "--kind", "alloc").stdout.decode()
    assert f"use after free: {gone['name']}: 1 accesses, first by {function}+" in text
    assert "never touched" in text and never["name"] in text


@pytest.mark.parametrize("variant", ["O0-pie", "O2-nopie"])
def test_walk_then_free_names_live_blocks_and_no_false_use_after_free(tmp_path, variant):
    """A correct program walks a list of malloc'd nodes, then frees them all:
    the walk's accesses are named <malloc...> (the block's name when they
    happened) in MadT text, SQL and Chrome; the allocator's own accesses to
    freed chunks (free() keeping its lists) are told apart, never a use after
    free; memcheck agrees that the program has none."""
    from madtrace.trace.query import connect
    path = prog("list_walk", variant)
    memcheck = subprocess.run(["valgrind", "--tool=memcheck", "--error-exitcode=9", path, "300", "2"],
                              capture_output=True, text=True, timeout=120)
    assert memcheck.returncode == 0 and "Invalid read" not in memcheck.stderr
    directory = str(tmp_path / "t")
    result = madtrace("record", "-q", "--data", "-f", "traverse", "-o", directory, "--",
                      path, "300", "2", timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == memcheck.stdout.encode()
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    assert meta["data_tracing"]["freed_accesses"] == 0
    assert meta["data_tracing"]["allocator_freed_accesses"] > 0
    report = report_json(directory, "--kind", "alloc")
    assert report["use_after_free"] == [] and report["totals"]["use_after_free_blocks"] == 0
    assert report["totals"]["allocator_accesses"] > 0
    text = madtrace("report", directory, "--kind", "alloc").stdout.decode()
    assert "0 used after free" in text and "use after free:" not in text
    # SQL: the walk names live blocks; every access to a freed block is the allocator's
    con = connect(directory)
    walk = con.execute("SELECT count(*), count(*) FILTER (WHERE symbol LIKE '<malloc%') "
                       "FROM accesses WHERE function = 'traverse'").fetchone()
    assert walk == (2 * 2 * 300, 2 * 2 * 300)
    assert con.execute("SELECT count(*) FROM accesses WHERE freed AND NOT allocator").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM accesses WHERE freed AND allocator").fetchone()[0] > 0
    # MadT text: the walk's lines carry <malloc...> names, as the program saw them
    madt = madtrace("export", directory, "--format", "madt").stdout.decode().splitlines()
    walk_lines = [line for line in madt if line[0] in "LS" and ",traverse+" in line]
    assert len(walk_lines) == 2 * 2 * 300
    assert all("<malloc" in line and "<freed:" not in line for line in walk_lines)
    # Chrome: the accesses of the walk's calls are named the same way
    chrome = tmp_path / "t.json"
    assert madtrace("export", directory, "--format", "chrome", "-o", str(chrome)).returncode == 0
    names = [e["name"] for e in json.loads(chrome.read_text())["traceEvents"]
             if e.get("ph") == "i" and e["args"].get("instruction", "").startswith("traverse+")]
    assert len(names) == 2 * 2 * 300 and all(n.startswith("<malloc") for n in names)


def test_alloc_heap_blocks_of_matmul(recorded):
    """data_heap: a and b are read n^3 times by matmul and written n^2 times by main."""
    directory, _ = recorded("data_heap", "O0-nopie")
    report = report_json(directory, "--kind", "alloc")
    main_blocks = [b for b in report["blocks"] if b["site"].startswith("main+")]
    a, b, c = main_blocks[:3]
    assert (a["loads"], a["stores"]) == (512, 64) and (b["loads"], b["stores"]) == (512, 64)
    assert (a["bytes_stored"], a["bytes_loaded"]) == (512, 4096)
    assert c["stores"] == 64 and c["bytes_stored"] == 512
    nodes = [x for x in report["blocks"] if x["site"].startswith("build_list+")]
    assert len(nodes) == 50 and all(x["stores"] == 2 and x["loads"] == 2 for x in nodes)


# --------------------------------------------------------------------- numa
def test_numa_one_node_machine_is_all_local(recorded):
    directory, stdout = recorded("data_numa", "O0-pie")
    native = subprocess.run([prog("data_numa", "O0-pie")], capture_output=True, timeout=60)
    assert stdout.encode() == native.stdout      # its sched_getaffinity saw its own mask
    with open(os.path.join(directory, "data", "numa.json")) as f:
        recorded_numa = json.load(f)
    nodes = {int(n): c for n, c in recorded_numa["nodes"].items()}
    report = report_json(directory, "--kind", "numa")
    t = report["totals"]
    acc = raw_accesses(directory)
    assert t["first_touch"] == t["pages"] == len(np.unique(acc["addr"] >> np.uint64(SHIFT)))
    # u (the third array) was unmapped before the end: its pages were observed then
    u = [b for b in load_allocations(directory) if b["kind"] == "memmap"][2]
    observed = {start + k * 4096 for _order, start, count, _node in recorded_numa["pages"]
                for k in range(count)}
    assert all(u["address"] + k * 4096 in observed for k in range(4))
    if len(nodes) == 1:
        assert t["unknown_node"] == 0
        assert t["local"] == t["accesses"] == len(raw_accesses(directory))
        assert t["remote"] == t["unpinned_page"] == t["unpinned_thread"] == t["unpinned_both"] == 0
    # bindings: the threads that bound themselves are seen with their own CPU
    masks = sorted(events[-1][1] for events in recorded_numa["threads"].values())
    assert [0] in masks and [1] in masks


N = 4096


def test_numa_metrics_with_a_simulated_two_node_topology(recorded, tmp_path):
    """CPU 0 = node 0, CPU 1 = node 1, first-touch placement: every access of the
    six phases lands where the program's structure says (module docstring of
    tests/progs/data_numa.c)."""
    directory, _ = recorded("data_numa", "O0-pie")
    topology = tmp_path / "topo.json"
    topology.write_text(json.dumps({"nodes": {"0": [0], "1": [1]}, "policy": "first-touch"}))
    report = report_json(directory, "--kind", "numa", "--topology", str(topology))
    arrays = [b["site"] for b in load_allocations(directory) if b["kind"] == "memmap"][:3]
    site = {s["site"]: s for s in report["allocation_sites"]}
    a, b, u = (site[s] for s in arrays)
    zero = dict.fromkeys(("local", "remote", "unpinned_page", "unpinned_thread",
                          "unpinned_both", "unknown_node"), 0)
    assert {k: a[k] for k in zero} == dict(zero, local=N, unpinned_thread=N)   # fill_a, sum_a
    assert {k: b[k] for k in zero} == dict(zero, local=N, remote=N)            # fill_b, sum_b
    assert {k: u[k] for k in zero} == dict(zero, unpinned_both=N, unpinned_page=N)
    assert (a["first_touch"], a["unpinned_first_touch"]) == (4, 0)
    assert (u["first_touch"], u["unpinned_first_touch"]) == (4, 4)
    sites = {s["site"].split("+")[0]: s for s in report["access_sites"]
             if s["site"].split("+")[0] in ("sum_a", "sum_b", "sum_u", "fill_u")
             and s["accesses"] == N}
    assert sites["sum_b"]["remote"] == N and sites["sum_a"]["unpinned_thread"] == N
    assert sites["sum_u"]["unpinned_page"] == N and sites["fill_u"]["unpinned_both"] == N
    # a page range bound explicitly to node 1 turns fill_a's and sum_a's accesses around
    first = next(b for b in load_allocations(directory) if b["kind"] == "memmap")
    topology.write_text(json.dumps({"nodes": {"0": [0], "1": [1]},
                                    "pages": [[hex(first["address"]),
                                               hex(first["address"] + first["size"]), 1]]}))
    report = report_json(directory, "--kind", "numa", "--topology", str(topology))
    a = {s["site"]: s for s in report["allocation_sites"]}[arrays[0]]
    assert (a["remote"], a["local"], a["unpinned_thread"]) == (N, 0, N)


# ------------------------------------------------------------ source + HTML
def lackey_lines(path: str, data_ranges) -> dict[int, list[int]]:
    """{line: [loads, stores, bytes]} of the executable's own instructions, from
    lackey (per instruction) and addr2line (instruction -> line)."""
    image = ElfImage.load(path)
    text = image.section(".text")
    log = lackey_log(path)
    per_insn: dict[int, list[int]] = {}
    current = None
    for line in log.splitlines():
        if line.startswith("I "):
            address = int(line[3:].split(",")[0], 16)
            current = address if text.address <= address < text.address + text.size else None
        elif current is not None and len(line) > 3 and line[0] == " " and line[1] in "LSM":
            address, size = line[3:].split(",")
            if any(lo <= int(address, 16) < hi for lo, hi in data_ranges):
                row = per_insn.setdefault(current, [0, 0, 0])
                for kind in ("LS" if line[1] == "M" else line[1]):
                    row[0 if kind == "L" else 1] += 1
                    row[2] += int(size)
    lines: dict[int, list[int]] = {}
    addresses = sorted(per_insn)
    where = subprocess.run(["addr2line", "-e", path] + [hex(a) for a in addresses],
                           capture_output=True, text=True).stdout.split("\n")
    for address, location in zip(addresses, where):
        if location.split(":")[1].startswith("?"):
            continue        # no line (crtstuff.c): madtrace lists those per function
        number = int(location.split(":")[1].split()[0])
        row = lines.setdefault(number, [0, 0, 0])
        for k in range(3):
            row[k] += per_insn[address][k]
    return lines


class Rows(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows = []
        self.images = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "src" in (attrs.get("class") or "").split():
            self.rows.append(attrs)
        elif tag == "canvas" or (tag == "script" and attrs.get("class") == "hm-data"):
            self.images.append(attrs)       # the heat map: a canvas the page draws from its data


def test_html_annotates_source_lines_as_lackey_and_addr2line_do(recorded, tmp_path):
    path = prog("data_globals", "O0-nopie")
    directory, _ = recorded("data_globals", "O0-nopie")
    out = tmp_path / "report.html"
    result = madtrace("report", directory, "--html", str(out))
    assert result.returncode == 0, result.stderr
    parser = Rows()
    parser.feed(out.read_text())
    source = os.path.realpath(os.path.join(os.path.dirname(__file__), "progs", "data_globals.c"))
    got = {int(r["data-line"]): [int(r["data-loads"]), int(r["data-stores"]), int(r["data-bytes"])]
           for r in parser.rows if os.path.realpath(r["data-file"]) == source}
    assert got == lackey_lines(path, data_ranges(path))
    store_line = 1 + open(source).read().splitlines().index(
        "    for (int i = 0; i < N; i++) values[i] = i * 3;")
    assert got[store_line] == [0, 200, 800]
    assert [a.get("class") for a in parser.images] == ["hm-canvas", "hm-data"]
    # the same numbers in --kind source --json
    report = report_json(directory, "--kind", "source")
    entry = next(f for f in report["files"] if os.path.realpath(f["path"]) == source)
    assert {x["line"]: [x["loads"], x["stores"], x["bytes"]] for x in entry["lines"]} == got


# -------------------------------------------------------------------- errors
def test_report_errors_are_one_line_with_distinct_codes(recorded, tmp_path):
    directory, _ = recorded("data_globals", "O0-nopie")
    calls_only = str(tmp_path / "calls-only")
    result = madtrace("record", "-q", "-o", calls_only, "--", prog("data_globals", "O0-nopie"))
    assert result.returncode == 0, result.stderr
    for kind in ("heatmap", "alloc", "numa", "source", "footprint"):
        one_line_error(madtrace("report", calls_only, "--kind", kind), 24, "--data")
    no_functions = str(tmp_path / "data-only")
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", no_functions, "--",
                      prog("data_globals", "O0-nopie"))
    assert result.returncode == 0, result.stderr
    one_line_error(madtrace("report", no_functions, "--kind", "footprint"), 24, "function tracing")
    os.unlink(os.path.join(no_functions, "data", "numa.json"))
    one_line_error(madtrace("report", no_functions, "--kind", "numa"), 24, "numa.json")
    existing = tmp_path / "exists.png"
    existing.write_bytes(b"x")
    one_line_error(madtrace("report", directory, "--kind", "heatmap", "--png", str(existing)), 17,
                   "--force")
    assert existing.read_bytes() == b"x"
    one_line_error(madtrace("report", directory, "--kind", "numa", "--png", str(tmp_path / "n.png")),
                   2, "no picture")
    one_line_error(madtrace("report", directory, "--kind", "numa", "--topology",
                            str(tmp_path / "missing.json")), 2, "no such file")
    (tmp_path / "bad.json").write_text('{"nodes": {"0": [0]}, "pages": [[0, 4096, 3]]}')
    one_line_error(madtrace("report", directory, "--kind", "numa", "--topology",
                            str(tmp_path / "bad.json")), 2, "node not in")
    one_line_error(madtrace("report", str(tmp_path / "nothing"), "--kind", "heatmap"), 18, "")
    one_line_error(madtrace("report", directory, "--kind", "alloc", "--html",
                            str(tmp_path / "no" / "such" / "dir.html")), 23, "no such directory")


@pytest.mark.parametrize("name, variant, options", [
    ("data_alloc", "O0-nopie", ()), ("data_alloc", "O0-nopie", ("--no-functions",)),
    ("data_globals", "O2-pie", ("--no-functions",))])
def test_summary_totals_equal_the_store(recorded, name, variant, options):
    """The summary counts straight from the raw capture (one C pass, a variable
    counted as a whole); the store names each access on its own: per region,
    per variable and per heap block (with its accesses after free, the
    allocator's own left out) both say the same numbers, with call records (the
    accesses counted as the segmentation gives them) and without (counted as
    the capture's blocks are decoded)."""
    from madtrace.trace.query import connect
    directory, _ = recorded(name, variant, *options)
    result = madtrace("summary", "--json", directory)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    con = connect(directory)
    regions = {r: [lo, st, b] for r, lo, st, b in con.execute(
        "SELECT region, count(*) FILTER (kind = 'L'), count(*) FILTER (kind = 'S'), sum(size) "
        "FROM accesses GROUP BY region").fetchall()}
    assert {r["region"]: [r["loads"], r["stores"], r["bytes"]] for r in summary["regions"]} == regions
    variables = dict(con.execute(
        "SELECT symbol, count(*) FROM accesses WHERE block = 0 AND symbol IS NOT NULL "
        "GROUP BY symbol").fetchall())
    assert summary["top_variables"], summary
    for v in summary["top_variables"]:
        assert v["accesses"] == variables[v["name"]], v
    blocks = {b: (n, after) for b, n, after in con.execute(
        "SELECT block, count(*), count(*) FILTER (freed AND NOT allocator) FROM accesses "
        "WHERE block > 0 GROUP BY block").fetchall()}
    for b in summary["top_blocks"]:
        assert (b["accesses"], b["after_free"]) == blocks[b["id"]], b
    if name == "data_alloc":
        assert any(b["after_free"] for b in summary["top_blocks"])     # the use after free
