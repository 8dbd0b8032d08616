# SPDX-License-Identifier: GPL-2.0-or-later
"""The reference the footprint analysis is tested and measured against: a set
of units per open call (naive, exact, memory unbounded).

Each open call holds the set of bytes, lines and pages touched while it was
open (``incl``) and those its own instructions touched (``self``); an access
adds its units to the innermost call's two sets; when a call ends its
``incl`` set is merged into its caller's.  The thread itself is the root.
Block events (trace_input.thread_block_ranges) are merged in as the stream
goes: one is applied to the innermost call just before the first event that
comes after it (an access with a higher (seq, order), a call record at
position >= its seq).
Used by tests/test_footprint.py (exact equality with footprint.py, call by
call) and bench/bench_footprint.py (memory); not by madtrace itself.
"""

from __future__ import annotations

from ..trace.format import PAGE_SHIFT
from ..trace.meta import read_meta
from ..trace.segmentation import EVENT_ACCESS, EVENT_BEGIN, EVENT_END, iter_thread_chunks
from .trace_input import thread_block_ranges

SHIFTS = (0, 6, PAGE_SHIFT)


def naive_footprint(directory: str) -> dict[int, dict[int, tuple]]:
    """{tid: {call_id: (incl (bytes, lines, pages), self (...))}}; call_id -1 is
    the thread's root (its whole footprint)."""
    out: dict[int, dict[int, tuple]] = {}
    stack: list[list] = []
    current = None
    blocks = thread_block_ranges(directory, read_meta(directory))
    pending: list = []

    def touch(first: int, last: int) -> None:
        top = stack[-1]
        for g, shift in enumerate(SHIFTS):
            units = range(first >> shift, (last >> shift) + 1)
            top[1][g].update(units)
            top[2][g].update(units)

    def flush(before) -> None:
        """Apply the block ranges that come before position ``before`` (None: all)."""
        while pending and (before is None or pending[0][:2] < before):
            _seq, _order, address, size = pending.pop(0)
            touch(address, address + size - 1)

    def close(frame):
        call_id, incl, own = frame
        out[current][call_id] = (tuple(len(s) for s in incl), tuple(len(s) for s in own))
        return incl

    for chunk in iter_thread_chunks(directory):
        if chunk.tid != current:
            current = chunk.tid
            out[current] = {}
            stack = [[-1, [set(), set(), set()], [set(), set(), set()]]]
            pending = list(blocks.get(current, []))
        events = chunk.events
        for i in range(len(events)):
            ev = events[i]
            kind = int(ev["type"])
            if kind == EVENT_ACCESS:
                acc = chunk.accesses[int(ev["ref"]) - chunk.access_start]
                flush((int(acc["seq"]), int(acc["order"])))
            else:     # a call record at position ref: after the accesses with seq <= ref
                flush((int(ev["ref"]) + 1, -1))
            if kind == EVENT_BEGIN:
                stack.append([int(ev["call_id"]), [set(), set(), set()], [set(), set(), set()]])
            elif kind == EVENT_END:
                if len(stack) > 1 and stack[-1][0] == int(ev["call_id"]):
                    incl = close(stack.pop())
                    for parent, child in zip(stack[-1][1], incl):
                        parent |= child
            elif kind == EVENT_ACCESS:
                first = int(acc["addr"])
                touch(first, first + max(int(acc["size"]), 1) - 1)
        if chunk.last:
            flush(None)
            while len(stack) > 1:
                incl = close(stack.pop())
                for parent, child in zip(stack[-1][1], incl):
                    parent |= child
            close(stack[0])
    return out
