"""Run system calls inside the target, restoring every register afterwards.

``RemoteSyscalls`` is a scope guard (as rr's AutoRemoteSyscalls): on entry it
saves the stopped thread's registers, including ``orig_rax``; each call loads
the syscall number and arguments, points rip at the ``syscall`` instruction of
a slot of the call page (call_page.py) and runs the thread with PTRACE_SYSCALL
to that call's exit stop; on exit the saved registers are restored exactly, so
a thread that was stopped inside a blocking syscall (rax = -ERESTARTSYS...,
orig_rax = its number) restarts that syscall normally (pitfall 3: at the
call's exit stop the tracer makes the restart itself, ``call_page.continuation``;
with a signal of the thread's own to deliver, the signal is queued and the
kernel decides between the restart and EINTR).  No trap is ever raised: a
tracer killed during a scope leaves the thread to the slot's restore code,
which gives it its own registers back (call_page.py).  The call page itself is
mapped by the first scope of a process, through a ``syscall`` instruction of
the vDSO (or of an executable mapping), with nothing to restore it then.

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
After the scope the thread's ``last_event`` is the stop it was lent from.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
import time

from ..errors import NoSuchProcessError, TargetMemoryError, TracerInternalError
from . import ptrace_raw as pr
from .events import (EVENT_NAMES, GroupStop, PtraceEventStop, SignalStop, SyscallStop, ThreadExited,
                     ThreadKilled, TrapStop, at_exit_event, regenerated)
from . import call_page
from .kill_points import kill_point
from .cpu import last_cpu
from .tracee import Tracee

MFD_CLOEXEC = 1
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
        if not tracee.options & pr.PTRACE_O_TRACESYSGOOD:
            raise TracerInternalError("remote system calls need PTRACE_O_TRACESYSGOOD")
        self.tracee = tracee
        self.tid = tid
        self.slot = 0                   # the call page's slot of this scope
        self._syscall_at = 0            # the syscall instruction calls run
        # the call page's own calls at an exec stop, through a "syscall; ret" (see
        # _map_call_page): the thread's rip is pushed for each call
        self._return_to_entry = False
        self._saved_regs: pr.UserRegs | None = None
        self._event = None              # the stop the thread was lent from
        self._at_exit = False           # the thread is at the exit stop of a call of ours
        self._left = False              # it left the stop it was lent from
        self._siginfo: pr.SigInfo | None = None    # that stop's, if a signal-delivery stop
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
        lent_from = self.tracee.threads[self.tid].last_event
        at_exec = isinstance(lent_from, PtraceEventStop) and lent_from.event == pr.PTRACE_EVENT_EXEC
        self._saved_regs = self._prepare(self.tid, where)
        self._event = self.tracee.threads[self.tid].last_event
        self._siginfo = pr.get_siginfo(self.tid) if isinstance(self._event, SignalStop) else None
        self._pin()
        try:
            page = self.tracee.call_page
            if page is None:
                gadget = syscall_return(self.tracee) if at_exec else None
                self._return_to_entry = gadget is not None
                self._syscall_at = gadget or syscall_instruction(self.tracee)
                try:
                    page = self.tracee.call_page = self._map_call_page()
                finally:
                    self._return_to_entry = False
            self.slot = page.take()
            if self.slot is None:
                raise TracerInternalError(f"more than {call_page.SLOTS} remote-call scopes at once "
                                          f"in process {self.tracee.pid}")
            self._syscall_at = self.slot + call_page.SYSCALL_AT
            self.tracee.mem.write(self.slot + call_page.REGS_AT,
                                  bytes(call_page.continuation(self._saved_regs)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            state = self.tracee.threads.get(self.tid)
            if state is not None and not state.gone:
                try:
                    back = self._give_back(state)
                except NoSuchProcessError:
                    # killed while it was taken back to its stop (another thread's
                    # exit_group): nothing is left to give back
                    self._requeue.clear()
                    back = False
                if back:
                    state.last_event = self._event
        finally:
            if self.slot:
                self.tracee.call_page.give_back(self.slot)
                self.slot = 0
            self._unpin()
            self._send_requeued()

    def _give_back(self, state) -> bool:
        """The thread's own registers, in a stop of the kind it was lent from.

        * From a signal-delivery stop: that signal is queued again and the thread
          taken to its delivery stop, with the original siginfo, so that the
          tracer's resume delivers or suppresses it as it would have;
        * a call interrupted by the stop (-ERESTART*, no signal to deliver): the
          kernel restarts it on the way out of a signal or trap stop, not of our
          call's exit stop: the thread goes on to a PTRACE_INTERRUPT trap;
        * else the call's exit stop serves.
        The thread reaches that stop with the call's registers (a tracer killed
        meanwhile leaves it the slot's restore code) and gets its own there (the
        kernel's own restart, if the tracer dies after); a queued signal of its
        own is enough at the exit stop (the kernel restarts on the way out).
        False if the thread ended on the way (it keeps the stop it is in)."""
        saved = self._saved_regs
        if not self._at_exit:           # never resumed, or a call abandoned: as it is
            if self._left and isinstance(self._event, SignalStop) and not regenerated(self._event):
                self._requeue.insert(0, self._event.signum)     # (a fault comes again)
            pr.set_regs(self.tid, saved)
            return True
        if isinstance(self._event, SignalStop):
            pr.tgkill(self.tracee.pid, self.tid, self._event.signum)
            if not self._to_stop(state, self._event.signum):
                return False
            pr.set_regs(self.tid, saved)
            if self._siginfo is not None:
                pr.set_siginfo(self.tid, self._siginfo)
        elif call_page.needs_restart(saved):
            if state.pending_signal:       # resuming from a trap stop would drop it
                self._requeue.insert(0, state.pending_signal)
                state.pending_signal = 0
                self._send_requeued()
            else:
                pr.interrupt(self.tid)
                if not self._to_stop(state, None):
                    return False
            pr.set_regs(self.tid, saved)
        else:
            pr.set_regs(self.tid, saved)
        return True

    def _send_requeued(self) -> None:
        for signum in self._requeue:
            pr.tgkill(self.tracee.pid, self.tid, signum)
        self._requeue.clear()

    def _to_stop(self, state, signum: int | None) -> bool:
        """On from our call's exit stop to the delivery stop of ``signum`` (None: to
        the trap of a PTRACE_INTERRUPT); other signals met first are queued again.
        False if the thread ended meanwhile (another thread's exit_group)."""
        pr.cont(self.tid, 0)
        state.running = True
        while True:
            event = self.tracee.wait_event(block=True, tid=self.tid)
            if event is None or isinstance(event, (ThreadExited, ThreadKilled)):
                self._requeue.clear()
                return False
            if at_exit_event(event):
                self._requeue.clear()      # killed on its way: it cannot be given back
                return False
            if signum is None and isinstance(event, TrapStop):
                return True
            if isinstance(event, SignalStop):
                if event.signum == signum:
                    return True
                self._keep_signal(state, event)
            pr.cont(self.tid, 0)
            state.running = True

    def _map_call_page(self) -> call_page.CallPage:
        """The call page (call_page.py), through a syscall instruction found in the
        target.  At an exec stop, through a ``syscall; ret`` with the thread's rip
        pushed just below its rsp: a tracer killed during one of these calls leaves
        the thread to return to the new image's entry, where only rsp and rip are
        live.  Elsewhere (an attach), or without such a gadget, a tracer killed
        during these four calls leaves the thread with their registers (the only
        calls not covered)."""
        scratch = (self._saved_regs.rsp - 4096) & ~15       # well below the red zone
        self.tracee.mem.write(scratch, call_page.NAME.encode() + b"\0")
        fd = self.call("memfd_create", scratch, MFD_CLOEXEC)
        try:
            self.call("ftruncate", fd, call_page.SIZE)
            address = self.mmap(0, call_page.SIZE, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0)
        finally:
            self.call("close", fd, check=False)
        self.tracee.mem.write(address, call_page.page_image())
        return call_page.CallPage(address, self.tracee.pid, RemoteSyscalls)

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
        call's rip and rax survive the resume."""
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
            if isinstance(event, SignalStop) and not regenerated(event):
                # the thread is lent from this stop: its signal is delivered at the resume
                if state.pending_signal and state.pending_signal != event.signum:
                    self._requeue.append(event.signum)
                else:
                    state.pending_signal = event.signum
            if where is not None:
                return where
            pr.syscall(tid, 0)
            state.running = True

    def _keep_signal(self, state, event) -> None:
        """The target's own signal arrived during a call: queued again at the end
        (a fault of its own instruction is not: it comes again)."""
        if not regenerated(event):
            self._requeue.append(event.signum)

    def call(self, name: str, *args: int, check: bool = True) -> int:
        """Run syscall ``name`` (or a number) with up to 6 arguments; returns rax
        (an unsigned value; raises RemoteSyscallError for -4095..-1 when check)."""
        nr = SYS[name] if isinstance(name, str) else name
        regs = self._saved_regs.copy()
        regs.rax = nr
        regs.orig_rax = NO_SYSCALL  # not in a syscall: no restart logic on resume
        regs.rip = self._syscall_at
        for reg, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(regs, reg, value & 0xFFFFFFFFFFFFFFFF)
        if self._return_to_entry:
            # a tracer killed during this call leaves the thread to the gadget's ret:
            # back at the new image's entry with its own rsp (nothing else is live there)
            regs.rsp = self._saved_regs.rsp - 8
            self.tracee.mem.write_u64(regs.rsp, self._saved_regs.rip)
        pr.set_regs(self.tid, regs)
        kill_point(str(name), f"thread {self.tid} lent from {self._saved_regs.rip:#x}")
        state = self.tracee.threads[self.tid]
        result = self._run(state, regs).rax
        if check and result >= 0xFFFFFFFFFFFFF001:
            raise RemoteSyscallError(str(name), -(result - (1 << 64)))
        return result

    def _run(self, state, regs: pr.UserRegs, patient: bool = False) -> pr.UserRegs:
        """Resume to the exit stop of the system call at ``self._syscall_at`` (a
        called function returns to it); returns the registers there (in
        ``regs``).  ``patient``: see ``call_function``."""
        self._at_exit = False
        self._left = True
        after = self._syscall_at + SYSCALL_INSN_LEN
        ours = 0                      # stops of our system call seen: its entry, its exit
        pr.syscall(self.tid, 0)
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
            if isinstance(event, SyscallStop):
                # by rip: a thread lent from a syscall-entry stop first reports the
                # exit of the call it skips, a called function the stops of its own
                ours += pr.get_regs(self.tid, regs).rip == after
                if ours == 2:
                    self._at_exit = True
                    return regs
            if isinstance(event, TrapStop):
                pr.get_regs(self.tid, regs)
            if interrupted and isinstance(event, (SyscallStop, TrapStop)):
                # the interrupt's stop (any ptrace stop clears a pending interrupt:
                # the exit stop of the call it broke, with -ERESTARTSYS, often)
                if regs.orig_rax == SYS_FUTEX and (isinstance(event, TrapStop) or
                                                   regs.rax == (1 << 64) - call_page.ERESTARTSYS):
                    # back in its own registers from this stop (_give_back)
                    self._at_exit = isinstance(event, SyscallStop)
                    raise RemoteCallBlocked(f"thread {self.tid} waits on a lock in a remote call")
                interrupted, deadline = False, time.monotonic() + PATIENCE
            elif patient and isinstance(event, SignalStop) and event.signum in (7, 11):
                raise TracerInternalError(f"a remote call faulted (signal {event.signum}) at "
                                          f"{pr.get_regs(self.tid, regs).rip:#x} on "
                                          f"{pr.get_siginfo(self.tid).si_addr:#x}")
            elif isinstance(event, SignalStop):
                self._keep_signal(state, event)
            pr.syscall(self.tid, 0)
            state.running = True

    def call_function(self, address: int, *args: int, patient: bool = False) -> int:
        """Call a function of the target (SysV ABI, up to 6 integer arguments) and
        return rax.  Its return address is the slot's return point (a getpid the
        tracer stops at, rax in rdi); its stack frame goes well below the
        thread's red zone, 16-byte aligned as at any call.
        ``patient``: a call that waits on a lock (a futex system call, looked at
        after PATIENCE seconds) is abandoned (RemoteCallBlocked): the lock may be
        held by a thread the tracer keeps stopped; a fault is an error."""
        regs = self._saved_regs.copy()
        regs.orig_rax = NO_SYSCALL
        regs.rax = 0
        regs.rip = address
        rsp = ((self._saved_regs.rsp - 8192) & ~15) - 8
        self.tracee.mem.write_u64(rsp, self.slot)          # returns onto the return point
        regs.rsp = rsp
        for reg, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(regs, reg, value & 0xFFFFFFFFFFFFFFFF)
        pr.set_regs(self.tid, regs)
        state = self.tracee.threads[self.tid]
        if not patient:
            return self._run(state, regs).rdi
        last = state.last_event
        try:
            return self._run(state, regs, patient=True).rdi
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
        if op == pr.SYSCALL_INFO_EXIT or _interrupt_trap(state.tid):
            return READY
        return None
    return READY


def _interrupt_trap(tid: int) -> bool:
    """Whether the thread is in the trap of a PTRACE_INTERRUPT, whatever stop the
    tracer recorded last.  Seen with the hybrid data engine: a thread recorded
    at a system-call stop was, by the kernel's siginfo, in an interrupt's trap
    (how the record went stale is not known); `instrument` then failed with
    "no thread can run a system call now" (test_hybrid_entry, 3 runs in 14
    beside two CPU hogs).  Such a trap serves remote calls as any trap does."""
    info = pr.get_siginfo(tid)
    return info.si_signo == signal.SIGTRAP and \
        info.si_code == signal.SIGTRAP | (pr.PTRACE_EVENT_STOP << 8)


def describe_stop(state) -> str:
    if state.running:
        return "running"
    event = state.last_event
    if isinstance(event, PtraceEventStop):
        return f"in its {EVENT_NAMES.get(event.event, event.event)} event stop"
    if isinstance(event, GroupStop):
        return "job-control stopped"
    return type(event).__name__ if event is not None else "stopped"


def syscall_return(tracee: Tracee) -> int | None:
    """The address of a ``syscall; ret`` (0f 05 c3) in an executable mapping of
    the target (the vDSO's first, then the loader's...), None if there is none."""
    return _find_code(tracee, b"\x0f\x05\xc3", 4 << 20)


def syscall_instruction(tracee: Tracee) -> int:
    """The address of a ``syscall`` instruction (0f 05) in an executable mapping
    of the target, the vDSO's first: a remote call made there stops at its entry
    and exit and never runs what follows."""
    at = _find_code(tracee, b"\x0f\x05", 1 << 20)
    if at is not None:
        return at
    raise TracerInternalError(f"no syscall instruction found in process {tracee.pid}")


def _find_code(tracee: Tracee, code: bytes, limit: int) -> int | None:
    """Where ``code`` first is in the executable mappings of the target (the
    vDSO's first; at most ``limit`` bytes of each read), None if nowhere."""
    maps = [line.split() for line in open(f"/proc/{tracee.pid}/maps")]
    executable = [m for m in maps if len(m) > 1 and "x" in m[1] and m[-1] != "[vsyscall]"]
    executable.sort(key=lambda m: m[-1] != "[vdso]")
    for fields in executable:
        start, end = (int(x, 16) for x in fields[0].split("-"))
        try:
            at = tracee.mem.read(start, min(end - start, limit)).find(code)
        except TargetMemoryError:
            continue
        if at >= 0:
            return start + at
    return None
