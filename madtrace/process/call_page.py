# SPDX-License-Identifier: GPL-2.0-or-later
"""The call page: where a thread lent to remote system calls finds its own
registers again if the tracer dies meanwhile.

A remote system call (remote_syscall.py) gives a stopped thread other
registers for a while: the call's number and arguments, rip at a ``syscall``
instruction.  Only the tracer knew the thread's own registers; a tracer
killed then (SIGKILL, OOM) left the thread running on with the call's, into
whatever followed the gadget (the executable's start-up code, which started
the program a second time).  Here every scope has a slot of this page:

    slot + 0    mov rdi, rax; mov eax, getpid   the return point of a function
                                                called in the target: the
                                                tracer stops at this getpid
    slot + 8    syscall                         a remote call starts here
    slot + 10   restore code                    reached only if no tracer is left
    slot + 256  the thread's registers          written by the tracer at the
                (struct user_regs_struct)       scope's start

The tracer stops the thread at the system call's entry and exit
(PTRACE_SYSCALL), never at a trap, so nothing in a call raises a signal that
a process without its tracer would die of.  Without a tracer, the thread runs
on from the ``syscall`` into the restore code, which loads every
general-purpose register and rflags from the slot and jumps to the thread's
own rip: it continues as if the scope had ended (the call it was lent for
done or not; fs/gs bases and vector registers are never touched by a call).
The flags go through the stack 256 bytes below the thread's rsp, beyond its
red zone; nothing else is written there.

The page is a private mapping of a memfd named ``madtrace-calls`` (so that it
shows in /proc/PID/maps and a later session finds it: target/leftovers.py),
read-execute; the tracer writes it through /proc/PID/mem.  A fork child has
its own copy at the same address (``inherit``); a vfork child shares it.
"""

from __future__ import annotations

import struct
from typing import Callable

from . import ptrace_raw as pr

NAME = "madtrace-calls"
SLOT_SIZE = 512
SLOTS = 16
SIZE = SLOT_SIZE * SLOTS
SYSCALL_AT = 8                       # the slot's syscall instruction
RESTORE_AT = SYSCALL_AT + 2          # where the thread goes on after it without a tracer
REGS_AT = 256                        # the thread's own registers
SYS_GETPID = 39
TF = 0x100                           # the trap flag: never restored (it would trap at once)
RED_ZONE_SKIP = 256
# a system call interrupted by a stop restarts (what the kernel does when no handler runs)
ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK = 512, 513, 514, 516
SYS_RESTART_SYSCALL = 219
NO_SYSCALL = 0xFFFFFFFFFFFFFFFF
_REG_OFFSET = {field[0]: getattr(pr.UserRegs, field[0]).offset for field in pr.UserRegs._fields_}
# register number in the ModRM reg field, for mov r64, [rip + disp32]
_GPR = {"rax": 0, "rcx": 1, "rdx": 2, "rbx": 3, "rbp": 5, "rsi": 6, "rdi": 7, "r8": 8,
        "r9": 9, "r10": 10, "r11": 11, "r12": 12, "r13": 13, "r14": 14, "r15": 15}


def _rip_relative(prefix: bytes, at: int, target: int) -> bytes:
    """An instruction ``prefix`` + disp32 at slot offset ``at`` reaching ``target``."""
    end = at + len(prefix) + 4
    return prefix + struct.pack("<i", target - end)


def slot_code() -> bytes:
    """The code of one slot (position independent: every operand is in the slot)."""
    code = bytearray(b"\x48\x89\xc7"                             # mov rdi, rax
                     + b"\xb8" + struct.pack("<I", SYS_GETPID)    # mov eax, getpid
                     + b"\x0f\x05")                               # syscall
    assert len(code) == RESTORE_AT

    def regs(name: str) -> int:
        return REGS_AT + _REG_OFFSET[name]

    code += _rip_relative(b"\x48\x8b\x25", len(code), regs("rsp"))          # mov rsp, [rsp]
    code += b"\x48\x8d\xa4\x24" + struct.pack("<i", -RED_ZONE_SKIP)         # lea rsp, [rsp-256]
    code += _rip_relative(b"\xff\x35", len(code), regs("eflags"))           # push [eflags]
    code += b"\x9d"                                                         # popfq
    for name, number in _GPR.items():                                       # mov reg, [reg]
        rex = 0x48 | (4 if number >= 8 else 0)
        modrm = 0x05 | ((number & 7) << 3)
        code += _rip_relative(bytes([rex, 0x8b, modrm]), len(code), regs(name))
    code += b"\x48\x8d\xa4\x24" + struct.pack("<i", RED_ZONE_SKIP)          # lea rsp, [rsp+256]
    code += _rip_relative(b"\xff\x25", len(code), regs("rip"))              # jmp [rip]
    assert len(code) <= REGS_AT
    return bytes(code)


def continuation(regs: pr.UserRegs) -> pr.UserRegs:
    """Where the thread goes on from if its scope ends at a system call's exit:
    a call it was stopped in, interrupted (-ERESTART*), made again, as the
    kernel does when no signal handler runs; never the trap flag."""
    out = regs.copy()
    out.eflags &= ~TF
    error = (1 << 64) - out.rax
    if out.orig_rax != NO_SYSCALL and error in (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND,
                                                ERESTART_RESTARTBLOCK):
        out.rax = SYS_RESTART_SYSCALL if error == ERESTART_RESTARTBLOCK else out.orig_rax
        out.rip -= 2
        out.orig_rax = NO_SYSCALL
    return out


def needs_restart(regs: pr.UserRegs) -> bool:
    return continuation(regs).orig_rax != regs.orig_rax


class CallPage:
    """The call page of one address space (see the module)."""

    def __init__(self, address: int, owner: int, remote_calls: Callable):
        """``remote_calls(tracee)``: a scope of remote system calls in ``tracee``
        (RemoteSyscalls, which maps the page: this module sits below it)."""
        self.address = address
        self.owner = owner                  # the process that unmaps it at the end
        self.remote_calls = remote_calls
        self._free = list(range(SLOTS - 1, -1, -1))

    def inherit(self, child_pid: int) -> "CallPage":
        """A fork child's copy (same address, every slot free)."""
        return CallPage(self.address, child_pid, self.remote_calls)

    def take(self) -> int | None:
        """A free slot's address, or None when every slot is in use."""
        return self.address + self._free.pop() * SLOT_SIZE if self._free else None

    def give_back(self, slot: int) -> None:
        self._free.append((slot - self.address) // SLOT_SIZE)

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + SIZE

    def release(self, tracee) -> None:
        """Unmapped by its owner at the end of the session (a vfork child only
        forgets its parent's).  A tracer killed at this call's exit stop would
        leave the thread returning into the unmapped page: the one call not
        covered after the first four."""
        if tracee.pid == self.owner:
            with self.remote_calls(tracee) as rs:
                rs.call("munmap", self.address, SIZE)
        tracee.call_page = None


def page_image() -> bytes:
    code = slot_code()
    return b"".join(code + bytes(SLOT_SIZE - len(code)) for _ in range(SLOTS))
