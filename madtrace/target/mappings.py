# SPDX-License-Identifier: GPL-2.0-or-later
"""What madtrace mapped into one process, and how it comes out again.

Every ``SharedArea`` (areas.py) joins the ``MadtraceAreas`` of its process.  When
the session ends (detach, the end of a daemon, the REPL's ``detach``, Ctrl-C,
SIGTERM, a tracer error), with every thread stopped and every patch
reverted, ``release``:

1. runs each thread whose next instruction lies in a trampoline one
   instruction at a time until it leaves it (a few dozen instructions, no
   system call, recording off: the ring's limit is 0, so no wait);
2. gives every pending call its real return address back: a call that a
   call-site trampoline re-issued returns into that trampoline
   (``return_points``: the address after the re-issued call -> the site's
   own return address, wherever a thread's stack or registers hold it:
   vfork keeps it in %rdi while the child runs), a call of an
   entry-patched function returns through an exit stub (the shadow stacks:
   ``return_sources``, each giving (stack slot, addresses it may hold, real
   return address));
3. reads each thread's stack from its stack pointer to the end of its
   mapping: a signal frame whose saved %rip lies inside madtrace's code (its
   restorer, rt_sigreturn, tells it apart from a stale word) gets the
   original instruction where the area knows it (``original_of``), else keeps
   that area and its group mapped (a code area writes the rings of its
   group), and says so; any other word there is stale (``_scan_stacks``):
   left as it is; only the part of a code area its allocator handed out
   counts (``used_end``: a number of the program's may fall in the rest);
4. unmaps the rest (``before_unmap`` first: unwind information is taken
   back from the target's unwinder).

A fork child gets the same treatment on its copy (``release(copy=True)``),
except for areas with ``before_unmap`` steps (the child's copy of the
unwinder's lists may be locked by a thread that does not exist there).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import numpy as np

from ..binary.maps import read_maps
from ..errors import MadtraceError
from ..process import ptrace_raw as pr
from ..process.events import (INSTRUCTION_FAULTS, SignalStop, ThreadExited, ThreadKilled, TrapStop,
                              at_exit_event)
from ..process.remote_syscall import RemoteSyscalls
from ..process.stepping import step

STEP_LIMIT = 4096      # instructions a thread may take to leave a trampoline


@dataclass
class Release:
    """What ``release`` did."""
    unmapped: list[tuple[str, int]] = field(default_factory=list)     # (name, bytes)
    kept: list[tuple[str, int, str]] = field(default_factory=list)    # (name, bytes, why)
    returns: int = 0          # return addresses given back
    stepped: int = 0          # threads run out of a trampoline
    # the process was ending (every thread at its exit event stop): these went with it
    ended: list[tuple[str, int]] = field(default_factory=list)

    def line(self, pid: int) -> str:
        """One line for the user."""
        out = (f"took {len(self.unmapped)} mapping{'s' if len(self.unmapped) != 1 else ''} "
               f"({_size(sum(n for _, n in self.unmapped))}) out of process {pid}")
        if self.returns:
            out += f", gave {self.returns} pending call{'s' if self.returns != 1 else ''} " \
                   f"their return address back"
        if self.kept:
            out += (f"; left {len(self.kept)} ({_size(sum(n for _, n, _ in self.kept))}) "
                    f"mapped, still needed: {self.kept[0][2]}")
        return out


def _size(n: int) -> str:
    return f"{n / 1048576:.1f} MiB" if n >= 1048576 else f"{n // 1024} KiB"


class MadtraceAreas:
    """The areas madtrace mapped into one process (``tracee.madtrace_areas``)."""

    def __init__(self):
        self.areas: list = []             # SharedArea, in the order they were made
        # callables returning [(stack slot, addresses it may hold, real return address)]
        self.return_sources: list = []

    @classmethod
    def of(cls, tracee) -> "MadtraceAreas":
        if tracee.madtrace_areas is None:
            tracee.madtrace_areas = cls()
        return tracee.madtrace_areas

    def add(self, area) -> None:
        self.areas.append(area)

    def image_replaced(self) -> None:
        """exec: the old image and every mapping of it are gone."""
        for area in self.areas:
            area.mapped = False
        self.areas.clear()
        self.return_sources.clear()

    def mark(self) -> int:
        """Where the areas made from now on begin (``release(since=...)``)."""
        return len(self.areas)

    def release(self, tracee, copy: bool = False, since: int = 0) -> Release:
        """Unmap every area no thread can still need (every thread of ``tracee``
        stopped).  ``copy``: ``tracee`` is a fork child holding copies of these
        areas (and of the stacks they are returned to); the bookkeeping here
        stays the parent's.  ``since``: only the areas made after that
        ``mark()`` (a step that failed takes back what it mapped)."""
        result = Release()
        maps = read_maps(tracee.pid)
        # only what is still madtrace's memfd there (a fork child made before an area
        # existed has none of it, and a target may have unmapped one itself)
        areas = [a for a in self.areas[since:] if a.mapped and _still_ours(maps, a)]
        if not copy:
            for area in self.areas[since:]:
                if area.mapped and area not in areas:
                    area.mapped = False
        if not areas or not tracee.threads:
            if not copy:
                self.areas = [a for a in self.areas if a.mapped]
            return result
        if _ending(tracee):
            # exit_group under way: no thread will run a user instruction again and
            # the memory goes with the last one; nothing to take out, nothing kept
            result.ended = [(a.name, a.size) for a in areas]
            if not copy:
                for area in areas:
                    area.mapped = False
                self.areas = [a for a in self.areas if a.mapped]
            return result
        kept: dict[str, str] = {}             # group -> why
        _move_out(tracee, areas)
        result.stepped = _step_out(tracee, areas, kept)
        for source in self.return_sources if not since else ():     # function tracing's
            result.returns += _give_back(tracee.mem, source())
        result.returns += _scan_stacks(tracee, maps, areas, kept)
        for area in areas:
            if copy and area.before_unmap:
                kept.setdefault(area.group, "unwind information a fork child's unwinder holds")
        doomed = [a for a in areas if a.group not in kept]
        for area in areas:
            if area.group in kept:
                result.kept.append((area.name, area.size, kept[area.group]))
        if doomed:
            try:
                with RemoteSyscalls(tracee) as rs:
                    for area in doomed:
                        self._unmap(rs, area, result, copy)
            except MadtraceError as exc:
                for area in doomed:
                    if (area.name, area.size) not in result.unmapped:
                        result.kept.append((area.name, area.size, f"cannot unmap: {exc}"))
        if not copy:
            self.areas = [a for a in self.areas if a.mapped]
        return result

    def _unmap(self, rs, area, result: Release, copy: bool) -> None:
        try:
            if not copy:
                for step in area.before_unmap:
                    step(rs)
            rs.munmap(area.address, area.size)
        except MadtraceError as exc:
            result.kept.append((area.name, area.size, f"{area.name}: {exc}"))
            return
        if not copy:
            area.mapped = False
        result.unmapped.append((area.name, area.size))


def _ending(tracee) -> bool:
    """Every thread left is at its exit event stop: the process is ending."""
    states = [s for s in tracee.threads.values() if not s.gone]
    return bool(states) and all(not s.running and at_exit_event(s.last_event) for s in states)


def _inside(areas, address: int):
    for area in areas:
        if area.contains(address):
            return area
    return None


class _AnyOf:
    """Several areas as one (``contains``): a thread leaves mt_claim into the
    trampoline that called it, and must leave both."""

    def __init__(self, areas):
        self.areas = areas

    def contains(self, address: int) -> bool:
        return _inside(self.areas, address) is not None


def _move_out(tracee, areas) -> None:
    """Threads stopped inside an area that can send them back to the code it
    stands for (a function's copy: the original instruction) go there."""
    for tid, state in list(tracee.threads.items()):
        if state.running or state.gone:
            continue
        regs = tracee.get_regs(tid)
        area = _inside(areas, regs.rip)
        if area is not None and area.move_out is not None:
            area.move_out(tracee, tid, regs)


def _step_out(tracee, areas, kept: dict[str, str]) -> int:
    """Threads stopped inside a trampoline run until they leave every steppable
    area."""
    stepped = 0
    steppable = _AnyOf([a for a in areas if a.steppable])
    for tid, state in list(tracee.threads.items()):
        if state.running or state.gone:
            continue
        rip = tracee.get_regs(tid).rip
        area = _inside(areas, rip)
        if area is None:
            continue
        if not area.steppable or not isinstance(state.last_event, (TrapStop, SignalStop)):
            kept.setdefault(area.group, f"thread {tid} is stopped inside {area.name} "
                                        f"(at {rip:#x})")
            continue
        if step_until_out(tracee, tid, steppable):
            stepped += 1
        elif tid in tracee.threads:
            kept.setdefault(area.group, f"thread {tid} did not leave {area.name} "
                                        f"in {STEP_LIMIT} instructions")
    return stepped


def step_until_out(tracee, tid: int, area) -> bool:
    """Single-steps a stopped thread until its rip leaves ``area`` (anything with
    ``contains(address)``), or it exits; False after STEP_LIMIT instructions.
    The target's own signals met meanwhile are delivered when it next runs."""
    state = tracee.threads[tid]
    extra: list[int] = []
    try:
        for _ in range(STEP_LIMIT):
            event = step(tracee, tid)
            if event is None or isinstance(event, (ThreadExited, ThreadKilled)):
                return True
            if isinstance(event, SignalStop) and event.signum in INSTRUCTION_FAULTS:
                # the instruction faulted (a data-traced page, or a real fault): not
                # carried out, it faults again when the thread runs, where the engines
                # see it; stepping stops here
                return False
            if isinstance(event, SignalStop) and event.signum != signal.SIGTRAP:
                # the target's own signal: delivered when the thread is next resumed
                if state.pending_signal and state.pending_signal != event.signum:
                    extra.append(event.signum)
                else:
                    state.pending_signal = event.signum
                continue
            # the call page's restore code has a popfq: the trap flag would stay set
            if not area.contains(pr.clear_stepped_trap_flag(tid, tracee.get_regs(tid)).rip):
                return True
        return False
    finally:
        for signum in extra:
            pr.tgkill(tracee.pid, tid, signum)


def _give_back(mem, pending) -> int:
    """Each (slot, addresses, real return) whose slot still holds one of the
    addresses gets the real return address."""
    given = 0
    for slot, expected, original in pending:
        try:
            if mem.read_u64(slot) in expected:
                mem.write_u64(slot, original)
                given += 1
        except MadtraceError:
            continue      # the frame is gone with its stack
    return given


def _still_ours(maps, area) -> bool:
    if area.anonymous:
        return any(m.start == area.address and not m.path for m in maps)
    return any(m.start <= area.address < m.end and m.file_path == "/memfd:" + area.name
               for m in maps)


GENERAL_REGISTERS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11",
                     "r12", "r13", "r14", "r15")


def _registers_back(tracee, tid: int, regs, code) -> int:
    """Return points held in a register get their real address back: vfork
    (glibc's __libc_vfork pops its return address into %rdi before the system
    call, as the child may overwrite the stack, and pushes it back after), or
    code that read its return address; a stale copy of one (%rcx after a
    system call made in a copy) is as well served by the original."""
    given = 0
    for name in GENERAL_REGISTERS:
        value = getattr(regs, name)
        area = _inside(code, value)
        original = area.return_points.get(value) if area is not None else None
        if original is not None:
            setattr(regs, name, original)
            given += 1
    if given:
        tracee.set_regs(regs, tid)
    return given


# the kernel's signal frame (struct rt_sigframe): the handler's return address (the
# restorer), then the ucontext, whose saved %rip lies 176 bytes after it
SIGFRAME_RIP = 176 // 8
# rt_sigreturn, as the C libraries' restorers make it: glibc (mov $15, %rax), musl (%eax)
RESTORERS = (b"\x48\xc7\xc0\x0f\x00\x00\x00\x0f\x05", b"\xb8\x0f\x00\x00\x00\x0f\x05")


def _signal_frame_rip(mem, words, index: int) -> bool:
    """Whether ``words[index]`` is the saved %rip of a signal frame: the word
    SIGFRAME_RIP words below it is a restorer, whose code is rt_sigreturn."""
    if index < SIGFRAME_RIP:
        return False
    try:
        code = mem.read(int(words[index - SIGFRAME_RIP]), len(RESTORERS[0]))
    except MadtraceError:
        return False
    return any(code.startswith(r) for r in RESTORERS)


def _scan_stacks(tracee, maps, areas, kept: dict[str, str]) -> int:
    """Return points found on the threads' stacks get their real address back;
    so does a signal frame's saved %rip where its area knows the original
    instruction (``original_of``); another saved %rip in a code area keeps
    the area's group.  Any other word there is stale: no return, no
    sigreturn, no jump can reach it (the program sees madtrace's code only as
    return addresses, a system call's %rcx and signal frames, each handled
    here), so it is left as it is: a live frame's unused slot keeps what a
    call made long ago put there, maybe in an earlier session's area mapped
    at the same address.  An earlier session's area (``returns_known``
    False) is kept by any word pointing into it."""
    code = [a for a in areas if a.executable]
    if not code:
        return 0
    given = 0
    for tid, state in list(tracee.threads.items()):
        if state.running or state.gone:
            continue
        regs = tracee.get_regs(tid)
        area = _inside(areas, regs.rip)
        if area is not None:
            kept.setdefault(area.group, f"thread {tid} is stopped inside {area.name} "
                                        f"(at {regs.rip:#x})")
        given += _registers_back(tracee, tid, regs, code)
        rsp = regs.rsp & ~7
        stack = next((m for m in maps if m.start <= rsp < m.end), None)
        if stack is None:
            continue
        try:
            words = np.frombuffer(tracee.mem.read(rsp, stack.end - rsp), dtype="<u8")
        except MadtraceError:
            continue
        for area in code:
            # not past what the area's allocator handed out: a nopie program's areas lie
            # at low addresses, where its integers are too (churn's i * i kept one)
            end = area.end if area.used_end is None else area.used_end
            for index in np.nonzero((words >= area.address) & (words < end))[0]:
                value, slot = int(words[index]), rsp + 8 * int(index)
                original = area.return_points.get(value)
                if original is None and not area.returns_known:
                    kept.setdefault(area.group, f"thread {tid}'s stack holds {value:#x}, inside "
                                                f"{area.name} (at {slot:#x})")
                    continue
                if original is None and _signal_frame_rip(tracee.mem, words, int(index)):
                    original = area.original_of(value) if area.original_of else None
                    if original is None:
                        kept.setdefault(area.group, f"a signal interrupted thread {tid} inside "
                                                    f"{area.name} at {value:#x} (its frame at "
                                                    f"{slot:#x})")
                        continue
                if original is not None:
                    tracee.mem.write_u64(slot, original)
                    given += 1
    return given
