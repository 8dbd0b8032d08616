"""Run system calls inside the target, restoring every register afterwards.

``RemoteSyscalls`` is a scope guard (as rr's AutoRemoteSyscalls): on entry it
saves the stopped thread's registers, including ``orig_rax``; each call loads
the syscall number and arguments, points rip at a ``syscall; int3`` gadget and
continues to the int3; on exit the saved registers are restored exactly, so a
thread that was stopped inside a blocking syscall (rax = -ERESTARTSYS...,
orig_rax = its number) restarts that syscall normally (pitfall 3).

The gadget: three bytes written over the executable's entry point (``_start``
runs once, at start-up, never again) for the duration of the scope, and
restored when it ends.  All other threads must be stopped (``stop_all``)
while a scope is open, since the gadget lives in shared code.
"""

from __future__ import annotations

import errno
import os

from ..errors import TargetMemoryError, TracerInternalError
from . import ptrace_raw as pr
from .events import SignalStop, ThreadExited, ThreadKilled
from .tracee import Tracee

GADGET = b"\x0f\x05\xcc"  # syscall; int3
SIGTRAP = 5

SYS = {  # x86-64 syscall numbers used by madtrace
    "read": 0, "write": 1, "close": 3, "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12,
    "rt_sigaction": 13, "rt_sigprocmask": 14, "getpid": 39, "gettid": 186, "ftruncate": 77,
    "openat": 257, "memfd_create": 319, "madvise": 28, "prctl": 157,
}
PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x01, 0x02, 0x10, 0x20, 0x100000


class RemoteSyscallError(TargetMemoryError):
    """A syscall run inside the target returned an error."""

    def __init__(self, name: str, err: int):
        super().__init__(f"{name} in the target failed: {errno.errorcode.get(err, err)} ({os.strerror(err)})")
        self.errno = err


class RemoteSyscalls:
    """``with RemoteSyscalls(tracee, tid) as rs: addr = rs.mmap(...)``"""

    def __init__(self, tracee: Tracee, tid: int | None = None):
        self.tracee = tracee
        self.tid = tracee.pid if tid is None else tid
        self.gadget = tracee.auxv_entry()
        self._saved_regs: pr.UserRegs | None = None
        self._saved_code: bytes | None = None

    @property
    def saved_regs(self) -> pr.UserRegs:
        """The thread's registers as they were when the scope began."""
        return self._saved_regs

    def __enter__(self) -> "RemoteSyscalls":
        state = self.tracee.threads.get(self.tid)
        if state is None or state.running:
            raise TracerInternalError(f"thread {self.tid} must be stopped for a remote syscall")
        self._saved_regs = pr.get_regs(self.tid)
        self._saved_code = self.tracee.mem.read(self.gadget, len(GADGET))
        self.tracee.mem.write(self.gadget, GADGET)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.tracee.mem.write(self.gadget, self._saved_code)
        finally:
            pr.set_regs(self.tid, self._saved_regs)

    def call(self, name: str, *args: int, check: bool = True) -> int:
        """Run syscall ``name`` (or a number) with up to 6 arguments; returns rax
        (an unsigned value; raises RemoteSyscallError for -4095..-1 when check)."""
        nr = SYS[name] if isinstance(name, str) else name
        regs = self._saved_regs.copy()
        regs.rax = nr
        regs.orig_rax = 0xFFFFFFFFFFFFFFFF  # not in a syscall: no restart logic on resume
        regs.rip = self.gadget
        for reg, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(regs, reg, value & 0xFFFFFFFFFFFFFFFF)
        pr.set_regs(self.tid, regs)
        state = self.tracee.threads[self.tid]
        result = self._run_to_trap(state, regs).rax
        if check and result >= 0xFFFFFFFFFFFFF001:
            raise RemoteSyscallError(str(name), -(result - (1 << 64)))
        return result

    def _run_to_trap(self, state, regs: pr.UserRegs) -> pr.UserRegs:
        """Continue to the gadget's int3; returns the registers there (in ``regs``)."""
        trap_rip = self.gadget + len(GADGET)
        pr.cont(self.tid, 0)
        state.running = True
        while True:
            event = self.tracee.wait_event(block=True, tid=self.tid)
            if isinstance(event, (ThreadExited, ThreadKilled)) or event is None:
                raise TracerInternalError(f"thread {self.tid} died during a remote syscall")
            if isinstance(event, SignalStop) and event.signum == SIGTRAP and \
                    pr.get_regs(self.tid, regs).rip == trap_rip:
                return regs
            if isinstance(event, SignalStop):
                # the target's own signal arrived meanwhile: keep it for later delivery
                state.pending_signal = event.signum
            pr.cont(self.tid, 0)
            state.running = True

    def call_function(self, address: int, *args: int) -> int:
        """Call a function of the target (SysV ABI, up to 6 integer arguments) and
        return rax.  Its return address is the gadget's int3; its stack frame goes
        well below the thread's red zone, 16-byte aligned as at any call."""
        regs = self._saved_regs.copy()
        regs.orig_rax = 0xFFFFFFFFFFFFFFFF
        regs.rax = 0
        regs.rip = address
        rsp = ((self._saved_regs.rsp - 8192) & ~15) - 8
        self.tracee.mem.write_u64(rsp, self.gadget + 2)  # returns onto the int3
        regs.rsp = rsp
        for reg, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, reg, value & 0xFFFFFFFFFFFFFFFF)
        pr.set_regs(self.tid, regs)
        return self._run_to_trap(self.tracee.threads[self.tid], regs).rax

    # convenience wrappers -------------------------------------------------
    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
        return self.call("mmap", addr, length, prot, flags, fd, offset)

    def munmap(self, addr: int, length: int) -> int:
        return self.call("munmap", addr, length)

    def mprotect(self, addr: int, length: int, prot: int) -> int:
        return self.call("mprotect", addr, length, prot)

    def getpid(self) -> int:
        return self.call("getpid")
