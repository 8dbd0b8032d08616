# SPDX-License-Identifier: GPL-2.0-or-later
"""New threads for free in live sessions: the target's side of the ring pool
(layout.h "Ring pool"; the tracer's side is rings/ring_pool.py).

``place_thread_code`` (every session that traces functions): mt_claim, which
every trampoline's slow path calls (a thread without a slot, or whose slot's
ring is not its own), and mt_seizeme, in a code area.

``ThreadPool`` (a live session, attached, with functions instrumented and
neither data tracing nor --follow-forks): threads are not traced from their
creation (no PTRACE_O_TRACECLONE: no stop when they are made, none when they
end); a new thread takes its ring from the pool at its first record.  What
that needs, besides the pool itself:

* the owner word: glibc reuses a dead thread's TCB for a new thread (same fs
  base, so the same slot key); each lookup compares the u32 at the thread
  pointer + ``owner_offset`` (glibc's struct pthread tid, found here by
  looking for each stopped thread's id in its TCB) with the ring's, and a
  thread whose owner word is not its own id takes no ring;
* forks and execs of untraced threads: the hooks at the entry of the C
  library's fork, _Fork, execve and execveat (mt_forkhook, then the
  function's first instructions, relocated) ask the tracer to seize the
  thread first (mt_seizeme): the fork child is then cleaned, or the exec
  followed, as any traced thread's.  A fork or exec made by a raw system
  call from an untraced thread is not seen (docs/known-limits.md);
* the tracer's own slot insertions are atomic (rings/slot_table.py), and a
  thread stopped in the middle of its claim keeps its claim: the tracer
  never gives a ring to a thread while the pool is on.

``why_not`` says why a session cannot use the pool; it then traces every new
thread from its creation, as before.
"""

from __future__ import annotations

import struct
import threading

from ..arch.x86_64.encode import jmp_rel32
from ..arch.x86_64.relocate import Refusal, relocate_entry
from ..errors import MadtraceError
from ..process.remote_syscall import RemoteSyscalls
from ..rings.ring_pool import RESERVE, RingPool
from ..target.areas import SharedArea
from ..target.patchset import Patch, PatchConflict

HOOKED = ("fork", "_Fork", "execve", "execveat")   # in the C library
LIBC = "libc.so.6"
GLIBC_TID_OFFSET = 0x2d0        # struct pthread's tid in glibc 2.2x-2.3x, x86-64
TCB_SEARCH = 0x800              # bytes of each thread's TCB searched for its id
HOOK_ROOM = 64 + 5              # a hook's relocated instructions and its jump back


def prepare(space) -> None:
    """While the target runs: the C library's scan, which hooking its fork and exec
    functions needs (0.5 s for glibc on a loaded machine: not while it is stopped)."""
    libc = space.module_named(LIBC) if space is not None else None
    if libc is not None:
        from .plan import _ModuleScan
        _ModuleScan(libc)


def place_thread_code(rs: RemoteSyscalls, rings, injector, group: str, code_areas: list):
    """mt_claim and mt_seizeme, in the first code area (none: an area of their own);
    their addresses in the control block (MT_CTL_CLAIM, MT_CTL_SEIZEME).
    Returns the code area."""
    from ..target.areas import CodeArea
    claim = injector.templates["claim"]
    seize = injector.templates["seizeme"]
    if code_areas:
        code = code_areas[0]
    else:
        area = SharedArea(rs, claim.size + seize.size + 64, "madtrace-threads",
                          executable=True, group=group)
        area.steppable = True       # no loop without a way out, once recording is off
        code = CodeArea(area)
    claim_at = code.allocate(claim.size)
    seize_at = code.allocate(seize.size)
    code.area.write(claim_at, bytes(claim.instantiate(claim_at)))
    code.area.write(seize_at, bytes(seize.instantiate(seize_at)))
    rings.control_u64(injector.MT_CTL_CLAIM, claim_at)
    rings.control_u64(injector.MT_CTL_SEIZEME, seize_at)
    return code


def owner_offset(tracee) -> int:
    """Where each stopped thread's TCB holds its id (glibc's struct pthread tid),
    from its thread pointer; 0 (the thread pointer's own low half) when no offset
    holds every thread's id, or several do and glibc's is not among them."""
    common: set[int] | None = None
    for tid, state in tracee.threads.items():
        if state.running or state.gone:
            continue
        try:
            base = tracee.get_regs(tid).fs_base
            data = tracee.mem.read(base, TCB_SEARCH) if base else b""
        except (MadtraceError, OSError):
            continue
        words = struct.unpack(f"<{len(data) // 4}I", data[:len(data) // 4 * 4])
        found = {4 * i for i, word in enumerate(words) if word == tid}
        common = found if common is None else common & found
    if not common:
        return 0
    if GLIBC_TID_OFFSET in common:
        return GLIBC_TID_OFFSET
    return common.pop() if len(common) == 1 else 0


def owner_word(tracee, tid: int, offset: int) -> int:
    """The thread's owner word now (0 if it cannot be read)."""
    try:
        base = tracee.get_regs(tid).fs_base
        return struct.unpack("<I", tracee.mem.read(base + offset, 4))[0] if base else 0
    except (MadtraceError, OSError):
        return 0


class ThreadPool:
    """The ring pool of one function tracer (calls/engine.py) in a live session."""

    def __init__(self, engine):
        self.engine = engine
        self.pool: RingPool | None = None
        self.hooks: list[int] = []          # addresses of the hook patches
        self.staged_hooks = None            # stage_hooks: patches (or why not) for start
        self.why_off = "not started"

    @property
    def active(self) -> bool:
        return self.pool is not None and self.pool.active

    def why_not(self) -> str:
        """Why the pool cannot serve this session ("": it can)."""
        engine = self.engine
        if engine.rings is None or engine.rings.closed:
            return "no function is traced"
        if engine.rings.owner_offset == 0:
            return "no thread's TCB holds its id (not glibc?): new threads are traced"
        if not _has_cx16():
            return "the CPU has no cmpxchg16b"
        libc = engine.space.module_named(LIBC) if engine.space is not None else None
        if libc is None:
            return f"no {LIBC} (its fork and exec are hooked)"
        return ""

    def start(self, on_work) -> str:
        """Every thread stopped: hooks the C library's fork and exec functions and
        opens the pool.  Returns "" or why the pool stays off (nothing changed)."""
        why = self.why_not()
        if why:
            self.why_off = why
            return why
        engine = self.engine
        staged, self.staged_hooks = self.staged_hooks, None
        try:
            if isinstance(staged, Exception):
                raise staged
            patches = staged or self._hook_patches()
            rips = [engine.tracee.get_regs(tid).rip for tid in engine.tracee.threads]
            engine.patches.apply(engine.tracee.mem, patches, rips)
        except (PatchConflict, _Refused) as exc:
            self.why_off = f"cannot hook the C library's fork and exec: {exc}"
            return self.why_off
        self.hooks = [p.address for p in patches]
        engine.rings.ensure_free(engine.injector.MT_POOL_ENTRIES + RESERVE)   # mapped now, stopped
        self.pool = RingPool(engine.rings, engine.tracee.pid)
        self.pool.on_work = on_work
        self.pool.start(engine.rings.owner_offset, threading.get_native_id())
        self.why_off = ""
        return ""

    def map_ahead(self) -> None:
        """Every thread stopped, before ``start`` (calls/staging.py): the C library's
        code area and the pool's rings mapped now, so that ``start`` maps nothing."""
        if self.why_not():
            return
        engine = self.engine
        engine.code_area_for(engine.space.module_named(LIBC), self._hooks_size())
        engine.rings.ensure_free(engine.injector.MT_POOL_ENTRIES + RESERVE)

    def stage_hooks(self) -> None:
        """While the target runs, after ``map_ahead``: the hooks' code written, their
        patches kept for ``start`` (which checks the code is unchanged)."""
        if not self.why_not():
            try:
                self.staged_hooks = self._hook_patches()
            except _Refused as exc:
                self.staged_hooks = exc

    def _hooks_size(self) -> int:
        return len(HOOKED) * (self.engine.injector.templates["forkhook"].size + HOOK_ROOM)

    def _hook_patches(self) -> list[Patch]:
        engine = self.engine
        libc = engine.space.module_named(LIBC)
        from .plan import _ModuleScan  # the module's branches (prepared ahead)
        scan, bias = _ModuleScan(libc).scan, libc.bias
        template = engine.injector.templates["forkhook"]
        area = engine.code_area_for(libc, self._hooks_size())
        patches = []
        for name in HOOKED:
            found = [ms for ms in engine.space.find_functions(name)
                     if ms.module is libc and ms.symbol.dynamic and ms.address]
            if not found:
                continue            # an older C library: no _Fork or execveat
            address, size = found[0].address, found[0].symbol.size or 64
            code = engine.tracee.mem.read(address, max(size, 16))
            at = area.allocate(template.size + HOOK_ROOM)
            reloc = relocate_entry(code, address, size, at + template.size,
                                   branches_into=lambda lo, hi: scan.branches_into(lo - bias,
                                                                                   hi - bias))
            if isinstance(reloc, Refusal):
                raise _Refused(f"{name}: {reloc.reason}")
            body = bytes(template.instantiate(at, ctl=engine.rings.control_address)) + reloc.code
            body += jmp_rel32(at + len(body), address + reloc.consumed)
            area.area.write(at, body)
            engine.moved_code.extend(reloc.moved)
            patched = jmp_rel32(address, at) + b"\xcc" * (reloc.consumed - 5)
            patches.append(Patch(address, code[:reloc.consumed], patched, f"hook of {name}"))
        if not any(p.owner in ("hook of fork", "hook of _Fork") for p in patches):
            raise _Refused("no fork function found")
        return patches

    def stop(self) -> None:
        """Threads take no ring from now on (data tracing: every thread traced
        from its creation again); those taken stay theirs."""
        if self.pool is not None:
            self.pool.stop()
            self.why_off = "stopped: every new thread is traced"

    def detach(self) -> None:
        """Every thread stopped, at the session's end: no claim, no waiting thread,
        the hooks out."""
        if self.pool is not None:
            self.pool.stop()
            self.pool.release_requests()
        if self.hooks:
            self.engine.patches.revert(self.engine.tracee.mem, self.hooks)
            self.hooks = []

    def summary(self) -> dict:
        if self.pool is None:
            return {"on": False, "why_off": self.why_off}
        return dict(self.pool.summary(), why_off=self.why_off, hooks=len(self.hooks))


def _has_cx16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "cx16" in line.split()
    except OSError:
        pass
    return False


class _Refused(Exception):
    pass
