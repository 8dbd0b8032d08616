# SPDX-License-Identifier: GPL-2.0-or-later
"""A killed hybrid session's aliases, taken out by the next session (at attach,
every thread stopped: target/leftovers.py calls ``recover_aliases`` once the
entries are restored and the old guard undone).

A hybrid session killed with SIGKILL leaves the program's traced memory as a
shared memfd mapped twice (alias.py): at the program's own addresses and at
their image (``address ^ ALIAS_BIT``), both named ``madtrace-alias``; its guard
(tracer death) mapped zeros over the probes' bitmap, so no probe reaches the
images any more, but a thread may still hold an image address in a register
(a probe under way, a memcpy a hook stub sent through the alias, a system call
the tracer had redirected, blocked since).  Taken out as a detach does
(``AliasMap.privatize``), from what is in the process now:

* each pair of mappings of one memfd: the image is the one a fork child does
  not get (MADV_DONTFORK, VmFlags ``dc``), else the one off the old guard's
  runs; a pair that cannot be told apart refuses the whole recovery: nothing
  is changed;
* every register of every thread that holds an image address gets the
  program's address; a blocking system call made with one restarts with the
  program's address (a futex wait with FUTEX_PRIVATE_FLAG again: the tracer
  took it off, and the memory is private again), a timed one as itself (its
  relative timeout starts again); one in restart_syscall (its address is in
  the kernel's hands) refuses the recovery;
* the probes' bitmap and the hook stubs' traced-page bitmap read zeros;
* each program range becomes private memory again (the module's file where
  its data segment maps one, anonymous elsewhere), with what it holds now and
  its protection; the images are unmapped.
The copies, hook stubs and bitmaps stay as areas of the old session, released
with the rest (target/mappings.py keeps them while a thread or a frame may be
in them); each copies area lists its return points (copy_returns.py), which
are given back as a detach gives them, and a thread blocked in a system call
made in a copy goes to the original code.
"""

from __future__ import annotations

from collections import defaultdict

from ...binary.address_space import AddressSpace
from ...binary.maps import read_maps
from ...errors import LeftoversError
from ...target.areas import TargetArea
from ...target.templates import Injector
from ...process.remote_syscall import (MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, PROT_READ,
                                       PROT_WRITE, RemoteSyscalls)
from .alias import ALIAS_BIT, MADV_REMOVE, MAP_NORESERVE, Origin
from .copy_returns import read_return_table
from .syscall_alias import FUTEX_PRIVATE_FLAG, SYS_FUTEX

ALIAS_NAME = "madtrace-alias"
GENERAL = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12",
           "r13", "r14", "r15")
ERESTARTSYS, ERESTART_RESTARTBLOCK = 512, 516
SYS_RESTART_SYSCALL = 219
PT_W = 2
PROT_EXEC = 4
PAGE = 4096


def recover_aliases(tracee, space: AddressSpace | None, areas: list[TargetArea],
                    runs: list[tuple[int, int]], data: TargetArea | None, L: Injector) -> str:
    """Takes the aliases of ``areas`` out (see the module); removes them from
    ``areas``; returns what was done, in a few words ('' when there were none).
    ``runs``: the (start, end) of the old guard's runs; the protections are the
    program's again (the guard undone, target/leftovers.py)."""
    for area in areas:
        if area.name.startswith("madtrace-copies-"):
            _known_returns(tracee.mem, area)
    aliases = [a for a in areas if a.name == ALIAS_NAME]
    if not aliases:
        return ""
    by_inode: dict[int, list[TargetArea]] = defaultdict(list)
    for area in aliases:
        by_inode[area.inode].append(area)
    own: list[TargetArea] = []
    images: list[TargetArea] = []
    not_copied = _dont_fork(tracee.pid)
    for group in by_inode.values():
        # the image is MADV_DONTFORK (alias.py); failing that, the guard's runs tell.
        # An image alone (its session was killed making the pair) is unmapped.
        mine = [a for a in group if a.address not in not_copied]
        if len(mine) == len(group):
            mine = [a for a in group
                    if any(a.address < end and start < a.end for start, end in runs)]
        if (not mine and len(group) > 1) or any(
                (a.address ^ ALIAS_BIT) not in {m.address for m in mine}
                for a in group if a not in mine and mine):
            raise LeftoversError(
                f"process {tracee.pid} still runs on a killed madtrace session's hybrid data "
                f"engine, whose aliases cannot be told from the program's memory "
                f"({group[0].name} at {group[0].address:#x}): nothing was changed")
        own += mine
        images += [a for a in group if a not in mine]
    threads = _registers_back(tracee, images)
    maps = read_maps(tracee.pid)
    with RemoteSyscalls(tracee) as rs:
        bitmap = _zeros_over_bitmap(rs, tracee.mem, data, L)
        if bitmap is not None:
            areas.append(bitmap)
        for area in areas:
            if area.name == "madtrace-traced":      # the hook stubs' traced pages: none
                rs.call("madvise", area.address, area.size, MADV_REMOVE)
        for area in own:
            _privatize(rs, tracee, space, area,
                       [m for m in maps if area.address <= m.start and m.end <= area.end])
        for area in images:
            rs.call("munmap", area.address, area.size, check=False)
    for area in own + images:
        areas.remove(area)
    size = sum(a.size for a in own)
    out = (f"{len(own)} aliased range{'s' if len(own) != 1 else ''} ({size / 1048576:.1f} MiB) "
           f"made the program's own memory again")
    if threads:
        out += f" ({threads} thread{'s' if threads != 1 else ''} given their addresses back)"
    return out


def _dont_fork(pid: int) -> set[int]:
    """Where the mappings a fork child does not get begin (VmFlags ``dc`` in
    /proc/PID/smaps: MADV_DONTFORK)."""
    out: set[int] = set()
    start = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                start = int(line.split("-", 1)[0], 16)
            elif line.startswith("VmFlags:") and " dc" in line and start is not None:
                out.add(start)
    return out


def _known_returns(mem, area: TargetArea) -> None:
    """A copies area's return points, as it lists them (copy_returns.py): the
    calls and system calls of its copies return to the original code, and a
    thread stopped at one (blocked in a system call made in a copy) goes there."""
    table = read_return_table(mem, area.address, area.end)
    if table is None:
        return
    area.return_points = table
    area.returns_known = True

    def move_out(tracee, tid: int, regs) -> None:
        original = table.get(regs.rip)
        if original is not None:
            regs.rip = original
            tracee.set_regs(regs, tid)
    area.move_out = move_out


def _registers_back(tracee, images: list[TargetArea]) -> int:
    """Every register holding an image address gets the program's address; a
    blocking call made with one restarts with it.  Returns the threads changed."""
    changed = 0
    for tid, state in list(tracee.threads.items()):
        if state.running or state.gone:
            continue
        regs = tracee.get_regs(tid)
        moved = [name for name in GENERAL
                 if any(a.contains(getattr(regs, name)) for a in images)]
        if not moved:
            continue
        if regs.orig_rax == SYS_RESTART_SYSCALL:
            raise LeftoversError(
                f"process {tracee.pid}: thread {tid} of a killed madtrace session's hybrid data "
                f"engine waits in a restarted system call on its alias: nothing was changed "
                f"(try again once it has returned)")
        for name in moved:
            setattr(regs, name, getattr(regs, name) ^ ALIAS_BIT)
        result = _signed(regs.rax)
        in_call = regs.orig_rax not in (-1, (1 << 64) - 1)
        if in_call and result == -ERESTART_RESTARTBLOCK:
            regs.rax = -ERESTARTSYS & ((1 << 64) - 1)      # the call itself again
        if in_call and regs.orig_rax == SYS_FUTEX and "rdi" in moved:
            regs.rsi |= FUTEX_PRIVATE_FLAG
        tracee.set_regs(regs, tid)
        changed += 1
    return changed


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _zeros_over_bitmap(rs, mem, data: TargetArea | None, L: Injector) -> TargetArea | None:
    """The probes' bitmap reads zeros, anonymous memory over it (as the old guard
    did if it fired); returns it as an area of the old session (it goes with
    the copies that read it)."""
    if data is None:
        return None
    table = data.address + L.MT_GUARD
    address = mem.read_u64(table + L.MT_GUARD_BITMAP)
    size = mem.read_u64(table + L.MT_GUARD_BITMAP_SIZE)
    if not (address and size):
        return None
    rs.mmap(address, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE)
    bitmap = TargetArea("madtrace-bitmap", address, size, False, group=data.group)
    bitmap.anonymous = True
    bitmap.returns_known = False
    return bitmap


def _privatize(rs, tracee, space, area: TargetArea, mappings) -> None:
    """The range of ``area`` private again, holding what it holds, each of its
    ``mappings`` (/proc/PID/maps lines) with its protection."""
    data = tracee.mem.read(area.address, area.size)
    for origin in _origins(space, area.address, area.end):
        flags = MAP_PRIVATE | MAP_FIXED
        if origin.is_file:
            scratch = (rs.saved_regs.rsp - 8192) & ~15
            tracee.mem.write(scratch, origin.path.encode() + b"\0")
            fd = rs.call("openat", -100, scratch, 0, check=False)
            if fd < 1 << 63:
                try:
                    rs.mmap(origin.start, origin.end - origin.start, PROT_READ | PROT_WRITE, flags,
                            fd, origin.offset)
                    continue
                finally:
                    rs.call("close", fd, check=False)
        rs.mmap(origin.start, origin.end - origin.start, PROT_READ | PROT_WRITE,
                flags | MAP_ANONYMOUS)
    tracee.mem.write(area.address, data)
    for m in mappings:
        prot = (PROT_READ if m.perms[0] == "r" else 0) | (PROT_WRITE if m.perms[1] == "w" else 0) \
            | (PROT_EXEC if m.perms[2] == "x" else 0)
        if prot != PROT_READ | PROT_WRITE:
            rs.mprotect(m.start, m.end - m.start, prot)


def _origins(space, start: int, end: int) -> list[Origin]:
    """What the program had mapped at [start, end): the pages of a module's
    writable segment that its file backs, anonymous memory elsewhere."""
    module = space.module_for(start) if space is not None else None
    pieces: list[Origin] = []
    if module is not None:
        for seg in module.image.loads:
            if not seg.flags & PT_W or not seg.filesz:
                continue
            lo = (module.bias + seg.vaddr) & ~(PAGE - 1)
            hi = (module.bias + seg.vaddr + seg.filesz + PAGE - 1) & ~(PAGE - 1)
            lo, hi = max(lo, start), min(hi, end)
            if lo < hi:
                offset = (seg.offset & ~(PAGE - 1)) + lo - ((module.bias + seg.vaddr) & ~(PAGE - 1))
                pieces.append(Origin(lo, hi, module.path, offset))
    out, at = [], start
    for piece in sorted(pieces, key=lambda o: o.start):
        if at < piece.start:
            out.append(Origin(at, piece.start))
        out.append(piece)
        at = piece.end
    if at < end:
        out.append(Origin(at, end))
    return out

