# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace report --kind footprint: Skadu's SlimTV footprints (footprint.c)
equal a naive set-per-call replay, call by call, exactly.

Contract exercised:
  madtrace.analysis.footprint.footprint(DIR, keep_calls=True, chunk_rows=N)
  madtrace.analysis.footprint.FootprintCore (run/finish over event arrays)
  madtrace report DIR --kind footprint [--json] [--png FILE]

Oracle: madtrace.analysis.footprint_naive (a Python set of bytes, lines and
pages per open call, merged into the caller at its end), on real traces
(recursion 200 deep with every level touching the same counters, threads,
the demo) and on random event streams (random nesting, overlapping
addresses, chunk boundaries anywhere).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from madtrace.analysis.footprint import FootprintCore, footprint
from madtrace.analysis.footprint_naive import naive_footprint
from madtrace.trace.replay import EVENT_ACCESS, EVENT_BEGIN, EVENT_DTYPE, EVENT_END
from madtrace.trace.format import ACCESS_DTYPE

from .util import ROOT, madtrace, prog

SHIFTS = (0, 6, 12)


def as_dict(report) -> dict:
    """{tid: {call_id: (incl, self)}} with the thread root as call -1."""
    out = {}
    for tid, rows in report.all_calls.items():
        out[tid] = {int(r["call_id"]): (tuple(map(int, r["incl"])), tuple(map(int, r["self"])))
                    for r in rows}
    for t in report.threads:
        out.setdefault(t["tid"], {})[-1] = (
            tuple(t[f"incl_{g}"] for g in ("bytes", "lines", "pages")),
            tuple(t[f"self_{g}"] for g in ("bytes", "lines", "pages")))
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    base = tmp_path_factory.mktemp("footprint")
    out = {}
    for key, argv in {"recursion": [prog("calls_recursion", "O2-pie"), "12", "201"],
                      "threads": [prog("data_threads", "O0-pie")],
                      "globals": [prog("data_globals", "O0-nopie")],
                      "demo": [f"{ROOT}/build/examples/demo"],
                      "blocks": [prog("data_blocks", "O0-nopie"), "5000"]}.items():
        directory = str(base / key)
        result = madtrace("record", "-q", "--data", "-o", directory, "--", *argv, timeout=300)
        assert result.returncode == 0, result.stderr
        out[key] = directory
    return out


@pytest.mark.parametrize("key", ["recursion", "threads", "globals", "demo", "blocks"])
def test_footprints_equal_the_naive_sets_call_by_call(traces, key):
    directory = traces[key]
    report = footprint(directory, keep_calls=True)
    expected = naive_footprint(directory)
    got = as_dict(report)
    assert got == expected
    assert report.calls == sum(len(calls) - 1 for calls in expected.values()) >= 1
    if key == "threads":
        assert len(expected) == 4           # main and three workers, each its own shadow
    # smaller chunks (threads and calls split anywhere) give the same answer
    assert as_dict(footprint(directory, keep_calls=True, chunk_rows=97)) == expected


def test_block_events_count_in_the_footprint(traces):
    """data_blocks: memset(a, 5000), memcpy(b, a), memmove(b+1, b), write(b) and
    read(a) are block events, not accesses: main's own footprint has both arrays."""
    report = footprint(traces["blocks"])
    main = next(f for f in report.function_rows() if f["function"] == "main")
    assert main["self_bytes_max"] >= 2 * 5000
    assert main["self_pages_max"] >= 4              # 5000 bytes of a and of b: 2 pages each


def test_deep_recursion_footprints(traces):
    """depth_sum(500): 501 nested calls, every level increments the same counter,
    so each call's footprint, inclusive and its own, is that counter's 8 bytes."""
    report = footprint(traces["recursion"], keep_calls=True)
    functions = {f["function"]: f for f in report.function_rows()}
    depth = functions["depth_sum"]
    assert depth["calls"] == 501                                       # the program's count
    assert depth["incl_bytes_max"] == depth["self_bytes_max"] == 8     # n_depth_sum only
    assert depth["incl_bytes_sum"] == depth["self_bytes_sum"] == 8 * 501
    fib = functions["fib"]
    assert fib["incl_bytes_max"] == 8 and fib["incl_pages_max"] == 1


def random_stream(rng: random.Random, n: int):
    events, accesses, stack, next_id = [], [], [], 0
    max_depth = rng.choice([3, 12, 40])
    for _ in range(n):
        r = rng.random()
        if r < 0.15 and len(stack) < max_depth:
            stack.append(next_id)
            events.append((next_id, 0, next_id % 5, len(stack), EVENT_BEGIN))
            next_id += 1
        elif r < 0.3 and stack:
            events.append((stack.pop(), 0, 0, 0, EVENT_END))
        else:
            address = rng.choice([rng.randrange(0, 300), rng.randrange(4000, 4300),
                                  rng.randrange(0, 20000)])
            accesses.append((address, rng.choice([1, 2, 4, 8, 16, 64])))
            events.append((stack[-1] if stack else -1, len(accesses) - 1, 0, len(stack),
                           EVENT_ACCESS))
    while stack:
        events.append((stack.pop(), 0, 0, 0, EVENT_END))
    out = np.zeros(len(events), dtype=EVENT_DTYPE)
    for name, column in zip(("call_id", "ref", "fid", "depth", "type"), zip(*events)):
        out[name] = column
    acc = np.zeros(len(accesses), dtype=ACCESS_DTYPE)
    if accesses:
        acc["addr"], acc["size"] = zip(*accesses)
    return out, acc


def naive_stream(events, accesses) -> dict:
    out, stack = {}, [[-1, [set(), set(), set()], [set(), set(), set()]]]

    def close(frame):
        out[frame[0]] = (tuple(map(len, frame[1])), tuple(map(len, frame[2])))

    for ev in events:
        if ev["type"] == EVENT_BEGIN:
            stack.append([int(ev["call_id"]), [set(), set(), set()], [set(), set(), set()]])
        elif ev["type"] == EVENT_END:
            frame = stack.pop()
            close(frame)
            for parent, child in zip(stack[-1][1], frame[1]):
                parent |= child
        else:
            a = accesses[ev["ref"]]
            first, last = int(a["addr"]), int(a["addr"]) + int(a["size"]) - 1
            for g, shift in enumerate(SHIFTS):
                units = range(first >> shift, (last >> shift) + 1)
                stack[-1][1][g].update(units)
                stack[-1][2][g].update(units)
    close(stack[0])
    return out


def test_random_streams_equal_the_naive_sets():
    core = FootprintCore()
    try:
        for seed in range(300):
            rng = random.Random(seed)
            events, accesses = random_stream(rng, rng.randrange(10, 600))
            core.reset()
            rows, i = [], 0
            while i < len(events):
                j = min(len(events), i + rng.randrange(1, 100))
                rows.append(core.run(events[i:j], accesses, 0))
                i = j
            rest, root = core.finish(0)
            got = {int(r["call_id"]): (tuple(map(int, r["incl"])), tuple(map(int, r["self"])))
                   for r in np.concatenate(rows + [rest])}
            got[-1] = (tuple(map(int, root["incl"])), tuple(map(int, root["self"])))
            assert got == naive_stream(events, accesses), seed
    finally:
        core.close()


def test_report_footprint_cli(traces, tmp_path):
    directory = traces["demo"]
    result = madtrace("report", directory, "--kind", "footprint", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    expected = naive_footprint(directory)
    (tid, calls), = expected.items()
    assert report["calls"] == len(calls) - 1
    thread = report["threads"][0]
    assert (thread["incl_bytes"], thread["incl_lines"], thread["incl_pages"]) == calls[-1][0]
    functions = {f["function"]: f for f in report["functions"]}
    assert functions["blur_row"]["calls"] == 16 and functions["fill"]["incl_bytes_max"] == 1024
    largest = max(incl[0] for call, (incl, _) in calls.items() if call >= 0)
    assert report["top_calls"][0]["incl_bytes"] == largest
    text = madtrace("report", directory, "--kind", "footprint").stdout.decode()
    assert "blur_row" in text and "1024/17/1" in text                 # fill: image[16][64]
    png = tmp_path / "fp.png"
    result = madtrace("report", directory, "--kind", "footprint", "--png", str(png))
    assert result.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
