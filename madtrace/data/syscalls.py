# SPDX-License-Identifier: GPL-2.0-or-later
"""System calls under data tracing (the data engine's other half).

The target runs under PTRACE_SYSCALL while data tracing is on.
* Calls in ``SAFE`` neither read nor write user memory through a pointer nor
  change the address space: the C loop resumes them at once.
* A call whose arguments reach protected pages (syscall_memory.py) is skipped
  at its entry (orig_rax = -1), rewound at its exit, and runs again with those
  pages open; they are closed at its real exit.  Other threads keep running
  meanwhile: their accesses to those pages in that window are missed, and
  each such window is counted (``open_windows``).
* The address space stays in step: brk growth extends the heap region; an
  anonymous private mapping the target creates (malloc's large blocks, thread
  arenas; not stacks) becomes a traced region; munmap and mremap drop or move
  traced pages; the target's own mprotect of traced pages is run for real,
  remembered as those pages' protection, and the pages are closed again.
"""

from __future__ import annotations

from collections import Counter

from ..binary.maps import read_maps, unmapped_parts
from ..process import ptrace_raw as pr
from ..process.events import SyscallStop
from ..process.remote_syscall import RemoteSyscalls
from .block_events import syscall_ranges
from ..trace.format import PAGE
from .regions import Region, page_runs
from .hybrid.syscall_alias import redirect
from .syscall_memory import syscall_pages
from .open_window import open_window

SYS_MMAP, SYS_MPROTECT, SYS_MUNMAP, SYS_BRK, SYS_MREMAP, SYS_MADVISE = 9, 10, 11, 12, 25, 28
MADV_ZEROING = frozenset({4, 8, 24})    # MADV_DONTNEED, MADV_FREE, MADV_DONTNEED_LOCKED
SYS_RT_SIGACTION, SIGSEGV = 13, 11
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_STACK = 0x01, 0x02, 0x20, 0x20000
# system calls that never touch user memory through a pointer nor change mappings
SAFE = frozenset({
    3, 8, 24, 32, 33, 34, 39, 60, 62, 102, 104, 107, 108, 110, 186, 200, 231, 234, 292,
})
MAPPING_CALLS = frozenset({SYS_MMAP, SYS_MPROTECT, SYS_MUNMAP, SYS_BRK, SYS_MREMAP})
NO_RESULT = 0xFFFFFFFFFFFFFFFF
ERESTARTSYS, ERESTART_RESTARTBLOCK = 512, 516   # the kernel's, not in errno
SYS_RESTART_SYSCALL = 219


def syscall_op(tid: int) -> tuple[int, int, list[int], int, int]:
    """(1 entry | 2 exit, the syscall number at entry / the result at exit, the
    arguments at entry, the address of the syscall instruction's end, the stack
    pointer)."""
    info = pr.get_syscall_info(tid)
    return info.op, info.nr, list(info.args), info.instruction_pointer, info.stack_pointer


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


class SyscallGate:
    def __init__(self, engine):
        self.engine = engine
        self.opened = 0            # calls that ran with traced pages open
        self.open_windows = 0
        self.window_pages: Counter = Counter()   # page -> windows it was open in
        self.mapped_regions = 0
        self._open: dict[int, set] = {}        # tid -> pages open for its running call
        self._skipping: dict[int, tuple] = {}  # tid -> (registers at entry, pages to open)
        self._entry: dict[int, tuple[int, list[int]]] = {}   # tid -> (number, arguments)
        self._stack: dict[int, int] = {}       # tid -> stack pointer at the call's entry
        self._ranges: dict[int, tuple] = {}    # tid -> (buffers of the call, syscall address)
        # tid -> (signal, the kernel must get the new action at the exit): the target's
        # rt_sigaction(SIGSEGV or SIGTRAP) answered from the guard's table
        self._answered: dict[int, tuple[int, bool]] = {}
        # tid -> (rsi to restore, signal, oldact): rt_sigaction of another signal that the
        # kernel gets without SIGSEGV in its mask
        self._rewritten: dict[int, tuple[int, int, int]] = {}
        # tid -> {register: the program's value}: pointers redirected to the alias
        self._redirected: dict[int, dict[str, int]] = {}
        # tid -> number of a redirected call the kernel restarts through restart_syscall
        # (a timed futex wait interrupted by a stop): it keeps the alias address
        self._restarting: dict[int, int] = {}
        self.redirected_calls = 0

    @staticmethod
    def safe_numbers() -> frozenset[int]:
        return SAFE

    def claim(self, tracee, event: SyscallStop) -> bool:
        engine = self.engine
        if tracee is not engine.tracee:
            return False
        tid = event.tid
        if not engine.active:
            if tid in self._skipping:
                # skipped just before tracing stopped: put the call back so that it
                # runs for real (every page is open now)
                saved, _pages = self._skipping.pop(tid)
                tracee.set_regs(saved, tid)      # rewound at its entry
                tracee.resume(tid, 0)
                return True
            return False
        op, value, args, ip, sp = syscall_op(tid)
        if op == 1:
            if engine.area.contains(ip):   # the guard's own calls run as they are
                tracee.resume(tid, 0)
                return True
            self._stack[tid] = sp
            if tid not in self._open:
                ranges = syscall_ranges(value, args, engine.tracee.mem.read)
                if ranges is not None:
                    # the system call instruction, in the original code (a copy's is
                    # named by the original's)
                    self._ranges[tid] = (ranges, engine.code_address(ip - 2))
            return self._entry_stop(tracee, tid, value, args)
        if op == 2:
            return self._exit_stop(tracee, tid, value)
        return False

    def leave(self, tracee) -> None:
        """Detach (every thread stopped). A call still running on alias pointers
        (a read blocked on a pipe) gets the program's own back. A stop interrupts
        a blocking call, which the kernel restarts with the registers it then
        finds; one it would restart through restart_syscall (a timed futex wait)
        would keep the alias address the kernel saved: it restarts as itself
        (a relative timeout then starts again)."""
        for tid in set(self._redirected) | set(self._restarting):
            if tid not in tracee.threads:
                continue
            regs = tracee.get_regs(tid)
            for reg, value in self._redirected.get(tid, {}).items():
                setattr(regs, reg, value)
            if _signed(regs.rax) == -ERESTART_RESTARTBLOCK:
                regs.rax = -ERESTARTSYS & NO_RESULT     # the kernel runs orig_rax again
            if regs.orig_rax == SYS_RESTART_SYSCALL and tid in self._restarting:
                regs.orig_rax = self._restarting[tid]   # the call itself, not restart_syscall
            tracee.set_regs(regs, tid)
        self._redirected.clear()
        self._restarting.clear()
        # a call skipped to open its pages (fault engine), stopped at its exit: on its
        # syscall instruction since its entry, it runs again for real after the
        # detach (answered ENOSYS instead, a futex wait made glibc abort)
        for tid, (saved, _pages) in self._skipping.items():
            if tid in tracee.threads:
                tracee.set_regs(saved, tid)      # rewound at its entry
        self._skipping.clear()

    def held_open(self) -> set[int]:
        """Pages a running call of some thread has open: they stay open until its
        exit (closing one under a blocked futex call made it fail with EFAULT:
        glibc's "The futex facility returned an unexpected error code", abort)."""
        return set().union(*self._open.values())

    def _entry_stop(self, tracee, tid: int, nr: int, args: list[int]) -> bool:
        engine = self.engine
        self._entry[tid] = (nr, args)
        if nr == SYS_RT_SIGACTION and args[3] == 8 and 1 <= args[0] <= 64:
            self._sigaction(tracee, tid, args)
            return True
        if nr in MAPPING_CALLS:
            engine.numa.mapping_call(nr, args)   # where pages about to go away are
        if nr == SYS_RESTART_SYSCALL and tid in self._restarting:
            tracee.resume(tid, 0)       # on the alias again, as the kernel saved it
            return True
        if tid in self._open or nr in SAFE or nr in MAPPING_CALLS or \
                (nr == SYS_MADVISE and engine.alias is not None):
            tracee.resume(tid, 0)
            return True
        if tid in self._skipping:
            return False
        if engine.alias is not None and self._redirect(tracee, tid, nr, args):
            return True
        pages = syscall_pages(nr, args, engine.protected, engine.tracee.mem.read)
        pages = {p for p in engine.protected if engine.is_protected(p)} if pages is None else \
            {p for p in pages if engine.is_protected(p)}
        if not pages:
            tracee.resume(tid, 0)   # touches no traced page: runs as it is
            return True
        # skip this attempt (orig_rax = -1), rewound onto the syscall instruction at
        # once (a tracer killed before the exit stop leaves the call to run again,
        # not ENOSYS: http.server died of it), then open at the exit, run it again
        regs = tracee.get_regs(tid)
        regs.rax, regs.rip, regs.orig_rax = regs.orig_rax, regs.rip - 2, NO_RESULT
        self._skipping[tid] = (regs.copy(), pages)
        tracee.set_regs(regs, tid)
        tracee.resume(tid, 0)
        return True

    def _redirect(self, tracee, tid: int, nr: int, args: list[int]) -> bool:
        """Pointers into aliased memory go to the alias for the call (True: resumed)."""
        engine = self.engine

        def touches(start: int, end: int) -> bool:   # O(protected pages there), not O(length)
            return any(engine.is_protected(p) for p in engine.protected.pages_in(start, end))

        changes = redirect(nr, args, engine.alias, touches)
        if changes is None:
            return False
        if changes:
            regs = tracee.get_regs(tid)
            self._redirected[tid] = {reg: getattr(regs, reg) for reg in changes}
            for reg, value in changes.items():
                setattr(regs, reg, value)
            tracee.set_regs(regs, tid)
            self.redirected_calls += 1
        tracee.resume(tid, 0)
        return True

    def _exit_stop(self, tracee, tid: int, result: int) -> bool:
        engine = self.engine
        redirected = self._redirected.pop(tid, None)
        if redirected is not None:
            regs = tracee.get_regs(tid)
            for reg, value in redirected.items():
                setattr(regs, reg, value)
            tracee.set_regs(regs, tid)
        if tid in self._answered:
            signum, kernel_now = self._answered.pop(tid)
            regs = tracee.get_regs(tid)
            regs.rax = 0
            tracee.set_regs(regs, tid)
            if kernel_now:
                with RemoteSyscalls(tracee, tid) as rs:
                    engine.guard.deliver_now(rs, signum)
            tracee.resume(tid, 0)
            return True
        if tid in self._rewritten:
            rsi, signum, old = self._rewritten.pop(tid)
            regs = tracee.get_regs(tid)
            regs.rsi = rsi
            tracee.set_regs(regs, tid)
            if _signed(result) == 0:
                engine.guard.answer_old(tracee.mem, signum, old)
        engine.guard.look_for_reset(tracee.pid)
        if engine.guard.reinstall_due:
            # the target's own fault met the target's own action: the guard is back
            with RemoteSyscalls(tracee, tid) as rs:
                engine.guard.reinstall(rs)
        if tid in self._skipping:
            saved, pages = self._skipping.pop(tid)
            tracee.set_regs(saved, tid)     # on the syscall instruction since its entry
            open_window(engine, tid, pages, self._open)
            self.opened += 1
            if len(tracee.threads) > 1:
                self.open_windows += 1   # other threads run while the call has the pages
                self.window_pages.update(pages)
            tracee.resume(tid, 0)
            return True
        opened = self._open.pop(tid, None)
        nr, args = self._entry.pop(tid, (None, []))
        if nr is not None and _signed(result) == -ERESTART_RESTARTBLOCK and \
                (redirected is not None or tid in self._restarting):
            self._restarting.setdefault(tid, nr)
        else:
            self._restarting.pop(tid, None)
        ranges, rip = self._ranges.pop(tid, (None, 0))
        if nr is not None:
            engine.numa.syscall_exit(tid, nr, args, _signed(result))
        if opened is not None:
            with RemoteSyscalls(tracee, tid) as rs:
                engine.protect(rs, opened)
        if opened is not None or redirected:
            engine.blocks.syscall_done(tid, nr, ranges, rip, _signed(result))
        if nr in MAPPING_CALLS and _signed(result) >= 0 or nr == SYS_BRK:
            self._mapping_changed(tracee, tid, nr, args, result)
        elif nr == SYS_MADVISE and engine.alias is not None and args[2] in MADV_ZEROING \
                and _signed(result) == 0:
            with RemoteSyscalls(tracee, tid) as rs:
                engine.alias.zero(rs, args[0], args[1])
        tracee.resume(tid, 0)
        return True

    def _sigaction(self, tracee, tid: int, args: list[int]) -> None:
        """rt_sigaction at its entry: SIGSEGV's is answered from the guard's table;
        another signal's action goes to the kernel without SIGSEGV in its mask."""
        guard = self.engine.guard
        regs = tracee.get_regs(tid)
        if guard.answers(args[0]):
            self._answered[tid] = (args[0], guard.emulate(tracee.mem, args[0], args[1], args[2]))
            regs.orig_rax = NO_RESULT          # skipped: the exit stop sets the result
            tracee.set_regs(regs, tid)
        else:
            scratch = (regs.rsp - 1024) & ~15   # below the red zone, while the call runs
            where = guard.kernel_version(tracee.mem, args[0], args[1], scratch)
            self._rewritten[tid] = (regs.rsi, args[0], args[2])
            if where is not None:
                regs.rsi = where
                tracee.set_regs(regs, tid)
        tracee.resume(tid, 0)

    # ------------------------------------------------------ the address space
    def traces_default(self, label: str) -> bool:
        """Whether the default region ``label`` is among the traced ones."""
        engine = self.engine
        if engine.region_filter is not None:
            return engine.region_filter(Region(0, 0, label))
        return engine.only_regions is None

    def _caller(self, tid: int) -> int:
        """The return address of the libc wrapper that made the call (MadT's site)."""
        try:
            return self.engine.code_address(self.engine.tracee.mem.read_u64(self._stack.get(tid, 0)))
        except Exception:
            return 0

    def _mapping_changed(self, tracee, tid: int, nr: int, args: list[int], result: int) -> None:
        engine = self.engine
        alloc = engine.alloc if engine.alloc is not None and engine.alloc.active else None
        alias = engine.alias
        with RemoteSyscalls(tracee, tid) as rs:
            if nr == SYS_BRK:
                self._refresh_heap(rs, result)
            elif nr == SYS_MUNMAP:
                for lo, hi in self._gone(tracee, args[0], args[0] + _page_up(args[1])):
                    if alias is not None:
                        alias.unmapped(rs, lo, hi)
                    self._forget(lo, hi)
                    if alloc:
                        alloc.unmapped(tid, lo, hi)
            elif nr == SYS_MMAP:
                start, end = result, result + _page_up(args[1])
                if alias is not None:
                    alias.unmapped(rs, start, end)   # MAP_FIXED over aliased pages
                self._forget(start, end)   # MAP_FIXED over traced pages
                flags = args[3]
                if (flags & MAP_ANONYMOUS and flags & MAP_PRIVATE and not flags & MAP_STACK
                        and self.traces_default(f"[anon {start:#x}]")):
                    engine.regions.add(Region(start, end, f"[anon {start:#x}]"))
                    engine.protected.set_range(start, end, args[2] & 7)
                    if alias is not None:
                        self._alias_new(rs, start, end, "", range(start, end, PAGE))
                    engine.protect(rs, range(start, end, PAGE))
                    self.mapped_regions += 1
                    if alloc:
                        alloc.mapped(tid, "memmap", start, args[1], self._caller(tid))
            elif nr == SYS_MREMAP:
                self._moved(rs, args[0], _page_up(args[1]), result, _page_up(args[2]))
                if alloc and alloc.is_mapping(args[0]):
                    alloc.unmapped(tid, args[0], args[0] + _page_up(args[1]))
                    alloc.mapped(tid, "mremap", result, args[2], self._caller(tid))
            elif nr == SYS_MPROTECT:
                start, end = args[0], args[0] + _page_up(args[1])
                pages = engine.protected.pages_in(start, end)
                if pages and len(tracee.threads) > 1:
                    self.open_windows += 1   # open from the call until now
                    self.window_pages.update(pages)
                for first, last in page_runs(pages):
                    engine.protected.set_range(first, last, args[2] & 7)
                engine.protect(rs, pages)   # closed again (those still accessible)
                if alias is not None:
                    alias.update_access(engine.protected, pages)
        engine.tables_changed()

    def _alias_new(self, rs: RemoteSyscalls, start: int, end: int, path: str, pages) -> None:
        """Fresh memory of the program (zeros) joins the aliased memory."""
        from .hybrid.alias import Origin
        alias = self.engine.alias
        if alias.alias(rs, start, end, [Origin(start, end, path)], read_maps(rs.tracee.pid),
                       fresh=True):
            alias.update_access(self.engine.protected, pages)

    @staticmethod
    def _gone(tracee, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) that no mapping holds now: what a munmap took
        away.  With other threads running, the kernel may have given the range to
        another thread's mmap since, and that call's end may have been handled
        first (each thread waits at its own call's end, not at the others'): its
        pages are that mapping's now, traced and protected as such, and are kept
        (forgotten, they stayed closed to the program with nothing to open them:
        its next access died of SIGSEGV)."""
        if len(tracee.threads) <= 1:
            return [(start, end)]
        return unmapped_parts(start, end, read_maps(tracee.pid))

    def _forget(self, start: int, end: int) -> None:
        engine = self.engine
        engine.protected.drop_range(start & ~(PAGE - 1), end)
        engine.regions.cut(start, end)

    def _moved(self, rs: RemoteSyscalls, old: int, old_size: int, new: int, new_size: int) -> None:
        engine = self.engine
        region = engine.regions.find(old)
        if region is None:
            return
        prot = engine.protected.get(old & ~(PAGE - 1), 3)
        moved = engine.alias is not None and engine.alias.moved(rs, old, old_size, new, new_size,
                                                                 read_maps(rs.tracee.pid))
        self._forget(old, old + old_size)
        engine.regions.add(Region(new, new + new_size, region.label))
        engine.protected.set_range(new, new + new_size, prot)
        engine.protect(rs, range(new, new + new_size, PAGE))   # the grown part was never closed
        if moved:
            engine.alias.update_access(engine.protected, range(new, new + new_size, PAGE))

    def _refresh_heap(self, rs: RemoteSyscalls, brk: int) -> None:
        engine = self.engine
        if not self.traces_default("[heap]"):
            return  # the heap is not among the traced regions
        old = next((r for r in engine.regions.regions if r.label == "[heap]"), None)
        if engine.alias is not None:
            heap = self._aliased_heap(rs, old, brk)
        else:
            # our own mprotect calls split the heap into several mappings, all named [heap]
            parts = [m for m in read_maps(engine.tracee.pid) if m.path == "[heap]"]
            heap = Region(min(m.start for m in parts), max(m.end for m in parts), "[heap]") \
                if parts else None
        engine.regions.replace("[heap]", heap)
        if old is not None:   # the old heap's pages outside the new one are gone
            first = old.start & ~(PAGE - 1)
            if heap is None:
                engine.protected.drop_range(first, old.end)
            else:
                engine.protected.drop_range(first, min(heap.start, old.end))
                engine.protected.drop_range(max(heap.end, first), old.end)
        if heap is not None:  # and the new heap's pages not protected yet are closed
            gaps = engine.protected.gaps(heap.start, heap.end)
            if engine.spared:        # a TCB's page stays out (engine._spare_thread_pointers)
                gaps = [run for gap in gaps for run in page_runs(
                    p for p in range(gap[0], gap[1], PAGE) if p not in engine.spared)]
            for start, end in gaps:
                engine.protected.set_range(start, end, 3)
                if engine.alias is not None:
                    engine.alias.update_access(engine.protected, range(start, end, PAGE))
                engine.protect(rs, range(start, end, PAGE))

    def _aliased_heap(self, rs: RemoteSyscalls, old: Region | None, brk: int) -> Region | None:
        """The brk heap [start_brk, brk) (its mappings are the alias's memfd, not
        named [heap]): a shrunk part loses its alias, a grown part gets one."""
        alias = self.engine.alias
        start = alias.start_brk
        end = _page_up(brk) if start <= brk < 1 << 63 else start
        old_end = old.end if old is not None else start
        if end < old_end:
            alias.unmapped(rs, end, old_end)
        elif end > old_end:
            maps = read_maps(rs.tracee.pid)
            if old_end == start or not alias.extend(rs, old_end, end, maps):
                from .hybrid.alias import Origin
                alias.alias(rs, old_end, end, [Origin(old_end, end, "[heap]")], maps, fresh=True)
        return Region(start, end, "[heap]") if end > start else None


def _page_up(n: int) -> int:
    return (n + PAGE - 1) & ~(PAGE - 1)

