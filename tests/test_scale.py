"""Issue 15: per-event costs flat in program size, the symbol/DWARF cache,
bounded tracer memory, progress."""

import bisect
import random

import numpy as np

from madtrace.capture.block_index import BlockIndex


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
    for step in range(30000):
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
