# SPDX-License-Identifier: GPL-2.0-or-later
"""The summary's counts of a trace without call records (trace/access_counts.py):
the blocks of each thread's data file counted by several threads side by side,
each with its own namer, the rows added up by name.

Oracle: the same files counted one block after the other by one namer
(CompactReader.count, the order carried from block to block), added up by
name, region and heap block: the same loads, stores, bytes and accesses after
free, whatever the number of counting threads, and when blocks that do not
start with their order marker (as an older madtrace wrote) make the counters
wait for the block before them."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

from madtrace.trace import access_counts
from madtrace.trace.access_names import AccessDimensions
from madtrace.trace.allocator_calls import AllocatorCalls
from madtrace.trace.compact import DATA_SUFFIX, compact_reader, iter_raw_blocks
from madtrace.trace.naming import AccessNamer
from madtrace.trace.record_files import ACCESS_RECORDS

from .util import madtrace, prog


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Four threads allocating, copying and freeing each other's blocks."""
    directory = str(tmp_path_factory.mktemp("counts") / "t")
    result = madtrace("record", "-q", "--data", "--no-functions", "-o", directory, "--",
                      prog("hooks_threads", "O2-nopie"), "400", "4", timeout=300)
    assert result.returncode == 0, result.stderr
    return directory


def by_name(data: dict, counts: np.ndarray) -> dict:
    out: dict = collections.defaultdict(lambda: np.zeros(4, dtype=np.int64))
    for i, key in enumerate(zip(data["symbol"], data["region"], data["block"])):
        out[key] += counts[i]
    return {key: value.tolist() for key, value in out.items()}


def one_after_the_other(directory: str) -> dict:
    dimensions = AccessDimensions(AccessNamer(directory), whole_objects=True)
    allocator = AllocatorCalls.load(directory)
    try:
        for tid, path in ACCESS_RECORDS.files(directory):
            assert path.endswith(DATA_SUFFIX)
            compact_reader(path).count(dimensions.ids, allocator.spans(tid))
        return by_name(dimensions.new_data(), dimensions.counts())
    finally:
        dimensions.close()


def test_blocks_counted_side_by_side_add_up_to_the_pass_in_order(trace, monkeypatch):
    files = ACCESS_RECORDS.files(trace)
    sizes = [n for _, path in files for _offset, _raw, n, _planes in iter_raw_blocks(path)]
    blocks, records = len(sizes), sum(sizes)
    assert len(files) >= 4 and blocks >= 2 * len(files), (len(files), blocks)
    expected = one_after_the_other(trace)
    assert any(block for _, _, block in expected) and any(v[3] for v in expected.values())
    for counters in (1, 2, 3):
        monkeypatch.setattr(access_counts, "COUNTERS", counters)
        done: list[int] = []
        totals = access_counts.access_totals(trace, done.append)
        assert by_name(totals.data, totals.counts) == expected, counters
        assert done == sorted(done) and done[-1] == records     # every block's records, once
        assert len(set(totals.data["did"])) == len(totals.data["did"])


def test_blocks_without_their_order_marker_wait_for_the_one_before(trace, tmp_path,
                                                                    monkeypatch):
    """A copy of the trace whose every other block lost its leading markers (its
    accesses then take their orders on from the block before, as an older
    madtrace's blocks did): counted side by side, it adds up to the pass in
    order over the same copy.  Counted as if those blocks began afresh, it does
    not (the allocator's own accesses to the chunks it frees fall outside its
    calls then): the fallback is what makes it right."""
    import shutil

    from madtrace.trace.compact import MARK_ORDER, MARK_SEQ, encode_block, iter_blocks
    from madtrace.trace.record_files import COMPACT_RECORDS

    copy = str(tmp_path / "t")
    shutil.copytree(trace, copy)
    stripped = 0
    for _tid, path in ACCESS_RECORDS.files(copy):
        blocks = [records for _offset, records in iter_blocks(path)]
        os.unlink(path)
        fd = COMPACT_RECORDS.create(path)
        try:
            for i, records in enumerate(blocks):
                if i % 2:
                    lead = 0
                    while lead < len(records) and records["id"][lead] == 0 and \
                            records["b"][lead] in (MARK_SEQ, MARK_ORDER):
                        lead += 1
                    stripped += lead > 0
                    records = records[lead:]
                    assert not access_counts._starts_with_order(records.tobytes(), len(records),
                                                                False) or not len(records)
                COMPACT_RECORDS.container().append_payload(fd, encode_block(records))
        finally:
            os.close(fd)
    assert stripped >= 2
    expected = one_after_the_other(copy)
    monkeypatch.setattr(access_counts, "COUNTERS", 2)
    totals = access_counts.access_totals(copy)
    assert by_name(totals.data, totals.counts) == expected
    monkeypatch.setattr(access_counts, "_starts_with_order", lambda raw, n, planes: True)
    afresh = access_counts.access_totals(copy)
    assert by_name(afresh.data, afresh.counts) != expected
