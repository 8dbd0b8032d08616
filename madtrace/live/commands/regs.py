# SPDX-License-Identifier: GPL-2.0-or-later
"""regs [TID]"""

from __future__ import annotations

from ...errors import UsageError
from ..registry import Command, register

SHOWN = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
         "r12", "r13", "r14", "r15", "rip", "eflags", "fs_base", "orig_rax")


@register
class Regs(Command):
    """The registers of thread TID (default: the main thread), read while the
    target is stopped for this command; rip is symbolized."""

    name = "regs"
    arguments = "[TID]"
    summary = "registers of a thread"
    max_args = 1
    json_form = True
    stops_target = True
    completes = "threads"

    def run(self, session, args):
        tracee = session.tracee
        try:
            tid = int(args[0]) if args else tracee.pid
        except ValueError:
            raise UsageError(f"regs: not a thread id: {args[0]!r}") from None
        if tid not in tracee.threads:
            raise UsageError(f"regs: process {tracee.pid} has no thread {tid} "
                             f"(threads: {' '.join(map(str, sorted(tracee.threads)))})")
        regs = tracee.get_regs(tid).as_dict()
        data = {name: regs[name] for name in SHOWN}
        data["tid"] = tid
        data["rip_symbol"] = session.space.symbolize(regs["rip"])
        return data

    def render(self, d):
        cells = [f"{n:<9}{d[n]:#018x}" for n in SHOWN]
        rows = ["   ".join(cells[i:i + 3]) for i in range(0, len(cells), 3)]
        return "\n".join([f"thread {d['tid']}: rip at {d['rip_symbol']}"] + rows)
