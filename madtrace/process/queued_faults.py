# SPDX-License-Identifier: GPL-2.0-or-later
"""A thread's own fault or trap queued behind the trap of a PTRACE_INTERRUPT.

The kernel takes a pending interrupt before it dequeues a signal: a thread
that met a fault or an int3 of madtrace's just before madtrace stopped it
reports the interrupt's trap with that signal still queued.  Detached so,
the thread got the signal untraced once madtrace's pages and breakpoints
were gone: a SIGSEGV or SIGTRAP death with no dmesg line (a traced thread's
fault is not logged).  Checked on this kernel with a C reproduction (about 1
interrupt in 25 000 met it).  ``take_queued_signal`` resumes such a thread
to that signal's stop, which the caller then handles as any signal met
while stopping; one PTRACE_PEEKSIGINFO per interrupt stop otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import NoSuchProcessError
from . import ptrace_raw as pr
from .events import INSTRUCTION_SIGNALS, Event, TrapStop

if TYPE_CHECKING:
    from .tracee import Tracee


def instruction_signal_queued(tid: int) -> bool:
    """Whether stopped thread ``tid`` has the signal of one of its own
    instructions queued (a fault, an int3: from the kernel, si_code > 0) and
    not blocked: the kernel dequeues it first when the thread resumes."""
    try:
        infos = pr.queued_signals(tid)
        if not infos:
            return False
        blocked = pr.get_sigmask(tid)
    except (NoSuchProcessError, OSError):
        return False
    return any(info.si_signo in INSTRUCTION_SIGNALS and info.si_code > 0
               and not blocked & (1 << (info.si_signo - 1)) for info in infos)


def take_queued_signal(tracee: Tracee, tid: int, trap: TrapStop) -> Event | None:
    """Thread ``tid`` is at the trap of a PTRACE_INTERRUPT (``trap``): if a
    signal of its own instruction is queued, it is resumed and the stop it
    reaches (its signal-delivery stop, or whatever stop or exit comes first)
    is returned.  ``trap`` when nothing is queued; None when it is gone."""
    event: Event | None = trap
    for _ in range(8):      # a new interrupt (a stop request's) may come first again
        state = tracee.threads.get(tid)
        if state is None or state.gone or not isinstance(event, TrapStop) \
                or not instruction_signal_queued(tid):
            return event
        try:
            pr.cont(tid, 0)
        except NoSuchProcessError:
            return event     # exiting: its exit is on its way, as for any stopped thread
        state.running = True
        event = tracee.wait_leader() if tid == tracee.pid else \
            tracee.wait_event(block=True, tid=tid)
    return event


def take_queued_signals(tracee: Tracee) -> list[Event]:
    """take_queued_signal for every thread stopped at an interrupt's trap (at
    the detach: those stopped before it too, by a stop request's interrupt);
    returns the stops met instead of those traps."""
    events: list[Event] = []
    for state in list(tracee.threads.values()):
        if state.running or state.gone or not isinstance(state.last_event, TrapStop):
            continue
        event = take_queued_signal(tracee, state.tid, state.last_event)
        if event is None and not state.gone:
            tracee.threads.pop(state.tid, None)
        elif event is not None and not isinstance(event, TrapStop):
            events.append(event)
    return events
