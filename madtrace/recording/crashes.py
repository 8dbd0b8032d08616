# SPDX-License-Identifier: GPL-2.0-or-later
"""Where a fault delivered to the program struck, said in the program's terms.

A SIGSEGV, SIGBUS, SIGILL or SIGFPE raised by the kernel for a thread's own
instruction (si_code > 0) and not claimed by an engine (a data fault, a probe's
step) is delivered to the program, which dies of it unless it handles it.  Before it is
delivered, ``CrashReports.before_forward`` notes the thread, the instruction
(rip, and ``struck_at`` when the fault struck in a copy the data engine then
moved the thread out of, to the original instruction: ``first_look``) and
the faulting address, and where the instruction that faulted lies: the program's
own code (``function+0xoff (module)``), a copy madtrace made of one of its
functions (which one, and the original instruction; in a data probe or not),
or another of madtrace's areas.  The same fault met again (the data engine's
guard hands a fault of the program's own back to it, which then faults again
with its own action) is one report.  meta.json keeps them (``faults_delivered``, the
first few), and the recording says the first on stderr: a program that dies
under madtrace and not without it is then told from one that dies either way.
"""

from __future__ import annotations

import signal

from ..errors import MadtraceError

KEPT = 8                # reports kept in meta.json
FATAL = {signal.SIGSEGV: "SIGSEGV", signal.SIGBUS: "SIGBUS", signal.SIGILL: "SIGILL",
         signal.SIGFPE: "SIGFPE"}


class CrashReports:
    """``where(address) -> str | None``: madtrace's own account of an address (a
    copy, an area), None: the program's code, named by ``symbolize``."""

    def __init__(self, where, symbolize, log, address_note=lambda address: None):
        """``address_note(address)``: what madtrace holds of the faulting address
        (the data engine's protection and alias of its page), or None."""
        self.where, self.symbolize, self.log = where, symbolize, log
        self.address_note = address_note
        self.reports: list[dict] = []
        self._struck: dict[int, int] = {}      # tid -> rip as the fault left it

    def first_look(self, tracee, event) -> bool:
        """A signal claimer placed first: where the fault struck, before an engine
        moves the thread out of its copy (the program's handler, if any, sees the
        original instruction).  Claims nothing."""
        if event.signum in FATAL and event.si_code > 0 and len(self.reports) < KEPT:
            try:
                self._struck[event.tid] = tracee.get_regs(event.tid).rip
            except MadtraceError:
                pass
        return False

    def before_forward(self, tracee, event) -> None:
        name = FATAL.get(event.signum)
        struck = self._struck.pop(event.tid, None)
        if name is None or event.si_code <= 0 or len(self.reports) >= KEPT:
            return
        try:
            rip = tracee.get_regs(event.tid).rip
        except MadtraceError:
            return
        if struck is None:
            struck = rip
        if self.reports and (self.reports[-1]["tid"], self.reports[-1]["rip"],
                             self.reports[-1]["address"]) == (event.tid, rip, event.si_addr):
            return      # the same fault again: the data engine's guard handed it back
        place = self.where(struck) or self.symbolize(struck)
        report = {"signal": name, "code": event.si_code, "tid": event.tid, "rip": rip,
                  "address": event.si_addr, "at": place}
        note = self.address_note(event.si_addr)
        if note:
            report["address_note"] = note
        if struck != rip:
            report["struck_at"] = struck       # in madtrace's copy; rip: where it goes on
        self.reports.append(report)
        if len(self.reports) == 1:
            self.log(f"thread {event.tid} takes {name} (code {event.si_code}) at {struck:#x}, "
                     f"{place} (address {event.si_addr:#x}{'; ' + note if note else ''}); it "
                     "is delivered to the program")
