# SPDX-License-Identifier: GPL-2.0-or-later
"""Hook stubs in the target for malloc & co. and memcpy/memmove/memset
(hybrid data engine): their calls are recorded inside the target, in the
thread's ring, without a ptrace stop.

Each hooked function's entry becomes ``jmp stub`` (the bytes it covers are
relocated into a prologue that jumps back, as function tracing's entry
trampolines do); the stub (injector/trampolines.S ``hook_alloc``,
``hook_copy``, ``hook_set``; layout.h "Hook stubs") writes a group of
records and calls the function through its *continuation slot*: the
relocated prologue at first, and the data engine's copy of the function once
the rewriter has made one (``continue_at``): the rewriter does not redirect
a hooked function's entry itself, it gives the hook its copy.  Allocator
stubs write a second group when the call returns; memcpy & co. stubs
write one group, only when a buffer lies on traced pages (checked in the
stub against ``bitmap``, one bit per traced page, and the alias bitmap), and
the call then reaches those pages through the alias (alias.py), as the
breakpoint hooks did.  hook_events.py takes the groups out of the rings.

What a stub cannot do goes to the tracer: a memcpy whose buffer lies on
traced pages that are not all aliased stops at the stub's "slow" int3, where
the breakpoint hooks of block_events.py take it (call_hooks.py, ``own``
breakpoints: the state there is that of a function entry); a group that
cannot go into a ring (no ring, a ring that stays full) stops at the "trap"
int3 and is applied here from the registers (``claim_trap``).  With no tracer
left the guard turns both int3s into nops (its breakpoint table) and the
program goes on.  A function whose entry cannot be relocated keeps a
breakpoint (``install`` returns it; ``left`` says why).

Leaving: a fork child gets the original entries back in its copy (the
footprint then unmaps its copy of the stubs); a vfork child runs with the
original entries (``pause``/``unpause``); at detach the entries go back,
threads inside a memcpy made through the alias run until it returns (its
pointers lead to the alias, which is about to go), and a call in flight in
an allocator stub returns to a ``ret`` of the program's (the stub's pad holds
that address too: it returns on to the caller), so the stubs can be unmapped.
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...arch.x86_64.decode import as_buffer, decode_one, sweep
from ...arch.x86_64.encode import jmp_rel32
from ...arch.x86_64.relocate import Relocation, relocate_entry
from ...binary.eh_frame import EhFrame
from ...target.areas import SharedArea, gap_for_module
from ...target.mappings import step_until_out
from ...target.patchset import Patch, PatchConflict, PatchSet
from ...calls.plan import module_scan
from ...target.templates import load_injector
from ...target.trampoline_unwind import OBJECT_SIZE, frames_eh_frame, registrar
from ...rings.writer_windows import HOOK_STUBS, WriterWindows
from ...process.remote_syscall import RemoteSyscalls
from ...process.tracee import is_exiting
from .call_hooks import CallHooks
from .hook_events import HookEvents
from ..hybrid.rewriting import GROUP
from .traced_pages import TracedPages

AREA_SIZE = 1 << 16
TEMPLATES = {"alloc": "hook_alloc", "memset": "hook_set"}   # other mem functions: hook_copy
PROLOGUE_ROOM = 64
PAD_SEARCH = 24                  # bytes before an entry searched for padding (rel8 reach)
INT3, RET = 0xCC, 0xC3
CALL_BYTES = 6                   # call qword ptr [rip + rel32]


@dataclass
class Hook:
    index: int
    name: str            # malloc, free, new... (the allocation tracker's kinds), memcpy...
    role: str            # "alloc" or "mem"
    address: int         # the function's entry
    patched_end: int     # the end of the bytes its entry jump took
    stub: int
    slot: int            # the continuation slot
    template: str
    entries: int = 0     # groups applied (hook_events.py)
    returns: int = 0

    @property
    def kind(self) -> str:
        return self.name


class _Area:
    def __init__(self, area: SharedArea):
        self.area = area
        self.cursor = area.address

    def allocate(self, size: int, align: int = 16) -> int:
        at = (self.cursor + align - 1) & ~(align - 1)
        if at + size > self.area.end:
            raise MemoryError("hook stub area full")
        self.cursor = at + size
        return at


class InlineHooks:
    stubs = True

    def __init__(self, engine, rs: RemoteSyscalls):
        self.engine = engine
        self.tracee = engine.tracee
        self.L = load_injector()
        self.rings = engine.paths.rings
        self.hooks: list[Hook] = []
        self.by_index: dict[int, Hook] = {}
        self.by_function: dict[int, Hook] = {}
        self.traps: dict[int, Hook] = {}     # a stub's "trap" int3 -> its hook
        self.areas: dict[str, _Area] = {}
        self.patches = PatchSet()
        self.left: dict[str, str] = {}       # functions that kept a breakpoint, and why
        self.slow: CallHooks | None = None   # the "slow" int3s of memcpy & co.
        self.stats: Counter = Counter()
        self.gadget = 0                      # a ret of the program's (see the module)
        self._moved: list[tuple[int, int, int]] = []   # (new, original, size) of prologues
        self._moved_index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._eh: dict[str, EhFrame] = {}
        self.traced = TracedPages(rs, GROUP)
        self.events = HookEvents(engine, self)
        self.writer_windows = WriterWindows.of(self.L, HOOK_STUBS)     # signals in a group
        engine.paths.records.hook_sink = self.events.take_group
        engine.paths.records.hook_batch = self.events
        self.active = False
        self.paused = False
        outer = engine.original_address
        engine.original_address = lambda rips: outer(self.original_array(rips))

    # ------------------------------------------------------------- install
    def install(self, rs: RemoteSyscalls, functions: dict[int, tuple[str, str]],
                slow=None) -> dict[int, str]:
        """Stubs for ``functions`` ({entry: (name, "alloc" | "mem")}); ``slow``:
        (on_entry, on_return) of the breakpoint hooks for memcpy & co.'s slow path.
        Returns {entry: name} of those left to breakpoints."""
        left: dict[int, str] = {}
        codes = {a: self._code(a) for a in functions}
        if not self.gadget:
            self.gadget = next((g for g in (_a_ret(a, c) for a, c in codes.items()) if g), 0)
        held = self.engine.hold_threads()
        try:
            rips = [self.tracee.get_regs(t).rip for t, s in self.tracee.threads.items()
                    if not s.running]
            for address, (name, role) in functions.items():
                why = self._hook(rs, address, name, role, codes[address], rips)
                if why:
                    left[address] = name
                    self.left[name] = why
        finally:
            self.engine.resume_threads(held)
        guard = self.engine.guard
        for trap, hook in self.traps.items():
            if hook.address in functions:     # this call's: the guard makes them nops
                guard.add_breakpoint(trap, b"\x90", 5)
        self._register_unwind(rs, [h for h in self.hooks if h.role == "alloc"
                                   and h.address in functions])
        slows = {h.stub + self.L.templates[h.template].marks["slow"]: h.name
                 for h in self.hooks if h.role == "mem" and h.address in functions}
        if slows and slow is not None:
            self.slow = CallHooks(self.tracee, "memslow", slow[0], slow[1], guard)
            self.slow.install(rs, slows, own=True)
        elif self.traps:
            guard.install_traps(rs)
        self.active = True
        return left

    def _register_unwind(self, rs: RemoteSyscalls, hooks: list[Hook]) -> None:
        """Unwind information for the allocator stubs' return points, so that an
        exception thrown by operator new (bad_alloc) passes through its stub: given
        to the target's C++ unwinder, if one is loaded (target/trampoline_unwind.py)."""
        functions = registrar(self.engine.space)
        if not hooks or functions is None:
            return
        L, register, deregister = self.L, functions[0], functions[1]
        returned = L.templates["hook_alloc"].marks["returned"]
        # the call into the function (6 bytes) and the return point: CFA = rsp + 16
        blob = frames_eh_frame([(h.stub + returned - CALL_BYTES, h.stub + returned + 1, 16)
                                for h in hooks])
        object_at = L.MT_UNWIND_FRAMES + ((len(blob) + 15) & ~15)
        area = SharedArea(rs, object_at + OBJECT_SIZE, "madtrace-hooks-unwind", executable=False,
                          group=GROUP)
        area.write(area.address + L.MT_UNWIND_FRAMES, blob)
        area.write(area.address + L.MT_UNWIND_STATE, struct.pack("<Q", 1))
        rs.call_function(register, area.address + L.MT_UNWIND_FRAMES, area.address + object_at)
        area.write(area.address + L.MT_UNWIND_STATE, struct.pack("<Q", 2))

        def take_back(rs: RemoteSyscalls, area=area) -> None:
            if struct.unpack_from("<Q", area.local, L.MT_UNWIND_STATE)[0] == 2:
                rs.call_function(deregister, area.address + L.MT_UNWIND_FRAMES)
                area.write(area.address + L.MT_UNWIND_STATE, struct.pack("<Q", 0))
        area.before_unmap.append(take_back)
        self.stats["unwind entries"] += len(hooks)

    def _code(self, address: int) -> bytes:
        module = self.engine.space.module_for(address)
        size = 64
        if module is not None:
            symbol = module.image.symbol_at(address - module.bias)
            if symbol is not None and symbol.address == address - module.bias and symbol.size:
                size = symbol.size
        return self.tracee.mem.read(address, size)

    def _area(self, rs: RemoteSyscalls, module) -> _Area:
        area = self.areas.get(module.name)
        if area is None:
            at = gap_for_module(self.tracee.pid, module.start, module.end, AREA_SIZE)
            shared = SharedArea(rs, AREA_SIZE, f"madtrace-hooks-{module.name}", executable=True,
                                address=at, group=GROUP)
            shared.steppable = True
            area = self.areas[module.name] = _Area(shared)
            self.writer_windows.watch(shared, self.tracee)
        return area

    def _hook(self, rs, address: int, name: str, role: str, code: bytes, rips) -> str | None:
        L = self.L
        module = self.engine.space.module_for(address)
        if module is None:
            return "outside any module"
        if len(self.hooks) >= L.MT_HOOK_MAX:
            return "too many hook stubs"
        template_name = TEMPLATES.get(role, TEMPLATES.get(name, "hook_copy"))
        template = L.templates[template_name]
        area = self._area(rs, module)
        stub = area.allocate(template.size)
        slot = area.allocate(16, 8)
        prologue_at = area.allocate(PROLOGUE_ROOM + 5)
        reloc, pad = self._relocate(module, address, code, prologue_at)
        if isinstance(reloc, str):
            return reloc
        index = len(self.hooks)
        code_of = lambda kind: (L.MT_HOOK_CODE | index << 2 | kind) - (1 << 32)  # noqa: E731
        ctl = self.rings.control_address
        if template_name == "hook_alloc":
            fields = dict(gadget=slot + 8, ctl_entry=ctl, ctl_ret=ctl, cont=slot,
                          code_entry=code_of(L.MT_HOOK_ENTRY), code_return=code_of(L.MT_HOOK_RETURN))
        else:
            fields = dict(traced=self.traced.address, alias=self.engine.alias.bitmap.address,
                          ctl_entry=ctl, code=code_of(L.MT_HOOK_ENTRY), cont=slot, contjmp=slot)
        prologue = reloc.code + jmp_rel32(prologue_at + len(reloc.code), address + reloc.consumed)
        area.area.write(prologue_at, prologue)
        area.area.write(slot, struct.pack("<QQ", prologue_at, self.gadget))
        area.area.write(stub, bytes(template.instantiate(stub, **fields)))
        if pad is None:
            patches = [Patch(address, code[:reloc.consumed],
                             jmp_rel32(address, stub) + bytes([INT3]) * (reloc.consumed - 5),
                             f"hook stub of {name}")]
        else:
            patches = [Patch(pad, self.tracee.mem.read(pad, 5), jmp_rel32(pad, stub),
                             f"hook stub of {name} (in the padding before it)"),
                       Patch(address, code[:reloc.consumed],
                             bytes([0xEB, (pad - address - 2) & 0xFF]) +
                             bytes([INT3]) * (reloc.consumed - 2), f"hook stub of {name}")]
        try:
            self.patches.apply(self.tracee.mem, patches, rips)
        except PatchConflict as exc:
            return str(exc)
        hook = Hook(index, name, role, address, address + reloc.consumed, stub, slot,
                    template_name)
        self.hooks.append(hook)
        self.by_index[index] = hook
        self.by_function[address] = hook
        marks = template.marks
        self.traps[stub + marks["trap"]] = hook
        if role == "alloc" and self.gadget:
            area.area.return_points[stub + marks["returned"]] = self.gadget
        self._moved.extend(reloc.moved)
        self._moved_index = None
        self.stats["stubs"] += 1
        return None

    def _relocate(self, module, address: int, code: bytes, at: int):
        """(the Relocation of the function's first instructions to ``at``, the
        padding address of its jump when the entry takes a short jump), or (why
        not, None)."""
        scan, bias = module_scan(module), module.bias
        # branches from anywhere in the module into its first bytes (mempcpy jumps past
        # memmove's first instruction) refuse, as they do for function tracing
        into = lambda lo, hi: scan.branches_into(lo - bias, hi - bias)  # noqa: E731
        reloc = relocate_entry(code, address, len(code), at, branches_into=into)
        if isinstance(reloc, Relocation):
            return reloc, None
        # a branch into its first bytes: a short jump into the padding before it,
        # where the jump to the stub goes (E9Patch's trampoline in padding)
        pad = self._padding_before(module, address)
        short = relocate_entry(code, address, len(code), at, min_len=2,
                               branches_into=into) if pad else None
        if isinstance(short, Relocation):
            return short, pad
        return f"its entry cannot be relocated: {reloc.reason}", None

    def _padding_before(self, module, address: int) -> int | None:
        """Where a jmp rel32 fits in the padding just before the function at
        ``address``: NOP instructions that end at its entry, outside every unwind
        entry, that no branch of the module reaches; None if there is no such room."""
        bias = module.bias
        eh = self._eh.get(module.name)
        if eh is None:
            eh = self._eh[module.name] = EhFrame(module.image)
        raw = self.tracee.mem.read(address - PAD_SEARCH, PAD_SEARCH)
        for start in range(address - PAD_SEARCH, address - 4):
            starts, at = [], start
            while at < address:
                insn = decode_one(raw[at - address + PAD_SEARCH:], at, detail=False)
                if insn is None or insn.mnemonic not in ("nop", "int3"):
                    break
                starts.append(at)
                at += insn.size
            pad = max((p for p in starts if p + 5 <= address), default=None)
            if at != address or pad is None:
                continue
            if any(eh.fde_at(a - bias) is not None for a in range(start, address)) or \
                    module_scan(module).branches_into(start - 1 - bias, address - bias):
                return None
            return pad
        return None

    # ------------------------------------------------- the rewriter's view
    def continue_at(self, function: int, address: int) -> bool:
        """The function at ``function`` now runs at ``address`` (the rewriter's copy):
        its stub continues there (one aligned 8-byte store).  False: not hooked."""
        hook = self.by_function.get(function)
        if hook is None:
            return False
        area = self._area_of(hook.slot)
        ctypes.c_uint64.from_buffer(area.local, hook.slot - area.address).value = address
        self.stats["continued in a copy"] += 1
        return True

    def patched_end(self, function: int) -> int:
        """The end of the bytes the entry jump of a hooked function took (0: none)."""
        hook = self.by_function.get(function)
        return hook.patched_end if hook is not None and self.patches.applied else 0

    def original_code(self, start: int, end: int) -> dict[int, bytes]:
        """{address: the program's bytes} of the entry patches within [start, end)."""
        return {p.address: p.original for p in self.patches.covering(start, end)
                if start <= p.address}

    def in_stubs(self, addresses: np.ndarray) -> np.ndarray:
        """Which of ``addresses`` lie in the stubs' areas: the return address of a
        call an allocator made as its own tail call (calloc's memset, realloc's
        malloc), which returns into the stub that called the allocator."""
        out = np.zeros(len(addresses), dtype=bool)
        for area in self.areas.values():
            out |= (addresses >= area.area.address) & (addresses < area.area.end)
        return out

    def in_stub(self, address: int) -> bool:
        """``in_stubs`` of one address."""
        return any(a.area.contains(address) for a in self.areas.values())

    def _area_of(self, address: int) -> SharedArea:
        return next(a.area for a in self.areas.values() if a.area.contains(address))

    def original_array(self, rips: np.ndarray) -> np.ndarray:
        """Addresses in a relocated prologue -> the original instruction's (a
        binary search: the cost does not grow with the number of hooks)."""
        if not self._moved or not len(rips):
            return rips
        if self._moved_index is None:
            moved = sorted(self._moved)
            self._moved_index = (np.array([m[0] for m in moved], dtype=np.uint64),
                                 np.array([m[0] + m[2] for m in moved], dtype=np.uint64),
                                 np.array([m[1] for m in moved], dtype=np.uint64))
        starts, ends, originals = self._moved_index
        out = np.array(rips, dtype=np.uint64, copy=True)
        at = np.searchsorted(starts, out, side="right") - 1
        inside = (at >= 0) & (out < ends[np.maximum(at, 0)])
        if inside.any():
            k = at[inside]
            out[inside] = originals[k] + (out[inside] - starts[k])
        return out

    def protected_changed(self, runs) -> None:
        """``runs``: (start, end) of every page run the engine protects now."""
        self.traced.update(runs)

    # --------------------------------------------------------------- traps
    def claim_trap(self, tracee, event, regs) -> bool:
        if tracee is not self.tracee:
            return False
        if self.slow is not None and self.slow.claim_trap(tracee, event, regs):
            return True
        hook = self.traps.get(regs.rip - 1)
        if hook is None:
            return False
        self.stats["traps"] += 1
        if self.active:
            self._trapped(event.tid, hook, regs)
        tracee.resume(event.tid, 0)          # on after the int3
        return True

    def _trapped(self, tid: int, hook: Hook, regs) -> None:
        """A group the stub could not write: applied from its registers and frame."""
        L, read = self.L, self.tracee.mem.read_u64
        paths, splitter = self.engine.paths, self.rings.splitter
        flavor = regs.r11 & 0xFFFFFFFF
        with self.rings.lock:
            seq = paths.calls_before(tid)
            if hook.role == "mem":
                rsp = regs.rsp + 16
                self.events.entered(tid, hook, regs.rdi, regs.rsi, read(regs.rsp), read(rsp),
                                    rsp & 0xFFFFFFFF, seq)
                return
            rsp = regs.rsp + L.MT_HF_RETURN
            if flavor == L.MT_HT_ENTRY:
                self.events.entered(tid, hook, regs.rdi, regs.rsi, read(regs.rsp + L.MT_HF_RDX),
                                    read(rsp), rsp & 0xFFFFFFFF, seq)
                return
            stamp = regs.r8 & 0xFFFFFFFF if flavor == L.MT_HT_STAMPED else splitter.take_stamp()
            result = read(regs.rsp + L.MT_HF_RAX)
            splitter.apply_stamped(stamp, lambda: self.events.returned(
                tid, hook, result, rsp & 0xFFFFFFFF, seq))

    # --------------------------------------------------------------- leaving
    def pause(self, mem) -> None:
        """A vfork child runs in this memory: the original entries (every thread of
        the parent is stopped)."""
        if self.active and not self.paused:
            self.patches.revert_copy(mem)
            self.paused = True

    def unpause(self, mem) -> None:
        if self.active and self.paused:
            for p in self.patches.applied.values():
                if mem.read(p.address, len(p.original)) == p.original:
                    mem.write(p.address, p.patched)
            self.paused = False

    def fork_child(self, child) -> None:
        """The original entries in a fork child's copy of the memory."""
        if self.active:
            self.patches.revert_copy(child.mem)
            if self.slow is not None:
                self.slow.remove(child.mem)

    def detach(self) -> None:
        """Every thread stopped: the entries back; threads inside a memcpy made
        through the alias finish it first (see the module)."""
        if not self.active:
            return
        self._finish_mem_calls()
        self.patches.revert(self.tracee.mem)
        if self.slow is not None and self.slow.active:
            self.slow.remove()
        self.engine.guard.remove_breakpoints(set(self.traps))
        self.active = False

    def forget(self) -> None:
        """exec: the stubs went with the image."""
        self.patches.applied.clear()
        self.active = False

    def _finish_mem_calls(self) -> None:
        """A thread inside a memcpy made through the alias runs until the call
        returns into its stub, then on out of the stub (to its caller, before the
        rewriter moves threads out of copies)."""
        returns = {h.stub + self.L.templates[h.template].marks["returned"]: h
                   for h in self.hooks if h.role == "mem"}
        if not returns:
            return
        for tid, state in list(self.tracee.threads.items()):
            if state.running or state.gone:
                continue
            regs = self.tracee.get_regs(tid)
            words = self.tracee.mem.read(regs.rsp, 512) if regs.rsp else b""
            found = [returns[w] for w in struct.unpack(f"<{len(words) // 8}Q", words) if w in returns]
            # a thread still in a stub, before its call (writing its group): it makes the
            # call through the alias next, so it runs to the return as well
            found += [h for h in returns.values()
                      if h.stub <= regs.rip < h.stub + self.L.templates[h.template].size]
            if found:
                area = self._area_of(found[0].stub)
                if run_to_return(self.tracee, tid, [r for r, h in returns.items() if h in found],
                                 area, lambda e: self.engine.claim_signal(self.tracee, e)):
                    self.stats["mem calls finished at detach"] += 1
                    step_until_out(self.tracee, tid, area)

    @property
    def trap_stops(self) -> int:
        """ptrace stops taken at the stubs' int3s (their slow paths)."""
        return self.stats["traps"] + (self.slow.stops if self.slow is not None else 0)

    def report(self) -> dict:
        return {"hooked": sorted(h.name for h in self.hooks), "breakpoints": dict(self.left),
                "events": dict(self.events.counts), **dict(self.stats),
                "unmatched_returns": self.events.unmatched_returns,
                "signals_in_group_writes": self.writer_windows.rewound,
                "order": self.rings.splitter.report() if self.rings.splitter else None}


def run_to_return(tracee, tid: int, returns: list[int], area: SharedArea, on_fault=None) -> bool:
    """Run thread ``tid`` (alone) until it reaches one of ``returns`` (an int3 put
    there for the while, through the area's own mapping); True if it did.  A
    fault on the way goes to ``on_fault(event)`` (the data engine: it may resume
    the thread itself); the program's own signals are delivered later."""
    from ...process import ptrace_raw as pr
    from ...process.events import SignalStop, ThreadExited, ThreadKilled, at_exit_event, regenerated
    thread = tracee.threads[tid]
    if any(at_exit_event(s.last_event) for s in list(tracee.threads.values())):
        return False    # the process is ending (exit_group): no call returns any more
    saved = {r: area.local[r - area.address] for r in returns}
    for r in returns:
        area.local[r - area.address] = INT3
    try:
        for _ in range(256):
            if not thread.running:
                pr.cont(tid, 0)
                thread.running = True
            event = _wait_for(tracee, tid)
            if event is None or isinstance(event, (ThreadExited, ThreadKilled)) or \
                    at_exit_event(event):
                return False
            regs = tracee.get_regs(tid)
            if isinstance(event, SignalStop) and event.signum == 5 and regs.rip - 1 in saved:
                regs.rip -= 1
                tracee.set_regs(regs, tid)
                return True
            if isinstance(event, SignalStop) and event.signum == 11 and on_fault is not None \
                    and on_fault(event):
                continue
            if regenerated(event):
                return False    # not carried out: it faults again when the thread runs on
            if isinstance(event, SignalStop) and event.signum != 5:
                thread.pending_signal = thread.pending_signal or event.signum
        return False
    finally:
        for r, byte in saved.items():
            area.local[r - area.address] = byte


def _wait_for(tracee, tid: int):
    """The next event of thread ``tid``, or None if it exits in another's exit: a
    thread group leader that exits is reported only once every other thread is
    gone, and the others wait at their exit stops for the tracer (waiting on the
    leader alone hung the detach of a process that exited meanwhile)."""
    while True:
        event = tracee.wait_event(block=False, tid=tid)
        if event is not None:
            return event
        if tid not in tracee.threads or is_exiting(tid):
            return None
        time.sleep(0.0005)


def _a_ret(address: int, code: bytes) -> int:
    """The address of a ``ret`` instruction in ``code`` (at ``address``), or 0."""
    offsets, sizes = sweep(as_buffer(code), address)
    for off, size in zip(offsets.tolist(), sizes.tolist()):
        if size == 1 and code[off] == RET:
            return address + off
    return 0


class NoEntryHooks:
    """The engine's ``entry_hooks`` when there are no hook stubs (the fault engine,
    --data-in): nothing is hooked in the target."""
    active = stubs = False
    trap_stops = 0

    def protected_changed(self, runs) -> None:
        pass

    def continue_at(self, function: int, address: int) -> bool:
        return False

    def patched_end(self, function: int) -> int:
        return 0

    def original_code(self, start: int, end: int) -> dict[int, bytes]:
        return {}

    def fork_child(self, child) -> None:
        pass

    def pause(self, mem) -> None:
        pass

    def unpause(self, mem) -> None:
        pass

    def detach(self) -> None:
        pass

    def forget(self) -> None:
        pass

    def report(self) -> None:
        return None


def entry_hooks_for(engine, rs: RemoteSyscalls):
    """Hook stubs for the hybrid engine (without --data-in, whose gate needs the
    breakpoint hooks' stops), else none; ``MADTRACE_HOOK_STUBS=0`` keeps the
    breakpoints under the hybrid engine too (to compare: bench/bench_hooks.py)."""
    if engine.paths is None or engine.gate is not None or \
            os.environ.get("MADTRACE_HOOK_STUBS", "1") == "0":
        return NoEntryHooks()
    return InlineHooks(engine, rs)
