# SPDX-License-Identifier: GPL-2.0-or-later
"""Signals delivered while a ring writer has written a record it has not
published yet.

A trampoline or a hook stub reads its ring's HEAD, writes its record (or
group) at HEAD, then publishes it (HEAD += n).  A signal handler that runs in
between and writes records of its own (it calls a traced function) publishes
them at the same places; back in the interrupted writer, its stores went over
the handler's records, which were lost or seen twice.  Each template marks
that stretch: from ``write<tag>`` (its records start there, every register they
need already set) up to ``publish<tag>`` (the instruction that publishes).  A
thread stopped there for a signal is moved back to the write mark before the
signal is delivered: nothing was published, so after the handler it writes
its record again, at the HEAD the handler left.

Trampolines and hook stubs start 16-byte aligned (CodeArea.allocate and the
hook areas), so the few aligned addresses a window can start from are tried,
each recognised by every byte of its template.  Threads madtrace does not
trace (those a live session's ring pool records) take their signals without
a stop: those are not covered.
"""

from __future__ import annotations

from typing import Iterable

from ..process.events import INSTRUCTION_FAULTS
from ..target.templates import Template

ALIGN = 16
TRAMPOLINES = ("callsite_", "tailsite_", "entry_", "exitstub_")
HOOK_STUBS = ("hook_alloc", "hook_copy", "hook_set")


class WriterWindows:
    @classmethod
    def of(cls, injector, kinds: tuple[str, ...]) -> "WriterWindows":
        """The windows of the injector's templates whose names start with ``kinds``."""
        return cls(t for name, t in injector.templates.items() if name.startswith(kinds))

    def __init__(self, templates: Iterable[Template]):
        # (template, offset of a write mark, offset of its publish mark)
        self.windows: list[tuple[Template, int, int]] = []
        for template in templates:
            for mark, start in template.marks.items():
                if mark.startswith("write"):
                    publish = template.marks["publish" + mark[len("write"):]]
                    self.windows.append((template, start, publish))
        self.areas: list = []           # anything with contains(address)
        self.rewound = 0                # threads moved back before a signal

    def watch(self, area, tracee) -> None:
        """Threads of ``tracee`` in ``area`` (its templates') are moved back."""
        if area not in self.areas:
            self.areas.append(area)
        if self.before_delivery not in tracee.before_delivery:
            tracee.before_delivery.append(self.before_delivery)

    def before_delivery(self, tracee, tid: int, signum: int) -> None:
        """Tracee.before_delivery hook: a signal is about to be delivered to
        ``tid`` (stopped).  The thread's own faults are left where they are."""
        if signum in INSTRUCTION_FAULTS or not self.areas:
            return
        regs = tracee.get_regs(tid)
        rip = regs.rip
        area = next((a for a in self.areas if a.contains(rip)), None)
        if area is None:
            return
        start = self.window_start(rip, area, tracee.mem.read)
        if start is not None and start != rip:
            regs.rip = start
            tracee.set_regs(regs, tid)
            self.rewound += 1

    def window_start(self, rip: int, area, read) -> int | None:
        """The write mark of the window ``rip`` is in (a template instance's in
        ``area``: address, end), or None when it is in none.  ``read(address,
        size)``: the target's memory."""
        lo = max(area.address, (rip - max(p for _, _, p in self.windows)) & ~(ALIGN - 1))
        hi = min(area.end, rip + max(t.size for t, _, _ in self.windows))
        try:
            code = read(lo, hi - lo)
        except OSError:
            return None
        for template, start, publish in self.windows:
            base = max(lo, (rip - publish + ALIGN - 1) & ~(ALIGN - 1))
            while base <= rip - start and base + template.size <= hi:
                if template.recognise(code[base - lo:base - lo + template.size], base) is not None:
                    return base + start
                base += ALIGN
        return None
