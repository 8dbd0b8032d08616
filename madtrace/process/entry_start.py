# SPDX-License-Identifier: GPL-2.0-or-later
"""Run code when a freshly exec'd image reaches its entry point.

At PTRACE_EVENT_EXEC only the new executable and the dynamic loader are
mapped; its libraries (their functions, their .data and .bss) appear once the
loader has run.  Tracing a new image "as if it had been launched directly"
starts where a launch starts: at the executable's entry point (AT_ENTRY of
the new auxv).  ``EntryStart.arm`` plants a one-shot int3 there; ``claim``
(a signal claimer) recognises its trap, puts the byte back, moves rip back
onto the entry and calls the callback with the thread still stopped.
"""

from __future__ import annotations

import signal
from typing import Callable

from .events import SignalStop
from .tracee import Tracee

INT3 = b"\xcc"


class EntryStart:
    def __init__(self, tracee: Tracee, on_entry: Callable[[int], None]):
        """``on_entry(tid)``: called at the entry, every thread stopped (there is one)."""
        self.tracee = tracee
        self.on_entry = on_entry
        self.address: int | None = None
        self.saved = b""

    @property
    def armed(self) -> bool:
        return self.address is not None

    def arm(self) -> None:
        """At the exec stop of ``tracee`` (its new image)."""
        self.address = self.tracee.auxv_entry()
        self.saved = self.tracee.mem.read(self.address, 1)
        self.tracee.mem.write(self.address, INT3)

    def disarm(self) -> None:
        if self.address is not None and self.tracee.threads:
            self.tracee.mem.write(self.address, self.saved)
        self.address = None

    def claim(self, tracee: Tracee, event: SignalStop) -> bool:
        if tracee is not self.tracee or self.address is None or event.signum != signal.SIGTRAP:
            return False
        regs = tracee.get_regs(event.tid)
        if regs.rip != self.address + 1:
            return False
        address = self.address
        self.disarm()
        regs.rip = address
        tracee.set_regs(regs, event.tid)
        self.on_entry(event.tid)
        tracee.resume(event.tid, 0)
        return True
