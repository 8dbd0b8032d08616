# SPDX-License-Identifier: GPL-2.0-or-later
"""What instrumenting a live, attached target does ahead, while it runs, so
that the stop writes and maps only (the aim: the target stopped <= 10 ms for
tens of functions).

``decode_ahead(tracee, space, patterns, method, pool)``: the first
instructions of every function that will be entry-patched (and, with
``pool``, of the C library's fork and exec functions the ring pool hooks:
thread_pool.py) are read from the target and decoded now; relocate.py keeps
each decoded prologue by its bytes and address, and the patching, every
thread stopped, only re-encodes them for where its trampoline is (0.1 ms for
20 functions instead of 1.2-2.4 ms).  Code the target changes meanwhile has
other bytes: decoded again then (the patching checks the bytes anyway).
The plan and the scans it needs are plan.py's ``prepare_plan``.
"""

from __future__ import annotations

from ..arch.x86_64.relocate import relocate_entry
from ..errors import MadtraceError
from .plan import make_plan


def _no_branches(lo: int, hi: int) -> list:
    return []       # the branch check is made at the patching, not kept with the decoding


def decode_ahead(tracee, space, patterns: list[str], method: str = "auto",
                 pool: bool = False) -> int:
    """See the module doc.  Returns how many prologues were decoded."""
    decoded = 0
    plan = make_plan(space, patterns, method=method, cxx_unwind=True)
    prologues = [(fn.address, fn.size, fn.size) for fn in plan.functions if fn.method == "entry"]
    if pool:
        from .thread_pool import HOOKED, LIBC
        libc = space.module_named(LIBC)
        for name in HOOKED if libc is not None else ():
            for ms in space.find_functions(name):
                if ms.module is libc and ms.symbol.dynamic and ms.address:
                    size = ms.symbol.size or 64
                    prologues.append((ms.address, size, max(size, 16)))   # as thread_pool.py
                    break
    for address, size, read in prologues:
        try:
            code = tracee.mem.read(address, read)
        except MadtraceError:
            continue            # unreadable now: decoded when patched, if it can be
        relocate_entry(code, address, size, address, branches_into=_no_branches)
        decoded += 1
    return decoded
