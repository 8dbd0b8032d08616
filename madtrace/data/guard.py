# SPDX-License-Identifier: GPL-2.0-or-later
"""The guard: what keeps the target alive if the tracer dies mid-trace.

While pages are protected, the target's SIGSEGV action is madtrace's guard
(template ``guard`` of injector/trampolines.S, table and code in the data
area; layout: injector/layout.h "The guard"), and while breakpoints are in
(call_hooks.py: the allocation tracker, --data-in) its SIGTRAP action too.
A live tracer never lets its own faults and traps reach the target, so the
guard runs only for a signal of the target's own that the tracer delivers
(it names the thread first: ``delivering``), or when no tracer is left:
then it gives every page its original protection back (the runs table,
kept current by ``update``), writes back finished slots, takes the
breakpoints out (``add_breakpoint``), gives calls that were to return
through a trap their real return address (``set_trap``), puts the target's
own actions back, and the program goes on.

The target's own ``rt_sigaction(SIGSEGV, ...)`` calls are answered from the
table (``emulate``), so the target sees and sets its own action exactly as
without madtrace.  A fork child gets the target's action back with its pages
(``restore_in``).

SIGSEGV must never be blocked while pages are protected: a fault of
madtrace's on a blocked SIGSEGV makes the kernel reset the action to SIG_DFL.
So the kernel gets the target's SIGSEGV handler with SA_NODEFER, and every
other action without SIGSEGV in its mask (``kernel_action``); the target reads
its actions back as it set them (``answer_old``).  A SIGSEGV the target blocks
itself with sigprocmask is not handled (docs/known-limits.md).
"""

from __future__ import annotations

import os
import struct
import time

from ..errors import TracerInternalError
from ..target.templates import load_injector
from ..process.remote_syscall import RemoteSyscalls

SIGSEGV, SIGTRAP = 11, 5
SA_SIGINFO, SA_RESTORER = 0x4, 0x04000000
SIGACTION_SIZE = 32     # kernel struct sigaction: handler, flags, restorer, mask (8 bytes)
SA_NODEFER = 0x40000000
SEGV_BIT = 1 << (SIGSEGV - 1)
SIG_DFL, SIG_IGN = 0, 1
LOOK_INTERVAL = 0.02                 # seconds between two looks at SigCgt
AT_FDCWD, O_RDONLY, O_NONBLOCK, O_CLOEXEC, O_ASYNC = -100, 0, 0o4000, 0o2000000, 0o20000
F_SETFL, F_SETOWN, F_SETSIG = 4, 8, 10


def kernel_action(raw: bytes, signum: int) -> bytes:
    """The action as the kernel gets it while data tracing: SIGSEGV never blocked."""
    handler, flags, restorer, mask = struct.unpack("<QQQQ", raw)
    if handler not in (SIG_DFL, SIG_IGN):
        mask &= ~SEGV_BIT
        if signum == SIGSEGV:
            flags |= SA_NODEFER
    return struct.pack("<QQQQ", handler, flags, restorer, mask)


def _same_file(path: str, fd: int) -> bool:
    """Whether ``path`` (a target's /proc/PID/fd/N) is the file of our ``fd``."""
    try:
        there, here = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


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
        self.lost = False                    # the kernel reset the action (look_for_reset)
        self.resets_undone = 0
        self._next_look = 0.0
        # the guard gave a fault of the target's own back to the target's action, and
        # the tracer delivered it: reinstall at the next system call exit
        self.pending_reinstall = False
        self._free_traps = list(range(self.L.MT_GUARD_MAX_TRAPS - 1, -1, -1))
        self.pending_trap_reinstall = False
        self.trap_guard = False              # the guard is (or was) the SIGTRAP action
        self._death_pipe = -1                # madtrace's end of the death pipe (watch_tracer)
        self.originals: dict[int, bytes] = {}   # signal -> the target's own action, where
        #                                         the kernel has kernel_action() of it
        guard = self.L.templates["guard"]
        restorer = self.code + guard.size
        area.area.write(self.code, bytes(guard.instantiate(self.code, table=self.table)))
        area.area.write(restorer, self.L.templates["sigreturn"].code)
        # not SA_ONSTACK: a program's alternate stack is mostly in traced memory (the
        # heap: python3 -X faulthandler's; an anonymous mapping, .bss), protected, so
        # the kernel could not write the guard's signal frame there and killed the
        # program with SIGSEGV (6 of 10 SIGKILLs of the tracer under faulthandler)
        self._write(self.L.MT_GUARD_SELF,
                    struct.pack("<QQQQ", self.code, SA_SIGINFO | SA_RESTORER, restorer, 0))

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
    def traps_installed(self) -> bool:
        return bool(self._u64(self.L.MT_GUARD_TRAP_ACTIVE))

    @property
    def fired(self) -> bool:
        return bool(self._u64(self.L.MT_GUARD_FIRED))

    def set_tracer(self, pid: int) -> None:
        """madtrace's pid: its death signal (PR_SET_PDEATHSIG) is recognised."""
        self._u64(self.L.MT_GUARD_TRACER, pid)

    def watch_tracer(self, rs: RemoteSyscalls) -> None:
        """Attached (no death signal of a parent): a pipe whose only writer is
        madtrace; the target holds its read end with O_ASYNC, owner itself and
        F_SETSIG SIGSEGV, so that the kernel signals the target when madtrace
        dies, whatever kills it, and the guard gives every page back then, not
        only at the next fault (a first fault in a thread that blocks SIGSEGV,
        as a new glibc thread does at its start, makes the kernel reset the
        action to SIG_DFL).  docs/known-limits.md: what it did not cure."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            rs.tracee.mem.write(self.scratch, f"/proc/{os.getpid()}/fd/{read_end}".encode() + b"\0")
            fd = rs.call("openat", AT_FDCWD, self.scratch, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        finally:
            os.close(read_end)
        try:
            rs.call("fcntl", fd, F_SETOWN, rs.tracee.pid)
            rs.call("fcntl", fd, F_SETSIG, SIGSEGV)
            rs.call("fcntl", fd, F_SETFL, O_ASYNC | O_NONBLOCK)
        except BaseException:
            rs.call("close", fd, check=False)
            os.close(write_end)
            raise
        self._u64(self.L.MT_GUARD_DEATH_FD, fd)
        self._death_pipe = write_end

    def unwatch(self, rs: RemoteSyscalls | None) -> None:
        """The target's end closed first (closing madtrace's would signal it), and
        O_ASYNC taken off it before: the signal goes to whoever holds that open
        file, not to an fd.  A vfork child holds a copy until its exit releases
        its file table, which comes after the release of its memory (its
        parent's vfork-done): closing madtrace's end in that gap sent the target
        SIGSEGV (SI_SIGIO), which the detach then delivered as the target's own
        (test_detach_death_pipe.py).  An fd that is no longer the pipe (the
        program closed it, the number was given again) is left alone."""
        fd = self._u64(self.L.MT_GUARD_DEATH_FD)
        if fd and rs is not None and self._death_pipe >= 0 and \
                _same_file(f"/proc/{rs.tracee.pid}/fd/{fd}", self._death_pipe):
            rs.call("fcntl", fd, F_SETFL, O_NONBLOCK)
            rs.call("close", fd, check=False)
        self._u64(self.L.MT_GUARD_DEATH_FD, 0)
        if self._death_pipe >= 0:
            os.close(self._death_pipe)
            self._death_pipe = -1

    def set_bitmap(self, address: int, size: int) -> None:
        """The hybrid engine's alias bitmap: the guard maps zeros over it (no tracer)."""
        self._u64(self.L.MT_GUARD_BITMAP_SIZE, size)
        self._u64(self.L.MT_GUARD_BITMAP, address)

    def update(self, runs) -> None:
        """``runs``: (start, end, original PROT_*) of every protected page run."""
        runs = list(runs)[:self.L.MT_GUARD_MAX_RUNS]
        self.truncated_runs = max(0, len(runs) - self.L.MT_GUARD_MAX_RUNS)
        data = b"".join(struct.pack("<QQQ", s, e - s, p) for s, e, p in runs)
        self._u64(self.L.MT_GUARD_NRUNS, 0)            # never a half-written table
        self._write(self.L.MT_GUARD_RUNS, data)
        self._u64(self.L.MT_GUARD_NRUNS, len(runs))

    # ------------------------------------------------- breakpoints and traps
    def add_breakpoint(self, address: int, original: bytes, page_prot: int) -> None:
        """int3s at ``address``, one per byte of ``original`` (1 to 8 bytes, the
        ones they replace; layout.h MT_GUARD_BREAKS)."""
        n = self._u64(self.L.MT_GUARD_NBREAKS)
        if n >= self.L.MT_GUARD_MAX_BREAKS:
            raise TracerInternalError("too many breakpoints for the guard's table")
        if not 1 <= len(original) <= 8:
            raise TracerInternalError(f"a breakpoint of {len(original)} bytes")
        self._write(self.L.MT_GUARD_BREAKS + n * self.L.MT_GUARD_BREAK_SIZE,
                    struct.pack("<QQBB6x", address, int.from_bytes(original, "little"),
                                page_prot, len(original)))
        self._u64(self.L.MT_GUARD_NBREAKS, n + 1)

    def remove_breakpoints(self, addresses) -> None:
        size = self.L.MT_GUARD_BREAK_SIZE
        n = self._u64(self.L.MT_GUARD_NBREAKS)
        raw = self._read(self.L.MT_GUARD_BREAKS, n * size)
        kept = [raw[i:i + size] for i in range(0, len(raw), size)
                if struct.unpack_from("<Q", raw, i)[0] not in set(addresses)]
        self._u64(self.L.MT_GUARD_NBREAKS, 0)
        self._write(self.L.MT_GUARD_BREAKS, b"".join(kept))
        self._u64(self.L.MT_GUARD_NBREAKS, len(kept))

    def new_trap(self) -> int:
        """A free trap entry (its index), or -1 when the table is full."""
        if not self._free_traps:
            return -1
        index = self._free_traps.pop()
        self._u64(self.L.MT_GUARD_NTRAPS, max(self._u64(self.L.MT_GUARD_NTRAPS), index + 1))
        return index

    def set_trap(self, index: int, trap: int, return_address: int, stack_slot: int) -> None:
        """A call returns through ``trap`` instead of ``return_address`` (the value
        at ``stack_slot``)."""
        self._write(self.L.MT_GUARD_TRAPS + index * self.L.MT_GUARD_TRAP_SIZE,
                    struct.pack("<QQQ", trap, return_address, stack_slot))

    def free_trap(self, index: int) -> None:
        self._write(self.L.MT_GUARD_TRAPS + index * self.L.MT_GUARD_TRAP_SIZE, bytes(8))
        self._free_traps.append(index)

    def install_traps(self, rs: RemoteSyscalls) -> None:
        """The guard becomes the SIGTRAP action too (breakpoints are in)."""
        if self.trap_guard:
            return
        self.trap_guard = True
        if rs.call("rt_sigaction", SIGTRAP, self.table + self.L.MT_GUARD_SELF,
                   self.table + self.L.MT_GUARD_TRAP_ACTION, 8) == 0:
            self._u64(self.L.MT_GUARD_TRAP_ACTIVE, 1)

    # ------------------------------------------------------------- actions
    def install(self, rs: RemoteSyscalls) -> None:
        """The guard becomes the SIGSEGV action; the target's goes to the table.
        Actions already installed with SIGSEGV in their mask get it removed."""
        scratch = self.scratch
        mem = rs.tracee.mem
        for signum in range(1, 65):
            if signum in (9, 19, SIGSEGV, SIGTRAP):
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
        """After the guard handed a signal to the target's own action, or the kernel
        reset it (``look_for_reset``)."""
        if self.lost and self.installed and not self.fired:
            rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_SELF, 0, 8)
            self.resets_undone += 1
        self.lost = False
        if self.pending_reinstall and not self.installed and not self.fired:
            rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_SELF, 0, 8)
            self._u64(self.L.MT_GUARD_ACTIVE, 1)
            self.reinstalls += 1
        if self.pending_trap_reinstall and not self.traps_installed and not self.fired:
            rs.call("rt_sigaction", SIGTRAP, self.table + self.L.MT_GUARD_SELF, 0, 8)
            self._u64(self.L.MT_GUARD_TRAP_ACTIVE, 1)
            self.reinstalls += 1
        self.pending_reinstall = self.pending_trap_reinstall = False

    @property
    def reinstall_due(self) -> bool:
        return self.pending_reinstall or self.pending_trap_reinstall or self.lost

    def look_for_reset(self, pid: int) -> None:
        """Whether the kernel reset the SIGSEGV action to SIG_DFL behind the guard's
        back (its bit gone from SigCgt in /proc/PID/status; looked at every
        LOOK_INTERVAL seconds at most): a fault of madtrace's in a thread that
        blocks SIGSEGV does (force_sig_info; glibc blocks every signal around a
        thread's creation, in the creating thread and in the new one until it
        runs its start function).  Seen on http.server in 2 of 3 attaches, from
        2 s in to the end; a tracer killed then left every later fault, and the
        death pipe's own signal, to SIG_DFL.  Put back at the next system call
        exit (``reinstall``)."""
        now = time.monotonic()
        if now < self._next_look or not self.installed or self.fired or self.lost:
            return
        self._next_look = now + LOOK_INTERVAL
        try:
            with open(f"/proc/{pid}/status") as f:
                caught = int(f.read().split("SigCgt:", 1)[1].split(None, 1)[0], 16)
        except (OSError, IndexError, ValueError):
            return
        self.lost = not caught & SEGV_BIT

    def delivering(self, signum: int, tid: int) -> None:
        """A SIGSEGV or SIGTRAP of the target's own is about to be delivered to
        thread ``tid``: the guard hands it to the target's action (any other
        signal it gets means that no tracer is left)."""
        self._u64(self.L.MT_GUARD_DELIVER_TID, tid)
        if signum == SIGSEGV and not self.installed:
            self.pending_reinstall = True
        elif signum == SIGTRAP and not self.traps_installed and self.trap_guard:
            self.pending_trap_reinstall = True

    def remove(self, rs: RemoteSyscalls) -> None:
        """The target's own actions back (tracing ends)."""
        self.unwatch(rs)
        if not self.fired:
            self._actions_back(rs, True, self.trap_guard)
        self._restore_others(rs)

    def take_back(self, rs: RemoteSyscalls) -> None:
        """An install that failed, undone as far as it went: the death pipe, the
        actions the guard took (not a table it never filled), the others' masks."""
        self.unwatch(rs)
        self._actions_back(rs, self.installed, self.traps_installed)
        self._restore_others(rs)
        self.originals.clear()

    def _actions_back(self, rs: RemoteSyscalls, segv: bool, trap: bool) -> None:
        """The target's SIGSEGV (and SIGTRAP) action from the table."""
        if segv:
            rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_ACTION, 0, 8)
            self._u64(self.L.MT_GUARD_ACTIVE, 0)
        if trap:
            rs.call("rt_sigaction", SIGTRAP, self.table + self.L.MT_GUARD_TRAP_ACTION, 0, 8)
            self._u64(self.L.MT_GUARD_TRAP_ACTIVE, 0)

    def _restore_others(self, rs: RemoteSyscalls) -> None:
        for signum, raw in self.originals.items():
            rs.tracee.mem.write(self.scratch, raw)
            rs.call("rt_sigaction", signum, self.scratch, 0, 8)

    def restore_in(self, rs: RemoteSyscalls) -> None:
        """A fork child: the target's actions back in the child (same addresses);
        its copy of the death pipe's end closed (its owner is the parent)."""
        fd = self._u64(self.L.MT_GUARD_DEATH_FD)
        if fd:
            rs.call("close", fd, check=False)
        rs.call("rt_sigaction", SIGSEGV, self.table + self.L.MT_GUARD_ACTION, 0, 8)
        if self.trap_guard:
            rs.call("rt_sigaction", SIGTRAP, self.table + self.L.MT_GUARD_TRAP_ACTION, 0, 8)
        self._restore_others(rs)

    def answers(self, signum: int) -> bool:
        """rt_sigaction(signum) is answered from the table."""
        return signum == SIGSEGV or (signum == SIGTRAP and self.trap_guard)

    def emulate(self, mem, signum: int, new: int, old: int) -> bool:
        """The target's rt_sigaction(SIGSEGV or SIGTRAP, new, old, 8), answered from
        the table.  True if the kernel must get the new action now (the guard is
        aside while the target's own signal is handled)."""
        field = self.L.MT_GUARD_ACTION if signum == SIGSEGV else self.L.MT_GUARD_TRAP_ACTION
        current = self._read(field, SIGACTION_SIZE)
        if new:
            raw = mem.read(new, SIGACTION_SIZE)
            if signum == SIGSEGV:
                self._set_action(raw)
            else:
                self._write(field, raw)
        if old:
            mem.write(old, current)
        aside = not self.installed if signum == SIGSEGV else not self.traps_installed
        return bool(new) and aside and not self.fired

    def deliver_now(self, rs: RemoteSyscalls, signum: int) -> None:
        """The guard is aside (a signal of the target's own is being handled): the
        kernel gets the target's action as set just now."""
        field = self.L.MT_GUARD_DELIVER if signum == SIGSEGV else self.L.MT_GUARD_TRAP_ACTION
        rs.call("rt_sigaction", signum, self.table + field, 0, 8)

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
