# SPDX-License-Identifier: GPL-2.0-or-later
"""One instruction of a stopped thread: PTRACE_SINGLESTEP, never a stale
interrupt's trap taken for the step's.

A PTRACE_INTERRUPT that reaches a thread already in a ptrace stop is not lost:
the kernel keeps it pending (JOBCTL_TRAP_STOP; "any trap clears a pending STOP
trap" only when a stop begins) and reports it at the thread's next resume,
before any instruction runs.  A stop request does that: its signal handler
interrupts a thread it sees running (``Controller.request_stop``), the thread
reaches that trap, and the detach's ``stop_all`` interrupts it again before
the trap is reaped.  The detach's first single step then met the second trap,
with rip unchanged.  Taken for the step, it made the probe settler move a
thread at a probe's instruction past it without the access: a load skipped so
left its register as it was (data_dispatch -O0 then calls ``x`` instead of
its op: SIGSEGV once detached, the program prints nothing, madtrace exits 0),
a store skipped is lost.  ``step`` steps again after such a trap: a
PTRACE_EVENT_STOP trap is never a step's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import ptrace_raw as pr
from .events import Event, TrapStop

if TYPE_CHECKING:
    from .tracee import Tracee

STALE_TRAPS = 8       # interrupts pending at once: one each (they coalesce)


def step(tracee: Tracee, tid: int) -> Event | None:
    """Single-step stopped thread ``tid`` and return the stop it reaches (the
    step's SIGTRAP, a fault of its instruction, another signal, its exit), not a
    pending interrupt's trap (the instruction has not run then: stepped again).
    The thread's state is kept by ``wait_event``."""
    state = tracee.threads[tid]
    event: Event | None = None
    for _ in range(STALE_TRAPS):
        pr.singlestep(tid, 0)
        state.running = True
        event = tracee.wait_event(block=True, tid=tid)
        if not isinstance(event, TrapStop):
            return event
    return event
