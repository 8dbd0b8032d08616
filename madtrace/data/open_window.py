# SPDX-License-Identifier: GPL-2.0-or-later
"""Traced pages opened for one thread's call while the other threads run.

A system call on traced memory that cannot go through the alias
(data_syscalls.py) and a hooked memcpy/memmove/memset (block_events.py) open
the pages for the call.  Meanwhile no slot of the fault path (datastubs.py)
may hold a copy of an operand on them: the C loop redirects a fault to a
slot whose bytes are written back at the tracer's next stop, which is right
only while the page stays protected (the thread's later accesses fault
first).  On an open page the thread goes on directly, and that write-back
came after its own later accesses, undoing them: a stale store
(blocked_detach's pthread_mutex_lock "__owner == 0" assertion).  So the
loop's table of protected pages leaves the open pages out (a fault on one,
taken before it opened and reported after, goes to the slow path, which
runs it on the memory itself), and slots are written back, and threads in a
stub moved out, before a page opens.
"""

from __future__ import annotations

from ..process.remote_syscall import RemoteSyscalls
from ..trace.format import PAGE


def held_open(engine) -> set[int]:
    """Pages open for some thread's running system call or memcpy/memset."""
    return engine.syscalls.held_open() | engine.blocks.held_open()


def open_window(engine, tid: int, pages, registry: dict) -> None:
    """Open ``pages`` for thread ``tid``'s call while the other threads may run;
    ``registry[tid] = pages`` (held_open) until the caller closes them.  Slots
    whose stub ran are written back first; threads still in a stub are stopped
    and moved out of it (its instruction runs again, natively or faulting
    anew), as at disarm."""
    held: list[int] = []
    area = engine.area
    if area is not None and not area.loop.closed and len(engine.tracee.threads) > 1:
        area.loop.flush()
        if area.copies_out():
            held = engine.hold_threads()
            area.loop.flush()
            for other in list(engine.tracee.threads):
                area.leave(other)
            area.discard_unfinished()
    with RemoteSyscalls(engine.tracee, tid) as rs:
        engine.unprotect(rs, pages)
    registry[tid] = pages
    if area is not None and not area.loop.closed:
        engine.tables_changed()       # the loop hands faults on them to the slow path
    engine.resume_threads(held)


def without_pages(runs: list[tuple[int, int, int]], pages: set[int]) -> list[tuple[int, int, int]]:
    """(start, end, prot) runs less ``pages``."""
    out = []
    for start, end, prot in runs:
        cut = sorted(p for p in pages if start <= p < end) if len(pages) < (end - start) // PAGE \
            else [p for p in range(start, end, PAGE) if p in pages]
        at = start
        for page in cut:
            if page > at:
                out.append((at, page, prot))
            at = page + PAGE
        if at < end:
            out.append((at, end, prot))
    return out
