# SPDX-License-Identifier: GPL-2.0-or-later
"""System calls on traced memory through its alias (hybrid data engine).

The kernel never faults on a protected page a system call touches: the call
fails with EFAULT.  Where the traced memory is aliased (alias.py), a pointer
argument into it is replaced by the same address in the alias for the
duration of the call (the registers are put back at its exit, so the program
never sees the change), and no page is ever opened while other threads run.

Only arguments known to be pointers are redirected (``POINTERS``: the call's
buffer with its length, a structure of known size, a string); a call whose
traced memory is reached otherwise (an iovec's buffers, a pointer inside a
structure, execve's argv and envp) takes the engine's other way (its pages
open for the call).

futex: a private futex is keyed by (address space, address), so a wait on the
alias and a wake on the address itself would never meet.  A redirected futex
call drops FUTEX_PRIVATE_FLAG: a shared futex on shared memory is keyed by
(file, offset), the same through either address, and the kernel's own wakes
(clear_child_tid, robust lists) are shared ones.
"""

from __future__ import annotations

from ...trace.format import PAGE

ARG_REGS = ("rdi", "rsi", "rdx", "r10", "r8", "r9")
STRING = -1                    # a NUL-terminated string (checked up to two pages)
FUTEX_PRIVATE_FLAG = 128
FUTEX_CMD_MASK = 0x7F
FUTEX_WITH_UADDR2 = {3, 4, 5, 11, 12}   # requeue, cmp_requeue, wake_op, *_requeue_pi
SYS_FUTEX = 202

# nr -> ((pointer arg, size: bytes, STRING, or ("arg", k, element size)), ...)
POINTERS = {
    0: ((1, ("arg", 2, 1)),), 1: ((1, ("arg", 2, 1)),),                 # read write
    17: ((1, ("arg", 2, 1)),), 18: ((1, ("arg", 2, 1)),),               # pread64 pwrite64
    44: ((1, ("arg", 2, 1)), (4, ("arg", 5, 1))),                       # sendto
    45: ((1, ("arg", 2, 1)), (4, 128), (5, 4)),                         # recvfrom
    89: ((0, STRING), (1, ("arg", 2, 1))),                              # readlink
    267: ((1, STRING), (2, ("arg", 3, 1))),                             # readlinkat
    318: ((0, ("arg", 1, 1)),), 217: ((1, ("arg", 2, 1)),),             # getrandom getdents64
    78: ((1, ("arg", 2, 1)),),                                          # getdents
    2: ((0, STRING),), 257: ((1, STRING),), 21: ((0, STRING),),         # open openat access
    269: ((1, STRING),), 439: ((1, STRING),),                           # faccessat(2)
    4: ((0, STRING), (1, 144)), 6: ((0, STRING), (1, 144)),             # stat lstat
    5: ((1, 144),), 262: ((1, STRING), (2, 144)),                       # fstat newfstatat
    332: ((1, STRING), (4, 256)),                                       # statx
    7: ((0, ("arg", 1, 8)),),                                           # poll
    35: ((0, 16), (1, 16)), 230: ((2, 16), (3, 16)),                    # nanosleep clock_nanosleep
    228: ((1, 16),), 229: ((1, 16),), 96: ((0, 16), (1, 8)),            # clock_gettime/getres, gettimeofday
    201: ((0, 8),), 63: ((0, 390),), 99: ((0, 112),), 98: ((1, 144),),  # time uname sysinfo getrusage
    97: ((1, 16),), 302: ((2, 16), (3, 16)),                            # getrlimit prlimit64
    14: ((1, 8), (2, 8)),                                               # rt_sigprocmask
    79: ((0, ("arg", 1, 1)),),                                          # getcwd
    83: ((0, STRING),), 84: ((0, STRING),), 87: ((0, STRING),),         # mkdir rmdir unlink
    263: ((1, STRING),), 258: ((1, STRING),),                           # unlinkat mkdirat
    82: ((0, STRING), (1, STRING)), 316: ((1, STRING), (3, STRING)),    # rename renameat2
    22: ((0, 8),), 293: ((0, 8),),                                      # pipe pipe2
    52: ((1, 128), (2, 4)), 51: ((1, 128), (2, 4)),                     # getpeername getsockname
}


def _range(pointer: int, spec, args: list[int]) -> tuple[int, int]:
    if spec == STRING:      # at most two pages
        return pointer, (pointer & ~(PAGE - 1)) + 2 * PAGE
    if isinstance(spec, tuple):
        _, k, elem = spec
        return pointer, pointer + min(args[k] * elem, 1 << 34)
    return pointer, pointer + spec


def redirect(nr: int, args: list[int], alias, touches_protected) -> dict[str, int] | None:
    """The registers to change so that the call reaches traced memory through the
    alias ({register: value}; empty: nothing to change), or None when the call
    reaches protected memory in a way this cannot redirect.
    ``touches_protected(start, end)``: whether [start, end) holds a protected page."""
    if nr == SYS_FUTEX:
        return _futex(args, alias, touches_protected)
    specs = POINTERS.get(nr)
    if specs is None:
        return None
    changes: dict[str, int] = {}
    for index, spec in specs:
        pointer = args[index]
        if not pointer:
            continue
        start, end = _range(pointer, spec, args)
        if end <= start or not touches_protected(start, end):
            continue
        if spec == STRING:
            # the string's own page, and the next if it is protected too
            first = start & ~(PAGE - 1)
            end = first + PAGE if not touches_protected(first + PAGE, first + 2 * PAGE) else end
        if not alias.usable(start, end):
            return None
        changes[ARG_REGS[index]] = alias.image(pointer)
    return changes


def _futex(args: list[int], alias, touches_protected) -> dict[str, int] | None:
    changes: dict[str, int] = {}
    op = args[1]
    pointers = [0, 4] if op & FUTEX_CMD_MASK in FUTEX_WITH_UADDR2 else [0]
    for index in pointers:
        pointer = args[index]
        if not touches_protected(pointer, pointer + 4):
            continue
        if not alias.usable(pointer, pointer + 4):
            return None
        changes[ARG_REGS[index]] = alias.image(pointer)
    if changes:
        changes["rsi"] = op & ~FUTEX_PRIVATE_FLAG
    return changes
