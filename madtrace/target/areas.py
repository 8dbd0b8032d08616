"""Memory madtrace creates inside the target.

``SharedArea``: a memfd created by a remote memfd_create, mapped MAP_SHARED in
the target (by remote mmap) and in the tracer (through /proc/PID/fd/N), so the
tracer reads and writes it with plain memory accesses and no ptrace call.
Used for the control block and rings (RW in the target) and for code areas
(R-X in the target, written by the tracer through its own RW mapping).  Every
area is named ``madtrace-...`` (its memfd shows as ``/memfd:madtrace-...`` in
the target's maps, which is how a later session finds what a killed one
left) and joins the process's ``MadtraceAreas`` (mappings.py), which takes it
out of the target when the session ends.

``find_gap_near``: a free, page-aligned address range for a code area within
rel32 reach (+-2 GiB) of a whole module, never overlapping a mapping, inside
the user address space, and keeping clear of the brk heap's and the main
stack's room to grow.
"""

from __future__ import annotations

import mmap
import os
from typing import Callable

from ..binary.maps import Mapping, read_maps
from ..errors import TracerInternalError
from ..process.remote_syscall import (MAP_FIXED_NOREPLACE, MAP_SHARED, PROT_EXEC, PROT_READ,
                                      PROT_WRITE, RemoteSyscalls)
from ..trace.format import PAGE

MFD_CLOEXEC = 1
NAME_PREFIX = "madtrace-"
MAPS_PREFIX = "/memfd:" + NAME_PREFIX
REL32_REACH = (1 << 31) - PAGE
HEAP_GROWTH_ROOM = 1 << 30
USER_TOP = 0x7FFFFFFFF000          # the end of the (47-bit) user address space: mmap goes no higher
DEFAULT_STACK_ROOM = 8 << 20       # below [stack]: its room to grow (RLIMIT_STACK's usual 8 MiB) ...
MAX_STACK_ROOM = 256 << 20         # ... at most, when the limit is higher or unlimited
FAR_AREA = 16 << 20                # an area at least this large is placed away from code


def page_round(n: int) -> int:
    return (n + PAGE - 1) & ~(PAGE - 1)


class TargetArea:
    """A mapping madtrace made in the target, as ``MadtraceAreas.release`` sees it."""

    def __init__(self, name: str, address: int, size: int, executable: bool,
                 group: str | None = None):
        self.name = name
        self.address = address
        self.size = size
        self.executable = executable
        # areas of one group stay or go together (a code area and the rings it writes)
        self.group = group or name
        # return address in the area -> where that call really returns
        self.return_points: dict[int, int] = {}
        # a thread stopped inside may be run out of it one instruction at a time
        # (trampolines: straight code without system calls)
        self.steppable = False
        # called with a RemoteSyscalls scope just before the area is unmapped
        self.before_unmap: list = []
        # a code area filled from its start (a bump allocator's): the end of what was
        # handed out; no code lies past it (None: anywhere in the area)
        self.used_end: int | None = None
        # (tracee, tid, regs): takes a thread stopped inside the area to the code it
        # stands for, if it can (the hybrid engine's copies, once data tracing is off)
        self.move_out: Callable | None = None
        # address -> the original instruction it stands for, or None: where a thread a
        # signal interrupted in the area resumes instead (the hybrid engine's copies)
        self.original_of: Callable | None = None
        self.inode = 0          # of its memfd, as /proc/PID/maps shows it (leftovers.py)
        # every return point into the area is in ``return_points`` (an area this session
        # made); an earlier session's is not known so: any word pointing into it may be
        # a return address, and keeps it (mappings.py)
        self.returns_known = True
        # anonymous memory, not a madtrace memfd (a bitmap an earlier session's guard
        # mapped zeros over): told by its address alone
        self.anonymous = False
        self.mapped = True

    @property
    def end(self) -> int:
        return self.address + self.size

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + self.size


class SharedArea(TargetArea):
    """One memfd-backed area, mapped in both processes."""

    def __init__(self, rs: RemoteSyscalls, size: int, name: str, executable: bool,
                 address: int | None = None, writable_code: bool = False, group: str | None = None):
        """``executable``: R-X in the target (code areas), else RW-;
        ``writable_code``: RWX (code that writes data next to itself);
        ``group``: areas that stay or go together (a code area and the rings it
        writes); default: the area alone."""
        from .mappings import MadtraceAreas
        tracee = rs.tracee
        if not name.startswith(NAME_PREFIX):
            raise TracerInternalError(f"area {name!r}: madtrace's areas are named {NAME_PREFIX}*")
        super().__init__(name, 0, page_round(size), executable or writable_code, group)
        self.mapped = False
    # the memfd's name goes on the stopped thread's stack, well below its red zone
        scratch = (rs.saved_regs.rsp - 4096) & ~15
        tracee.mem.write(scratch, name.encode() + b"\0")
        fd = rs.call("memfd_create", scratch, MFD_CLOEXEC)
        try:
            local_fd = os.open(f"/proc/{tracee.pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(local_fd, self.size)
                self.local = mmap.mmap(local_fd, self.size, mmap.MAP_SHARED,
                                       mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(local_fd)
            prot = PROT_READ | (PROT_EXEC if executable else PROT_WRITE)
            if writable_code:
                prot = PROT_READ | PROT_WRITE | PROT_EXEC
            flags = MAP_SHARED | (MAP_FIXED_NOREPLACE if address is not None else 0)
            hint = far_from_code(tracee.pid, self.size) if address is None and \
                self.size >= FAR_AREA and not (executable or writable_code) else 0
            self.address = rs.mmap(address or hint, self.size, prot, flags, fd, 0)
            if address is not None and self.address != address:
                rs.munmap(self.address, self.size)
                raise TracerInternalError(f"{name}: kernel placed it at {self.address:#x}, not {address:#x}")
            self.mapped = True
            MadtraceAreas.of(tracee).add(self)
        finally:
            rs.call("close", fd)

    def close_local(self) -> None:
        """The tracer's own mapping goes (the target's is ``MadtraceAreas.release``'s)."""
        try:
            self.local.close()
        except BufferError:   # a view of it is still alive: it goes with the tracer
            pass

    def write(self, address: int, data: bytes) -> None:
        """Write into the area at a target address (through the tracer's mapping)."""
        offset = address - self.address
        if offset < 0 or offset + len(data) > self.size:
            raise TracerInternalError(f"{self.name}: write outside the area at {address:#x}")
        self.local[offset:offset + len(data)] = data


class CodeArea:
    """A bump allocator over one SharedArea mapped R-X: code is written from its
    start up, and ``area.used_end`` follows the cursor (MadtraceAreas' stack
    scan looks below it only)."""

    def __init__(self, area: SharedArea):
        self.area = area
        self.end = area.end         # code goes below (the rest may hold other things)
        self.cursor = area.address

    @property
    def cursor(self) -> int:
        return self._cursor

    @cursor.setter
    def cursor(self, value: int) -> None:
        self._cursor = self.area.used_end = value

    def allocate(self, size: int) -> int:
        address = (self.cursor + 15) & ~15
        if address + size > self.end:
            raise TracerInternalError(f"code area {self.area.name} is full")
        self.cursor = address + size
        return address

    def room(self) -> int:
        return self.end - self.cursor


def find_gap_near(mappings: list[Mapping], lo: int, hi: int, size: int, brk: int | None = None,
                  stack_room: int = DEFAULT_STACK_ROOM) -> int:
    """A free range of ``size`` bytes from which every address in [lo, hi) is
    within rel32 reach (and vice versa), inside the user address space, clear
    of the brk heap's room to grow (``brk``: where the heap starts, the
    process's start_brk; without it, the [heap]'s start or else ``hi``, the
    main executable's end) and of the main stack's (``stack_room`` bytes
    below [stack]).  Without ASLR the libraries lie just below the stack."""
    size = page_round(size)
    allowed_lo = max(hi - REL32_REACH, 0x10000)
    allowed_hi = min(lo + REL32_REACH, USER_TOP)
    spans = sorted((m.start, m.end) for m in mappings)
    heap = next(((m.start, m.end) for m in mappings if m.path == "[heap]"), None)
    if brk is None:
        brk = heap[0] if heap is not None else hi
    spans.append((brk, brk + HEAP_GROWTH_ROOM))   # keep room for brk to grow
    stack = next(((m.start, m.end) for m in mappings if m.path == "[stack]"), None)
    if stack is not None:
        spans.append((max(stack[0] - stack_room, 0), stack[1]))
    spans.sort()
    candidates = []
    cursor = allowed_lo
    for start, end in spans + [(allowed_hi + size, allowed_hi + size)]:
        if start > cursor:
            gap_lo, gap_hi = cursor, min(start, allowed_hi)
            if gap_hi - gap_lo >= size:
                # closest to the module: the top of a gap below it, the bottom of one above it
                addr = gap_hi - size if gap_hi <= lo else gap_lo
                candidates.append((abs(addr - lo), addr))
        cursor = max(cursor, end)
    if not candidates:
        raise TracerInternalError(f"no free address range of {size} bytes within 2 GiB of {lo:#x}")
    return min(candidates)[1] & ~(PAGE - 1)


def far_from_code(pid: int, size: int) -> int:
    """Where a large area that needs no code nearby (rings, bitmaps) is asked
    for (a hint: the kernel places it elsewhere if that is taken): out of
    rel32 reach of the lowest library, so that the code areas its functions'
    copies need find room within 2 GiB of it.  The kernel's own choice is
    just below the libraries, and without ASLR there is little room above
    them (the main stack), so copies of libpython found none."""
    mappings = read_maps(pid)
    code = [m.start for m in mappings
            if m.path.startswith("/") and "x" in m.perms and m.start >= 1 << 32]
    if not code:
        return 0
    limit = min(code) - 2 * REL32_REACH           # the highest end the area may have
    size = page_round(size)
    below = limit
    for start, end in sorted(((m.start, m.end) for m in mappings), reverse=True):
        if start >= below:
            continue
        if end <= below - size:
            break                                 # the gap [end, below) holds it
        below = start
    hint = below - size
    return hint if hint >= 1 << 32 else 0


def gap_for_module(pid: int, lo: int, hi: int, size: int) -> int:
    brk, stack_room = _brk_and_stack_room(pid)
    return find_gap_near(read_maps(pid), lo, hi, size, brk, stack_room)


def _brk_and_stack_room(pid: int) -> tuple[int | None, int]:
    """The process's start_brk (/proc/PID/stat, field 47) and how far its main
    stack may grow (its RLIMIT_STACK; unlimited: MAX_STACK_ROOM)."""
    brk = None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        brk = int(fields[47 - 3]) or None
    except (OSError, IndexError, ValueError):
        pass
    room = DEFAULT_STACK_ROOM
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max stack size"):
                    soft = line.split()[3]
                    room = MAX_STACK_ROOM if soft == "unlimited" else \
                        min(max(int(soft), DEFAULT_STACK_ROOM), MAX_STACK_ROOM)
    except (OSError, IndexError, ValueError):
        pass
    return brk, page_round(room)
