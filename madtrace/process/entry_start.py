# SPDX-License-Identifier: GPL-2.0-or-later
"""Stop a freshly exec'd image at its entry point, without a trap.

At PTRACE_EVENT_EXEC only the new executable and the dynamic loader are
mapped; its libraries (their functions, their .data and .bss) appear once the
loader has run.  Tracing an image (launched, or exec'd later) starts where its
own code starts: at the executable's entry point (AT_ENTRY).

An int3 at the entry killed the program with SIGTRAP when madtrace was killed
before the loader reached it (nothing was left to take the trap).  Instead,
at the exec stop (``arm``):

* a page mapped in the target holds a stub that saves rax, rcx and r11 below
  the stack pointer, makes a ``getpid`` system call, takes the registers back
  and jumps to the real entry;
* the AT_ENTRY word of the auxiliary vector on the new stack points at the
  stub: the dynamic loader jumps there when it is done (a static executable
  starts at its entry: the exec stop is already there);
* the tracee runs with system call stops (``Tracee.trace_syscalls``) until
  the stub's ``getpid``.  At that call's exit stop (``claim``) the thread is
  put at the entry with its registers as the loader left them, the auxiliary
  vector's word is given back, the stub page is unmapped, and ``on_entry``
  runs with the thread stopped.

A madtrace killed at any point of this leaves a program that runs on: the
stub needs no tracer (it then stays mapped, and ``getauxval(AT_ENTRY)``
gives its address).

A static executable starts at its entry with no thread pointer (fs base 0)
until its C library sets one (glibc's __libc_setup_tls, musl's __init_tp,
Go's settls: ``arch_prctl(ARCH_SET_FS)``); madtrace's stubs find their
thread's ring through it, so a stub reached before that call kills the
program with SIGSEGV.  ``arm_static``: the thread runs with system call stops to the exit
of its first successful ``arch_prctl(ARCH_SET_FS)``, and tracing starts
there (``on_entry``).  The few functions on the stack then end as unmatched
exits, as in an attach.  A program that never sets one runs untraced to its
end (``never_set_fs``).
"""

from __future__ import annotations

import struct
from typing import Callable

from ..errors import TracerInternalError
from . import ptrace_raw as pr
from .events import SyscallStop
from .remote_syscall import RemoteSyscalls
from .tracee import Tracee

AT_NULL, AT_ENTRY = 0, 9
SYS_GETPID, SYS_ARCH_PRCTL, ARCH_SET_FS = 39, 158, 0x1002
SYSCALL_ENTRY, SYSCALL_EXIT = 1, 2
PAGE = 4096
PROT_READ, PROT_EXEC = 1, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
# the stub: rax, rcx and r11 (a system call's) kept below the stack pointer (nothing
# lives there at an entry point), getpid, the registers back, then jmp [rip + 0] to
# the entry (the 8 bytes after the stub)
_SAVE = bytes.fromhex("48894424f8" "48894c24f0" "4c895c24e8")   # mov [rsp-8], rax ...
_CALL = bytes.fromhex("b827000000" "0f05")                      # mov eax, 39; syscall
_LOAD = bytes.fromhex("488b4424f8" "488b4c24f0" "4c8b5c24e8")   # mov rax, [rsp-8] ...
_JUMP = bytes.fromhex("ff2500000000")                            # jmp [rip + 0]
STUB = _SAVE + _CALL + _LOAD + _JUMP
AFTER_SYSCALL = len(_SAVE) + len(_CALL)
NOT_OURS, ON_THE_WAY, AT_ENTRY_NOW = 0, 1, 2


class EntryStart:
    def __init__(self, tracee: Tracee, on_entry: Callable[[int], None] | None = None):
        """``on_entry(tid)``: called at the entry, every thread stopped (there is one)."""
        self.tracee = tracee
        self.on_entry = on_entry
        self.address: int | None = None       # the entry, while armed
        self.stub = 0
        self._auxv_slot = 0
        self._in_call = False                 # the stub's getpid entered, its exit next
        self._syscalls_before = False
        self.static = False                   # arm_static: waiting for ARCH_SET_FS
        self.never_set_fs = False             # a static program ended without one

    @property
    def armed(self) -> bool:
        return self.address is not None

    def arm(self, tid: int) -> bool:
        """At the exec stop of ``tid`` (the new image's only thread).  False: the
        thread is at the entry already (a static executable), nothing armed."""
        tracee = self.tracee
        entry = tracee.auxv_entry()
        regs = tracee.get_regs(tid)
        if regs.rip == entry:
            return False
        slot = self._find_auxv_slot(regs.rsp, entry)
        with RemoteSyscalls(tracee, tid) as rs:
            stub = rs.mmap(0, PAGE, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS)
        tracee.mem.write(stub, STUB + struct.pack("<Q", entry))
        tracee.mem.write(slot, struct.pack("<Q", stub))       # last: the loader goes there now
        self.address, self.stub, self._auxv_slot, self._in_call = entry, stub, slot, False
        self._syscalls_before = tracee.trace_syscalls
        tracee.trace_syscalls = True
        return True

    def arm_static(self, tid: int) -> None:
        """At the exec stop of a static executable (``arm`` said False): tracing
        starts once the program has its thread pointer (the module)."""
        self.address, self.static, self._in_call = self.tracee.get_regs(tid).rip, True, False
        if self.tracee.call_page is None:
            # mapped now, at the exec stop, where a tracer killed during its calls leaves
            # the thread at the entry (remote_syscall.py); at the arch_prctl, the thread
            # is inside the C library's start-up, with registers the page cannot restore
            with RemoteSyscalls(self.tracee, tid):
                pass
        self._syscalls_before = self.tracee.trace_syscalls
        self.tracee.trace_syscalls = True

    def _step_static(self, tracee: Tracee, event: SyscallStop) -> int:
        info = pr.get_syscall_info(event.tid)
        if info.op == SYSCALL_ENTRY:
            self._in_call = info.nr == SYS_ARCH_PRCTL and info.args[0] == ARCH_SET_FS
        elif info.op == SYSCALL_EXIT and self._in_call and info.nr == 0:
            self.disarm()
            return AT_ENTRY_NOW          # stopped at that call's exit: fs is set
        tracee.resume(event.tid, 0)
        return ON_THE_WAY

    def _find_auxv_slot(self, rsp: int, entry: int) -> int:
        """The address of AT_ENTRY's value in the auxiliary vector on the new stack
        (argc, argv..., 0, envp..., 0, then the auxv pairs)."""
        read = self.tracee.mem.read_u64
        argc = read(rsp)
        at = rsp + 8 * (argc + 2)
        while read(at):                         # the environment
            at += 8
        at += 8
        for _ in range(256):
            key, value = read(at), read(at + 8)
            if key == AT_NULL:
                break
            if key == AT_ENTRY:
                if value != entry:
                    raise TracerInternalError(f"AT_ENTRY on the stack is {value:#x}, not {entry:#x}")
                return at + 8
            at += 16
        raise TracerInternalError("no AT_ENTRY in the auxiliary vector on the stack")

    def disarm(self) -> None:
        """Before the entry was reached (a detach): the auxiliary vector's word
        back; the stub stays, the loader may have taken its address already."""
        if self.address is not None and self.tracee.threads:
            if not self.static:
                self.tracee.mem.write(self._auxv_slot, struct.pack("<Q", self.address))
            self.tracee.trace_syscalls = self._syscalls_before
        self.address, self.static = None, False

    def forget(self) -> None:
        """The image went (an exec) with the stub and the auxiliary vector in it."""
        if self.address is not None:
            self.tracee.trace_syscalls = self._syscalls_before
        self.address, self.static = None, False

    def step(self, tracee: Tracee, event: SyscallStop) -> int:
        """What ``event`` is: NOT_OURS; ON_THE_WAY (the stub's getpid entered: the
        thread was resumed to the call's exit); AT_ENTRY_NOW (that exit: the
        thread stands at the entry with the loader's registers, still stopped)."""
        if tracee is not self.tracee or self.address is None:
            return NOT_OURS
        if self.static:
            return self._step_static(tracee, event)
        regs = tracee.get_regs(event.tid)
        if regs.rip != self.stub + AFTER_SYSCALL or regs.orig_rax != SYS_GETPID:
            return NOT_OURS
        if not self._in_call:
            self._in_call = True
            tracee.resume(event.tid, 0)            # system call stops on: to its exit
            return ON_THE_WAY
        stub, entry = self.stub, self.address
        # at the entry with the loader's registers first, then the stub goes: a tracer
        # killed during the munmap leaves the thread to the call page's restore code,
        # which gives it the registers saved at the scope's start (in the stub, once
        # unmapped, it died of SIGSEGV)
        read = tracee.mem.read_u64
        regs.rax, regs.rcx, regs.r11 = read(regs.rsp - 8), read(regs.rsp - 16), read(regs.rsp - 24)
        regs.rip = entry
        tracee.set_regs(regs, event.tid)
        with RemoteSyscalls(tracee, event.tid) as rs:   # at a syscall-exit stop
            rs.munmap(stub, PAGE)
        self.disarm()
        return AT_ENTRY_NOW

    def claim(self, tracee: Tracee, event: SyscallStop) -> bool:
        """A syscall claimer (the controller's loop): at the entry, ``on_entry``
        runs, then the thread goes on."""
        state = self.step(tracee, event)
        if state == AT_ENTRY_NOW:
            if self.on_entry is not None:
                self.on_entry(event.tid)
            tracee.resume(event.tid, 0)
        return state != NOT_OURS
