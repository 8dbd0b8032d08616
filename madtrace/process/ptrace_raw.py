"""Thin ctypes binding of ptrace(2) and waitpid for x86-64.

This module (and the rest of ``madtrace.process``) is the only code that
issues ptrace requests.  python-ptrace lacks PTRACE_SEIZE, PTRACE_INTERRUPT
and thread support, and its high-level calls cost 2-3x more than a direct
ctypes call (see ../shared/notes/ptrace-facts.md), so requests are issued
directly; its constant tables are reused where they exist.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

from ..errors import NoSuchProcessError, PermissionDeniedError, TracerInternalError

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]

# requests (linux/ptrace.h)
PTRACE_TRACEME = 0
PTRACE_PEEKDATA = 2
PTRACE_PEEKUSER = 3
PTRACE_POKEDATA = 5
PTRACE_CONT = 7
PTRACE_KILL = 8
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
PTRACE_SYSCALL = 24
PTRACE_SETOPTIONS = 0x4200
PTRACE_GETEVENTMSG = 0x4201
PTRACE_GETSIGINFO = 0x4202
PTRACE_SETSIGINFO = 0x4203
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_LISTEN = 0x4208
PTRACE_PEEKSIGINFO = 0x4209
PTRACE_GETSIGMASK = 0x420A
PTRACE_GET_SYSCALL_INFO = 0x420E
# PTRACE_GET_SYSCALL_INFO's op: where a thread stopped
SYSCALL_INFO_NONE, SYSCALL_INFO_ENTRY, SYSCALL_INFO_EXIT, SYSCALL_INFO_SECCOMP = 0, 1, 2, 3

# options
PTRACE_O_TRACESYSGOOD = 0x01
PTRACE_O_TRACEFORK = 0x02
PTRACE_O_TRACEVFORK = 0x04
PTRACE_O_TRACECLONE = 0x08
PTRACE_O_TRACEEXEC = 0x10
PTRACE_O_TRACEVFORKDONE = 0x20
PTRACE_O_TRACEEXIT = 0x40
PTRACE_O_EXITKILL = 0x100000

# events (status >> 16)
PTRACE_EVENT_FORK = 1
PTRACE_EVENT_VFORK = 2
PTRACE_EVENT_CLONE = 3
PTRACE_EVENT_EXEC = 4
PTRACE_EVENT_VFORK_DONE = 5
PTRACE_EVENT_EXIT = 6
PTRACE_EVENT_STOP = 128

WALL = 0x40000000  # __WALL


class UserRegs(ctypes.Structure):
    """struct user_regs_struct (sys/user.h), x86-64."""

    _fields_ = [
        (name, ctypes.c_ulonglong)
        for name in (
            "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
            "rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags",
            "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs",
        )
    ]

    def copy(self) -> "UserRegs":
        other = UserRegs()
        ctypes.memmove(ctypes.byref(other), ctypes.byref(self), ctypes.sizeof(UserRegs))
        return other

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name, _ in self._fields_}

    def __eq__(self, other) -> bool:  # exact comparison, every field
        return isinstance(other, UserRegs) and bytes(self) == bytes(other)


class SigInfo(ctypes.Structure):
    """The leading fields of siginfo_t that madtrace reads (128 bytes total)."""

    _fields_ = [
        ("si_signo", ctypes.c_int),
        ("si_errno", ctypes.c_int),
        ("si_code", ctypes.c_int),
        ("_pad0", ctypes.c_int),
        ("si_addr", ctypes.c_ulonglong),  # for SIGSEGV/SIGBUS/SIGTRAP; si_pid/si_uid otherwise
        ("_rest", ctypes.c_byte * 104),
    ]

    @property
    def si_pid(self) -> int:
        return self.si_addr & 0xFFFFFFFF


class PeekSigInfoArgs(ctypes.Structure):
    """struct ptrace_peeksiginfo_args (linux/ptrace.h)."""

    _fields_ = [("off", ctypes.c_uint64), ("flags", ctypes.c_uint32), ("nr", ctypes.c_int32)]


class SyscallInfo(ctypes.Structure):
    """struct ptrace_syscall_info (linux/ptrace.h) up to the entry arguments; at an
    exit stop ``nr`` holds the result (rval) and ``args[0]`` is_error."""

    _fields_ = [("op", ctypes.c_uint8), ("pad", ctypes.c_uint8 * 3), ("arch", ctypes.c_uint32),
                ("instruction_pointer", ctypes.c_uint64), ("stack_pointer", ctypes.c_uint64),
                ("nr", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]


class PtraceError(OSError):
    """A ptrace request failed; carries errno, request and tid."""


def _raise(request: int, tid: int) -> None:
    err = ctypes.get_errno()
    if err == errno.ESRCH:
        raise NoSuchProcessError(f"no such process or thread {tid} (or it is not stopped)")
    if err == errno.EPERM:
        raise PermissionDeniedError(
            f"ptrace request {request:#x} on {tid}: operation not permitted "
            "(already traced, different user, or kernel.yama.ptrace_scope)")
    raise PtraceError(err, f"ptrace request {request:#x} on {tid}: {os.strerror(err)}")


def ptrace(request: int, tid: int, addr: int = 0, data: int | ctypes.c_void_p = 0) -> int:
    ctypes.set_errno(0)
    result = _ptrace(request, tid, ctypes.c_void_p(addr), data if not isinstance(data, int) else ctypes.c_void_p(data))
    if result == -1 and ctypes.get_errno() != 0:
        _raise(request, tid)
    return result


def traceme() -> None:
    ptrace(PTRACE_TRACEME, 0)


def seize(tid: int, options: int) -> None:
    ptrace(PTRACE_SEIZE, tid, 0, options)


def interrupt(tid: int) -> None:
    ptrace(PTRACE_INTERRUPT, tid)


def set_options(tid: int, options: int) -> None:
    ptrace(PTRACE_SETOPTIONS, tid, 0, options)


def cont(tid: int, signum: int = 0) -> None:
    ptrace(PTRACE_CONT, tid, 0, signum)


def syscall(tid: int, signum: int = 0) -> None:
    ptrace(PTRACE_SYSCALL, tid, 0, signum)


def listen(tid: int) -> None:
    ptrace(PTRACE_LISTEN, tid)


def singlestep(tid: int, signum: int = 0) -> None:
    ptrace(PTRACE_SINGLESTEP, tid, 0, signum)


TRAP_FLAG = 0x100


def clear_stepped_trap_flag(tid: int, regs: UserRegs) -> UserRegs:
    """After a single step of madtrace's code (``regs``: the thread's registers
    at the step's trap): a trap flag that shows is no longer the kernel's own
    and is cleared.  Stepping a popfq makes the kernel take the flag for the
    program's (is_setting_trap_flag), and every later step, which finds
    TIF_SINGLESTEP set, keeps it so: the flag then stays set at PTRACE_CONT
    and PTRACE_DETACH, and the thread dies of SIGTRAP (TRAP_TRACE) one
    instruction later.  (GETREGS hides a flag the kernel set for a step.)"""
    if regs.eflags & TRAP_FLAG:
        regs.eflags &= ~TRAP_FLAG
        set_regs(tid, regs)
    return regs


def detach(tid: int, signum: int = 0) -> None:
    ptrace(PTRACE_DETACH, tid, 0, signum)


def get_regs(tid: int, regs: UserRegs | None = None) -> UserRegs:
    regs = regs if regs is not None else UserRegs()
    ptrace(PTRACE_GETREGS, tid, 0, ctypes.cast(ctypes.byref(regs), ctypes.c_void_p))
    return regs


def set_regs(tid: int, regs: UserRegs) -> None:
    ptrace(PTRACE_SETREGS, tid, 0, ctypes.cast(ctypes.byref(regs), ctypes.c_void_p))


def get_siginfo(tid: int) -> SigInfo:
    info = SigInfo()
    ptrace(PTRACE_GETSIGINFO, tid, 0, ctypes.cast(ctypes.byref(info), ctypes.c_void_p))
    return info


def set_siginfo(tid: int, info: SigInfo) -> None:
    ptrace(PTRACE_SETSIGINFO, tid, 0, ctypes.cast(ctypes.byref(info), ctypes.c_void_p))


def queued_signals(tid: int, most: int = 16) -> list[SigInfo]:
    """The first ``most`` signals queued for thread ``tid`` alone (not the process's
    shared queue) and not dequeued yet, without dequeuing them (PTRACE_PEEKSIGINFO)."""
    infos = (SigInfo * most)()
    args = PeekSigInfoArgs(0, 0, most)
    n = ptrace(PTRACE_PEEKSIGINFO, tid, ctypes.addressof(args), ctypes.cast(infos, ctypes.c_void_p))
    return list(infos[:n])


def get_sigmask(tid: int) -> int:
    """The blocked-signal mask of a stopped thread (bit N-1: signal N)."""
    mask = ctypes.c_uint64()
    ptrace(PTRACE_GETSIGMASK, tid, 8, ctypes.cast(ctypes.byref(mask), ctypes.c_void_p))
    return mask.value


def get_syscall_info(tid: int) -> SyscallInfo:
    """Where a stopped thread is with respect to system calls (entry, exit, none)."""
    info = SyscallInfo()
    ptrace(PTRACE_GET_SYSCALL_INFO, tid, ctypes.sizeof(info), ctypes.cast(ctypes.byref(info), ctypes.c_void_p))
    return info


def get_event_msg(tid: int) -> int:
    value = ctypes.c_ulong(0)
    ptrace(PTRACE_GETEVENTMSG, tid, 0, ctypes.cast(ctypes.byref(value), ctypes.c_void_p))
    return value.value


def peek_data(tid: int, addr: int) -> int:
    """One PTRACE_PEEKDATA word; only for benchmarks and fallbacks."""
    ctypes.set_errno(0)
    result = _ptrace(PTRACE_PEEKDATA, tid, ctypes.c_void_p(addr), None)
    if result == -1 and ctypes.get_errno() != 0:
        _raise(PTRACE_PEEKDATA, tid)
    return result & 0xFFFFFFFFFFFFFFFF


def tgkill(tgid: int, tid: int, signum: int) -> None:
    if _libc.syscall(234, tgid, tid, signum) != 0:  # SYS_tgkill
        err = ctypes.get_errno()
        if err == errno.ESRCH:
            raise NoSuchProcessError(f"no such thread {tid}")
        raise TracerInternalError(f"tgkill({tgid}, {tid}, {signum}): {os.strerror(err)}")
