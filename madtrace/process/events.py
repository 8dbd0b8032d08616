"""Typed results of waiting on traced threads.

``decode_status`` turns a raw waitpid status into one of these; the wait loop
returns them instead of raising exceptions (python-ptrace raises events as
exceptions, which makes the common case expensive and the control flow
hard to follow).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from . import ptrace_raw as pr

STOP_SIGNALS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS})
# raised by an instruction, which is then not carried out (a single step stops at it)
INSTRUCTION_FAULTS = FAULT_SIGNALS | {signal.SIGILL, signal.SIGFPE}
# raised by an instruction (an int3 included): the kernel's "synchronous" signals
INSTRUCTION_SIGNALS = INSTRUCTION_FAULTS | {signal.SIGTRAP}


@dataclass(frozen=True)
class ThreadExited:
    """A thread (or the whole process, when tid is the leader) exited normally."""
    tid: int
    status: int


@dataclass(frozen=True)
class ThreadKilled:
    """A thread died of a signal."""
    tid: int
    signum: int
    core_dumped: bool


@dataclass(frozen=True)
class SignalStop:
    """Signal-delivery-stop: ``signum`` is about to be delivered to the thread.
    For SIGSEGV and SIGBUS, ``si_code`` and ``si_addr`` as they were at the
    stop (a later injected syscall would change what GETSIGINFO returns)."""
    tid: int
    signum: int
    si_code: int = 0
    si_addr: int = 0


def regenerated(event) -> bool:
    """A fault raised by the thread's own instruction (SIGSEGV or SIGBUS from the
    kernel, si_code > 0), met while madtrace ran the thread elsewhere (a remote
    system call, a step) or stopped it: that instruction was not carried out
    and runs again when the thread resumes where it was, faulting again if it
    still must.  Kept for delivery instead, it killed a target at detach: the
    page protection that raised it was gone, the injected SIGSEGV was not."""
    return isinstance(event, SignalStop) and event.signum in FAULT_SIGNALS and event.si_code > 0


def keep_signal(state, event) -> None:
    """A signal met at a stop of madtrace's (``state``: the thread's ThreadState):
    the target's own is delivered when the thread next resumes; a regenerated
    fault is not."""
    if isinstance(event, SignalStop) and not regenerated(event):
        state.pending_signal = event.signum


@dataclass(frozen=True)
class PtraceEventStop:
    """A PTRACE_EVENT_{FORK,VFORK,CLONE,EXEC,VFORK_DONE,EXIT} stop; ``message`` from GETEVENTMSG."""
    tid: int
    event: int
    message: int


@dataclass(frozen=True)
class GroupStop:
    """Job-control stop (SIGSTOP/SIGTSTP/...) of a seized thread."""
    tid: int
    signum: int


@dataclass(frozen=True)
class TrapStop:
    """PTRACE_EVENT_STOP with SIGTRAP: after PTRACE_INTERRUPT, a new thread's
    first stop, or a SIGCONT notification."""
    tid: int


@dataclass(frozen=True)
class SyscallStop:
    """Syscall entry or exit stop (PTRACE_O_TRACESYSGOOD)."""
    tid: int


Event = ThreadExited | ThreadKilled | SignalStop | PtraceEventStop | GroupStop | TrapStop | SyscallStop

EVENT_NAMES = {
    pr.PTRACE_EVENT_FORK: "fork", pr.PTRACE_EVENT_VFORK: "vfork", pr.PTRACE_EVENT_CLONE: "clone",
    pr.PTRACE_EVENT_EXEC: "exec", pr.PTRACE_EVENT_VFORK_DONE: "vfork-done",
    pr.PTRACE_EVENT_EXIT: "exit", pr.PTRACE_EVENT_STOP: "stop",
}


def at_exit_event(event) -> bool:
    """A thread's PTRACE_EVENT_EXIT stop: it runs no user instruction again."""
    return isinstance(event, PtraceEventStop) and event.event == pr.PTRACE_EVENT_EXIT


def decode_status(tid: int, status: int) -> Event:
    if os.WIFEXITED(status):
        return ThreadExited(tid, os.WEXITSTATUS(status))
    if os.WIFSIGNALED(status):
        return ThreadKilled(tid, os.WTERMSIG(status), os.WCOREDUMP(status))
    if not os.WIFSTOPPED(status):
        raise ValueError(f"unexpected wait status {status:#x} for {tid}")
    sig = os.WSTOPSIG(status)
    event = (status >> 16) & 0xFFFF
    if event == pr.PTRACE_EVENT_STOP:
        if sig in STOP_SIGNALS:
            return GroupStop(tid, sig)
        return TrapStop(tid)
    if event:
        return PtraceEventStop(tid, event, pr.get_event_msg(tid))
    if sig == (signal.SIGTRAP | 0x80):
        return SyscallStop(tid)
    if sig in FAULT_SIGNALS:
        info = pr.get_siginfo(tid)
        return SignalStop(tid, sig, info.si_code, info.si_addr)
    return SignalStop(tid, sig)
