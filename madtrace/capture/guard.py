# SPDX-License-Identifier: GPL-2.0-or-later
"""The guard: what keeps the target alive if the tracer dies mid-trace.

While pages are protected, the target's SIGSEGV action is madtrace's guard
(template ``guard`` of injector/trampolines.S, table and code in the data
area; layout: injector/layout.h "The guard").  A live tracer never lets its
own faults reach the target, so the guard runs only for a fault of the
target's own that the tracer delivers, or when no tracer is left: then it
gives every page its original protection back (the runs table, kept current
by ``update``), writes back finished slots, and puts the target's own action
back; the faulting instruction runs again on its open page.

The target's own ``rt_sigaction(SIGSEGV, ...)`` calls are answered from the
table (``emulate``), so the target sees and sets its own action exactly as
without madtrace.  A fork child gets the target's action back with its pages
(``restore_in``).

SIGSEGV must never be blocked while pages are protected: a fault of
madtrace's on a blocked SIGSEGV makes the kernel reset the action to SIG_DFL.
So the kernel gets the target's SIGSEGV handler with SA_NODEFER, and every
other action without SIGSEGV in its mask (``kernel_action``); the target reads
its actions back as it set them (``answer_old``).  A SIGSEGV the target blocks
itself with sigprocmask is not handled (README: known limits).
"""

from __future__ import annotations

import struct

from ..inject.templates import load_injector
from ..process.remote_syscall import RemoteSyscalls

SIGSEGV = 11
SA_SIGINFO, SA_RESTORER, SA_ONSTACK = 0x4, 0x04000000, 0x08000000
SIGACTION_SIZE = 32     # kernel struct sigaction: handler, flags, restorer, mask (8 bytes)
SA_NODEFER = 0x40000000
SEGV_BIT = 1 << (SIGSEGV - 1)
SIG_DFL, SIG_IGN = 0, 1


def kernel_action(raw: bytes, signum: int) -> bytes:
    """The action as the kernel gets it while data tracing: SIGSEGV never blocked."""
    handler, flags, restorer, mask = struct.unpack("<QQQQ", raw)
    if handler not in (SIG_DFL, SIG_IGN):
        mask &= ~SEGV_BIT
        if signum == SIGSEGV:
            flags |= SA_NODEFER
    return struct.pack("<QQQQ", handler, flags, restorer, mask)


class SegvGuard:
    def __init__(self, area):
        """``area``: the data area (DataArea): the guard's table and code live there."""
        self.L = load_injector()
        self.area = area
        base = area.area.address
        self.table = base + self.L.MT_GUARD
        self.code = base + self.L.MT_GUARD_CODE
        # 32 bytes between the runs table and the code, for remote calls of the tracer's
        self.scratch = self.code - 64
        self.truncated_runs = 0
        self.reinstalls = 0
        # the guard gave a fault of the target's own back to the target's action, and
        # the tracer delivered it: reinstall at the next system call exit
        self.pending_reinstall = False
        self.originals: dict[int, bytes] = {}   # signal -> the target's own action, where
        #                                         the kernel has kernel_action() of it
        guard = self.L.templates["guard"]
        restorer = self.code + guard.size
        area.area.write(self.code, bytes(guard.instantiate(self.code, table=self.table)))
        area.area.write(restorer, self.L.templates["sigreturn"].code)
        # SA_ONSTACK: a target that overflows its stack still reaches the guard on its
        # alternate stack, if it has one
        self._write(self.L.MT_GUARD_SELF,
                    struct.pack("<QQQQ", self.code, SA_SIGINFO | SA_RESTORER | SA_ONSTACK, restorer, 0))

    # --------------------------------------------------------------- table
    def _offset(self, field: int) -> int:
        return self.L.MT_GUARD + field

    def _write(self, field: int, data: bytes) -> None:
        off = self._offset(field)
        self.area.area.local[off:off + len(data)] = data

    def _read(self, field: int, size: int) -> bytes:
        off = self._offset(field)
        return bytes(self.area.area.local[off:off + size])

    def _u64(self, field: int, value: int | None = None) -> int:
        if value is None:
            return struct.unpack("<Q", self._read(field, 8))[0]
        self._write(field, struct.pack("<Q", value))
        return value

    @property
    def installed(self) -> bool:
        return bool(self._u64(self.L.MT_GUARD_ACTIVE))

    @property
    def fired(self) -> bool:
        return bool(self._u64(self.L.MT_GUARD_FIRED))

    def update(self, runs) -> None:
        """``runs``: (start, end, original PROT_*) of every protected page run."""
        runs = list(runs)[:self.L.MT_GUARD_MAX_RUNS]
        self.truncated_runs = max(0, len(runs) - self.L.MT_GUARD_MAX_RUNS)
        data = b"".join(struct.pack("<QQQ", s, e - s, p) for s, e, p in runs)
        self._u64(self.L.MT_GUARD_NRUNS, 0)            # never a half-written table
        self._write(self.L.MT_GUARD_RUNS, data)
        self._u64(self.L.MT_GUARD_NRUNS, len(runs))

    # ------------------------------------------------------------- actions
    def install(self, rs: RemoteSyscalls) -> None:
        """The guard becomes the SIGSEGV action; the target's goes to the table.
        Actions already installed with SIGSEGV in their mask get it removed."""
        scratch = self.scratch
        mem = rs.tracee.mem
        for signum in range(1, 65):
            if signum in (9, 19, SIGSEGV):
                continue
            if rs.call("rt_sigaction", signum, 0, scratch, 8) != 0:
                continue
            raw = mem.read(scratch, SIGACTION_SIZE)
            kernel = kernel_action(raw, signum)
            if kernel != raw:
                mem.write(scratch, kernel)
                rs.call("rt_sigaction", signum, scratch, 0, 8)
                self.originals[signum] = raw
        result = rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_SELF,
                         self.table + self.L.MT_GUARD_ACTION, 8)
        if result == 0:
            self._set_action(self._read(self.L.MT_GUARD_ACTION, SIGACTION_SIZE))
            self._u64(self.L.MT_GUARD_ACTIVE, 1)

    def _set_action(self, raw: bytes) -> None:
        self._write(self.L.MT_GUARD_ACTION, raw)
        self._write(self.L.MT_GUARD_DELIVER, kernel_action(raw, SIGSEGV))

    def reinstall(self, rs: RemoteSyscalls) -> None:
        """After the guard handed a fault to the target's own action."""
        self.pending_reinstall = False
        if not self.installed and not self.fired:
            rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_SELF, 0, 8)
            self._u64(self.L.MT_GUARD_ACTIVE, 1)
            self.reinstalls += 1

    def delivering(self) -> None:
        """A SIGSEGV of the target's own is about to be delivered."""
        if not self.installed:
            self.pending_reinstall = True

    def remove(self, rs: RemoteSyscalls) -> None:
        """The target's own actions back (tracing ends)."""
        if not self.fired:
            rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_ACTION, 0, 8)
            self._u64(self.L.MT_GUARD_ACTIVE, 0)
        self._restore_others(rs)

    def _restore_others(self, rs: RemoteSyscalls) -> None:
        for signum, raw in self.originals.items():
            rs.tracee.mem.write(self.scratch, raw)
            rs.call("rt_sigaction", signum, self.scratch, 0, 8)

    def restore_in(self, rs: RemoteSyscalls) -> None:
        """A fork child: the target's actions back in the child (same addresses)."""
        rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_ACTION, 0, 8)
        self._restore_others(rs)

    def emulate(self, mem, new: int, old: int) -> bool:
        """The target's rt_sigaction(SIGSEGV, new, old, 8), answered from the table.
        True if the kernel must get the new action now (the guard is aside)."""
        current = self._read(self.L.MT_GUARD_ACTION, SIGACTION_SIZE)
        if new:
            self._set_action(mem.read(new, SIGACTION_SIZE))
        if old:
            mem.write(old, current)
        return bool(new) and not self.installed and not self.fired

    def deliver_now(self, rs: RemoteSyscalls) -> None:
        """The guard is aside (a fault of the target's own is being handled): the
        kernel gets the target's action as set just now."""
        rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_DELIVER, 0, 8)

    def kernel_version(self, mem, signum: int, new: int, scratch: int) -> int | None:
        """rt_sigaction(signum != SIGSEGV, new, ...): where the kernel should read the
        action from (``scratch``, filled here) if it must differ from the target's."""
        if not new:
            return None
        raw = mem.read(new, SIGACTION_SIZE)
        kernel = kernel_action(raw, signum)
        if kernel == raw:
            self.originals.pop(signum, None)
            return None
        self.originals[signum] = raw
        mem.write(scratch, kernel)
        return scratch

    def answer_old(self, mem, signum: int, old: int) -> None:
        """The target reads an action back: as it set it, not as the kernel has it."""
        raw = self.originals.get(signum)
        if old and raw is not None:
            current = mem.read(old, SIGACTION_SIZE)
            if current == kernel_action(raw, signum):
                mem.write(old, raw)
