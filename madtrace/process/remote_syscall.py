"""Run system calls inside the target, restoring every register afterwards.

``RemoteSyscalls`` is a scope guard (as rr's AutoRemoteSyscalls): on entry it
saves the stopped thread's registers, including ``orig_rax``; each call loads
the syscall number and arguments, points rip at a ``syscall; int3`` gadget and
continues to the int3; on exit the saved registers are restored exactly, so a
thread that was stopped inside a blocking syscall (rax = -ERESTARTSYS...,
orig_rax = its number) restarts that syscall normally (pitfall 3).

The gadget: three bytes written over the executable's entry point (``_start``
runs once, at start-up, never again) for the duration of the scope, and
restored when it ends.  No other thread may run the executable's entry code
while a scope is open (none does after start-up).

The thread must be in a stop where a changed rip and rax reach user space
intact (rr's AutoRemoteSyscalls makes the same distinction):
* a signal-delivery stop, a PTRACE_INTERRUPT / new-thread stop, a syscall-exit
  stop: used as they are;
* a syscall-entry stop: the call is skipped (orig_rax = -1) and rewound, so it
  is made again, from its ``syscall`` instruction, when the thread resumes;
* a PTRACE_EVENT stop inside clone/fork/vfork-done/exec: resuming finishes that
  system call and the kernel then writes its result over rax (a gadget run
  from there made system call number <child tid>: ENOSYS, and the restore
  threw away clone's result, so pthread_create failed and the program died).
  The thread is first taken to its syscall-exit stop (PTRACE_SYSCALL), where
  the result is in rax and is saved like every other register;
* a vfork parent (it would wait for its child), an exiting thread, a
  job-control-stopped one (PTRACE_CONT would end its stop): not usable.
Without an explicit thread, a usable one is chosen, the main thread first.
"""

from __future__ import annotations

import errno
import os
import threading
import time

from ..errors import TargetMemoryError, TracerInternalError
from . import ptrace_raw as pr
from .events import (EVENT_NAMES, GroupStop, PtraceEventStop, SignalStop, SyscallStop, ThreadExited,
                     ThreadKilled, TrapStop, regenerated)
from .cpu import last_cpu
from .tracee import Tracee

GADGET = b"\x0f\x05\xcc"  # syscall; int3
SIGTRAP = 5
SYS_FUTEX = 202
PATIENCE = 0.005           # seconds a patient call runs before the tracer looks why

SYS = {  # x86-64 syscall numbers used by madtrace
    "read": 0, "write": 1, "close": 3, "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12,
    "rt_sigaction": 13, "rt_sigprocmask": 14, "getpid": 39, "gettid": 186, "ftruncate": 77,
    "openat": 257, "memfd_create": 319, "madvise": 28, "prctl": 157, "mremap": 25,
    "fcntl": 72,
}
PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 0x01, 0x02, 0x10, 0x20, 0x100000
NO_SYSCALL = 0xFFFFFFFFFFFFFFFF     # orig_rax of a thread that is not in a system call
SYSCALL_INSN_LEN = 2                # 0f 05
# event stops inside a system call that finishes when the thread resumes
IN_SYSCALL_EVENTS = frozenset({pr.PTRACE_EVENT_CLONE, pr.PTRACE_EVENT_FORK,
                               pr.PTRACE_EVENT_VFORK_DONE, pr.PTRACE_EVENT_EXEC})
# where a thread is: ready (used as it is), entry (rewind its call), finish (take it
# to its syscall-exit stop first), or None (not usable)
READY, ENTRY, FINISH = "ready", "entry", "finish"


class RemoteSyscallError(TargetMemoryError):
    """A syscall run inside the target returned an error."""

    def __init__(self, name: str, err: int):
        super().__init__(f"{name} in the target failed: {errno.errorcode.get(err, err)} ({os.strerror(err)})")
        self.errno = err


class RemoteCallBlocked(TracerInternalError):
    """A patient remote call waited on a lock (futex): abandoned, the thread's
    registers back as they were (it held no lock: it was waiting for one)."""


class RemoteSyscalls:
    """``with RemoteSyscalls(tracee, tid) as rs: addr = rs.mmap(...)``"""

    def __init__(self, tracee: Tracee, tid: int | None = None):
        """``tid``: the thread to use (it must be stopped); without one, a usable
        stopped thread of ``tracee`` is chosen, the main thread first."""
        self.tracee = tracee
        self.tid = tid
        self.gadget = tracee.auxv_entry()
        self._saved_regs: pr.UserRegs | None = None
        self._saved_code: bytes | None = None
        self._requeue: list[int] = []   # signals that arrived while one was already pending

    @property
    def saved_regs(self) -> pr.UserRegs:
        """The thread's registers as they were when the scope began."""
        return self._saved_regs

    def __enter__(self) -> "RemoteSyscalls":
        if self.tid is None:
            self.tid, where = self._choose_thread()
        else:
            state = self.tracee.threads.get(self.tid)
            if state is None or state.running:
                raise TracerInternalError(f"thread {self.tid} must be stopped for a remote syscall")
            where = stop_kind(state)
            if where is None:
                raise TracerInternalError(
                    f"thread {self.tid} cannot run a system call now ({describe_stop(state)})")
        self._saved_regs = self._prepare(self.tid, where)
        self._saved_code = self.tracee.mem.read(self.gadget, len(GADGET))
        self.tracee.mem.write(self.gadget, GADGET)
        self._pin()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.tracee.mem.write(self.gadget, self._saved_code)
        finally:
            self._unpin()
            pr.set_regs(self.tid, self._saved_regs)
            for signum in self._requeue:
                pr.tgkill(self.tracee.pid, self.tid, signum)
            self._requeue.clear()

    def _pin(self) -> None:
        """The thread runs on the tracer's CPU for the scope: each call is then a
        switch on one CPU (~4 us) instead of a wake-up on another (84-142 us,
        and more under load: pitfall 1); every thread stopped meanwhile, this
        is the target's pause.  Both masks are put back at the end."""
        self._masks: dict[int, set[int]] = {}
        try:
            cpu = last_cpu(threading.get_native_id())
            for tid in (0, self.tid):
                mask = os.sched_getaffinity(tid)
                if cpu in mask and mask != {cpu}:
                    self._masks[tid] = mask
                    os.sched_setaffinity(tid, {cpu})
        except OSError:
            self._unpin()       # another cpuset, or gone: calls cost what they cost

    def _unpin(self) -> None:
        for tid, mask in self._masks.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass            # the thread is gone
        self._masks = {}

    def _choose_thread(self) -> tuple[int, str]:
        """A stopped thread that can run system calls: one ready as it is (the main
        thread first), else one to prepare."""
        threads = self.tracee.threads
        order = [self.tracee.pid] + [t for t in threads if t != self.tracee.pid]
        candidates = []
        for tid in order:
            state = threads.get(tid)
            if state is None or state.running or state.gone:
                continue
            where = stop_kind(state)
            if where is not None:
                candidates.append((where != READY, state.fresh, tid, where))
        if not candidates:
            states = ", ".join(f"{t}: {describe_stop(s)}" for t, s in list(threads.items())[:8])
            raise TracerInternalError(f"no thread of process {self.tracee.pid} can run a system "
                                      f"call now ({states or 'no threads'})")
        _, _, tid, where = min(candidates)
        return tid, where

    def _prepare(self, tid: int, where: str) -> pr.UserRegs:
        """The registers to restore at the end, with the thread in a stop where the
        gadget's rip and rax survive the resume."""
        if where == FINISH:
            where = self._finish_syscall(tid)
        regs = pr.get_regs(tid)
        if where == ENTRY:
            # skip the call now (orig_rax = -1: the kernel leaves rax as we set it) and
            # make it again from its syscall instruction when the thread resumes
            saved = regs.copy()
            saved.rax, saved.orig_rax = regs.orig_rax, NO_SYSCALL
            saved.rip = regs.rip - SYSCALL_INSN_LEN
            return saved
        return regs

    def _finish_syscall(self, tid: int) -> str:
        """From an event stop inside a system call to that call's exit stop (or to a
        signal stop met first, after the call). Returns the new stop's kind."""
        state = self.tracee.threads[tid]
        pr.syscall(tid, 0)
        state.running = True
        while True:
            event = self.tracee.wait_event(block=True, tid=tid)
            if isinstance(event, (ThreadExited, ThreadKilled)) or event is None:
                raise TracerInternalError(f"thread {tid} died before a remote syscall")
            where = stop_kind(self.tracee.threads[tid])
            if isinstance(event, SignalStop):
                self._keep_signal(state, event)
            if where is not None:
                return where
            pr.syscall(tid, 0)
            state.running = True

    def _keep_signal(self, state, event) -> None:
        """The target's own signal arrived meanwhile: delivered when the thread
        resumes (a fault of its own instruction is not: it comes again)."""
        if regenerated(event):
            return
        signum = event.signum
        if state.pending_signal and state.pending_signal != signum:
            self._requeue.append(signum)   # sent again at the end: never lost
        else:
            state.pending_signal = signum

    def call(self, name: str, *args: int, check: bool = True) -> int:
        """Run syscall ``name`` (or a number) with up to 6 arguments; returns rax
        (an unsigned value; raises RemoteSyscallError for -4095..-1 when check)."""
        nr = SYS[name] if isinstance(name, str) else name
        regs = self._saved_regs.copy()
        regs.rax = nr
        regs.orig_rax = NO_SYSCALL  # not in a syscall: no restart logic on resume
        regs.rip = self.gadget
        for reg, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(regs, reg, value & 0xFFFFFFFFFFFFFFFF)
        pr.set_regs(self.tid, regs)
        state = self.tracee.threads[self.tid]
        result = self._run_to_trap(state, regs).rax
        if check and result >= 0xFFFFFFFFFFFFF001:
            raise RemoteSyscallError(str(name), -(result - (1 << 64)))
        return result

    def _run_to_trap(self, state, regs: pr.UserRegs, patient: bool = False) -> pr.UserRegs:
        """Continue to the gadget's int3; returns the registers there (in ``regs``).
        ``patient``: see ``call_function``."""
        trap_rip = self.gadget + len(GADGET)
        pr.cont(self.tid, 0)
        state.running = True
        deadline = time.monotonic() + PATIENCE if patient else None
        interrupted = False
        while True:
            event = self.tracee.wait_event(block=deadline is None, tid=self.tid)
            if event is None and deadline is not None and state.running:
                if time.monotonic() < deadline:
                    time.sleep(0.0002)
                    continue
                pr.interrupt(self.tid)        # running long: why?
                interrupted, deadline = True, None
                continue
            if isinstance(event, (ThreadExited, ThreadKilled)) or event is None:
                raise TracerInternalError(f"thread {self.tid} died during a remote syscall")
            if isinstance(event, SignalStop) and event.signum == SIGTRAP and \
                    pr.get_regs(self.tid, regs).rip == trap_rip:
                return regs
            if patient and isinstance(event, TrapStop) and interrupted:
                if pr.get_regs(self.tid, regs).orig_rax == SYS_FUTEX:
                    raise RemoteCallBlocked(f"thread {self.tid} waits on a lock in a remote call")
                interrupted, deadline = False, time.monotonic() + PATIENCE
            elif patient and isinstance(event, SignalStop) and event.signum in (7, 11):
                raise TracerInternalError(f"a remote call faulted (signal {event.signum}) at "
                                          f"{pr.get_regs(self.tid, regs).rip:#x} on "
                                          f"{pr.get_siginfo(self.tid).si_addr:#x}")
            elif isinstance(event, SignalStop):
                self._keep_signal(state, event)
            pr.cont(self.tid, 0)
            state.running = True

    def call_function(self, address: int, *args: int, patient: bool = False) -> int:
        """Call a function of the target (SysV ABI, up to 6 integer arguments) and
        return rax.  Its return address is the gadget's int3; its stack frame goes
        well below the thread's red zone, 16-byte aligned as at any call.
        ``patient``: a call that waits on a lock (a futex system call, looked at
        after PATIENCE seconds) is abandoned (RemoteCallBlocked): the lock may be
        held by a thread the tracer keeps stopped; a fault is an error."""
        regs = self._saved_regs.copy()
        regs.orig_rax = NO_SYSCALL
        regs.rax = 0
        regs.rip = address
        rsp = ((self._saved_regs.rsp - 8192) & ~15) - 8
        self.tracee.mem.write_u64(rsp, self.gadget + 2)  # returns onto the int3
        regs.rsp = rsp
        for reg, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, reg, value & 0xFFFFFFFFFFFFFFFF)
        pr.set_regs(self.tid, regs)
        state = self.tracee.threads[self.tid]
        if not patient:
            return self._run_to_trap(state, regs).rax
        last = state.last_event
        try:
            return self._run_to_trap(state, regs, patient).rax
        except RemoteCallBlocked:
            state.last_event = last        # the interrupt's stop is not the scope's
            raise

    # convenience wrappers -------------------------------------------------
    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
        return self.call("mmap", addr, length, prot, flags, fd, offset)

    def munmap(self, addr: int, length: int) -> int:
        return self.call("munmap", addr, length)

    def mprotect(self, addr: int, length: int, prot: int) -> int:
        return self.call("mprotect", addr, length, prot)

    def getpid(self) -> int:
        return self.call("getpid")


def stop_kind(state) -> str | None:
    """How a stopped thread can be used for remote system calls (see the module)."""
    event = state.last_event
    if state.gone or isinstance(event, GroupStop):
        return None
    if isinstance(event, PtraceEventStop):
        return FINISH if event.event in IN_SYSCALL_EVENTS else None
    if isinstance(event, SyscallStop):
        op = pr.get_syscall_info(state.tid).op
        if op == pr.SYSCALL_INFO_ENTRY:
            return ENTRY
        return READY if op == pr.SYSCALL_INFO_EXIT else None
    return READY


def describe_stop(state) -> str:
    if state.running:
        return "running"
    event = state.last_event
    if isinstance(event, PtraceEventStop):
        return f"in its {EVENT_NAMES.get(event.event, event.event)} event stop"
    if isinstance(event, GroupStop):
        return "job-control stopped"
    return type(event).__name__ if event is not None else "stopped"
