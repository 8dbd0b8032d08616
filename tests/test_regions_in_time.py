# SPDX-License-Identifier: GPL-2.0-or-later
"""An access's region is the mapping it hit when it happened, never the last
memory map's: memory mapped, used and unmapped before the end (a malloc block
large enough that glibc maps it, freed; an anonymous mapping; another one
mapped over part of the same addresses) keeps its own region, in the summary
and in the store alike.

Oracles: the program's own output (the addresses its mmap calls returned)
and the loops' counts (100 and 50 stores, one byte each); the summary's
regions equal the query's."""

from __future__ import annotations

import json

import pytest

from .util import madtrace, prog, summary_json


@pytest.fixture(scope="module", params=["O0-nopie", "O2-pie"])
def remap_trace(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("remap") / "t"
    result = madtrace("record", "-q", "--data", "-o", str(directory), "--",
                      prog("data_remap", request.param), timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    _sum, first, second = result.stdout.decode().split()
    return str(directory), int(first, 16), int(second, 16)


def query(directory: str, sql: str) -> list:
    result = madtrace("query", directory, sql, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_unmapped_memory_keeps_the_region_it_had(remap_trace):
    directory, first, second = remap_trace
    regions = {r["region"]: r for r in summary_json(directory)["regions"]}
    assert "unmapped" not in regions and "(unmapped)" not in regions, sorted(regions)
    # the two mappings at overlapping addresses: each its own stores
    assert regions[f"[anon {first:#x}]"]["stores"] == 100
    assert regions[f"[anon {second:#x}]"]["stores"] == 50
    stored = query(directory, "SELECT region, count(*) AS n, sum(size) AS bytes FROM accesses "
                   f"WHERE addr >= {first} AND addr < {first + (1 << 17)} GROUP BY 1")
    assert {r["region"]: (r["n"], r["bytes"]) for r in stored} == {
        f"[anon {first:#x}]": (100, 100), f"[anon {second:#x}]": (50, 50)}


def test_a_mapped_malloc_block_is_named_in_its_mapping(remap_trace):
    directory = remap_trace[0]
    big, = query(directory, f"SELECT id, address FROM allocations WHERE size = {1 << 20}")
    rows = query(directory, "SELECT region, count(*) AS n, min(addr) AS lo FROM accesses "
                 f"WHERE block = {big['id']} GROUP BY 1")
    assert len(rows) == 1 and rows[0]["n"] >= 1000, rows
    start = int(rows[0]["region"].removeprefix("[anon ").rstrip("]"), 16)
    # the mapping glibc made for it: the block starts a chunk header into it
    assert start <= big["address"] < start + 4096


def test_the_heat_map_counts_each_access_once(remap_trace):
    """Its totals are the accesses (a load and a store spanning two pages among
    them), as the summary counts them; its pages count a straddler on each."""
    directory = remap_trace[0]
    summary = summary_json(directory)
    loads = sum(c["L"] for c in summary["accesses"].values())
    stores = sum(c["S"] for c in summary["accesses"].values())
    result = madtrace("report", directory, "--kind", "heatmap", "--json")
    assert result.returncode == 0, result.stderr.decode()
    heat = json.loads(result.stdout)
    assert (heat["loads"], heat["stores"]) == (loads, stores)
    per_page = sum(r["loads"] + r["stores"] for r in heat["regions"])
    assert per_page >= loads + stores + 2          # the two straddlers, twice each


def test_summary_and_store_count_the_regions_alike(remap_trace):
    directory = remap_trace[0]
    summary = {r["region"]: (r["loads"], r["stores"], r["bytes"])
               for r in summary_json(directory)["regions"]}
    stored = {r["region"]: (r["loads"], r["stores"], r["bytes"]) for r in query(
        directory, "SELECT region, count(*) FILTER (WHERE kind = 'L') AS loads, "
        "count(*) FILTER (WHERE kind = 'S') AS stores, sum(size) AS bytes FROM accesses "
        "GROUP BY 1")}
    assert summary == stored
