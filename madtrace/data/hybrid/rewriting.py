# SPDX-License-Identifier: GPL-2.0-or-later
"""Relocated functions with probes: the hybrid data engine's in-target path.

A fault on a traced page names an instruction (discovery).  ``discover``
moves the function it is in to a code area near its module, with a probe on
every memory operand that can reach traced memory (function_copy.py; stack
operands are left alone), and moves the faulting thread to the same
instruction in the copy (on-stack replacement): it resumes in the probe,
which records the access into the thread's ring and reaches the data through
its alias.  The function's entry jumps to the copy from then on, through an
entry slot of the code area (``jmp [rip]; .quad copy``), so that a later
version of the copy (an instruction discovered later that was not probed)
takes over with one 8-byte store.  A thread returning into the old code, or
into an older copy, faults at its next traced access and is moved over too.
The old code is never changed but for the five bytes of the entry, so it
stays correct wherever control reaches it.

Not relocated (their instructions stay on the fault path, with the reason in
``refused``): code outside any function (no symbol, no .eh_frame entry),
functions with C++ exception tables or in a process with a C++ unwinder
(their moved code has no unwind information yet), what function_copy.py
refuses.  The entry is not redirected (threads reach the copy by on-stack
replacement only) when the function is shorter than 5 bytes, a branch of it
targets its first 5 bytes, or madtrace already patched it (a breakpoint,
function tracing).  A function whose entry function tracing patched is
copied from its own bytes (that patch undone), and its entry trampoline
jumps to the copy after the entry record (calls/entry_links.py), so that
its calls run the probes with no fault.  A branch of the function to its
own entry (a call, for function tracing) is aimed at the original entry in
the copy (entry_branches.py); where that cannot be done, a copy made while
function tracing patches the entry keeps the jump to its trampoline and is
entered by on-stack replacement only.

``settle(tid, regs)`` moves a stopped thread out of a probe before a signal
is delivered to it (or before detach): back to the original instruction
when the record is not published yet (the registers are in the probe's
frame), forward past the instruction otherwise (single steps).
"""

from __future__ import annotations

import bisect
import gc
import os
import time
from types import SimpleNamespace
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ...arch.x86_64.function_copy import FunctionAnalysis, FunctionCopy, analyse, copy_function
from ...arch.x86_64.relocate import Refusal
from ...binary.eh_frame import EhFrame
from ...binary.maps import read_maps
from ...errors import MadtraceError, TracerInternalError
from ...target.areas import CodeArea
from ...calls.entry_links import EntryLinks
from ...target.mappings import step_until_out
from ...target.patchset import PatchSet
from .copy_frames import CopyFrames
from .copy_areas import CopyAreas
from .copy_sites import mirror
from .entry_branches import to_original_entry
from .analysis_cache import AnalysisCache
from .discovery_cache import DiscoveryCache
from .entry_cache import EntryCache
from .entry_redirect import redirect_entry
from ..instruction_table import InstructionTable
from .plt_copies import PltCopies
from .probe_settle import ProbeSettler

SYSCALL = b"\x0f\x05"

# the copies, the alias bitmap their probes read and the rings of a data-only session
# stay or go together (target/mappings.py)
GROUP = "madtrace-rewriting"
PROBE_BYTES = 420        # room planned per memory instruction of a function
RETRY_INTERVAL = 0.01    # seconds between tries of a registration the unwinder's lock held up
# Tiers (--copy-after N): a function is copied once N of its accesses faulted.  The
# first fault of each instruction comes to the rewriter; after it the fault loop carries
# the instruction and gives back one fault in COLD_ASK + 1 (paths.py), which stands for
# that many.  With N = 32 a hot loop is copied after ~32 fault-path accesses and cold
# code is never copied; but an instruction's first fault on the fault path costs the
# tracer ~0.5-1 ms (decoding, its two stubs), about what copying a small function does:
# python3 -c ran 2.2x slower with N = 32 (13 000 such faults), a compute-heavy run 8%
# faster (38 copies avoided).  Default: 1, a function is copied at its first fault.
COPY_AFTER = 1
COLD_ASK = 15


@dataclass
class FunctionState:
    start: int
    end: int
    module: object
    copies: list[FunctionCopy] = field(default_factory=list)
    wanted: set[int] = field(default_factory=set)
    refused: str | None = None
    slot: int = 0                 # entry slot (0: entry not redirected) ...
    slot_area: "CodeArea | None" = None   # ... in this code area (a module may get several)
    frame_pointer: bool = False
    fde: object = None            # its unwind information (binary/eh_frame.py Fde), if any
    unregistered: tuple[FunctionCopy, str] | None = None   # a copy (and its self_entry)
    # waiting for its unwind information
    analysis: FunctionAnalysis | None = None  # kept for the next copy (function_copy.py)
    # the latest copy's branches to the function's own entry: "" none, or aimed at the
    # original entry (entry_branches.py); "baked": it keeps function tracing's entry jump
    # (right while function tracing patches the entry); "internal": they reach the
    # copy's start (right while it does not)
    self_entry: str = ""
    heat: int = 0                 # its faults while not copied (COPY_AFTER)
    cold: set[int] = field(default_factory=set)   # its instructions carried by the fault loop
    # while it was cold
    loop_moves: set[int] = field(default_factory=set)   # instructions the fault loop moves
    # to the latest copy by itself

    @property
    def latest(self) -> FunctionCopy | None:
        return self.copies[-1] if self.copies else None

    def probed(self, address: int) -> bool:
        latest = self.latest
        return latest is not None and latest.probe_of(address) is not None


class Rewriter:
    def __init__(self, engine, ctl: int, bitmap: int, ids: InstructionTable, injector,
                 rings=None):
        self.engine = engine
        self.tracee = engine.tracee
        self.space = engine.space
        self.ctl = ctl
        self.bitmap = bitmap
        self.ids = ids
        self.L = injector
        self.functions: dict[int, FunctionState] = {}
        self.refused: Counter = Counter()        # why functions were not relocated
        self.patches = PatchSet()
        self.stats: Counter = Counter()
        # (starts, copies) by address, replaced whole: the drain thread looks copies up
        self._copy_index: tuple[list[int], list[FunctionCopy]] = ([], [])
        self._eh: dict[str, EhFrame] = {}
        self.frames = CopyFrames(engine, injector, rings)
        self._unregistered: list[FunctionState] = []   # see _retry_unregistered
        self._next_retry = 0.0
        self.links: EntryLinks = getattr(engine, "entry_links", None) or EntryLinks()
        self.links.step_aside = self._step_aside
        self.links.copy_address = self.copy_address
        self.links.mirror = lambda patches, on: mirror(self, patches, on)
        self.code_areas = CopyAreas(self.tracee, GROUP, self._stopped_thread)
        self.plt = PltCopies(self)
        self._bounds_of: dict[int, tuple | None] = {}   # faulting instructions' functions
        self.entry_cache = EntryCache()
        self.analysis_cache = AnalysisCache()
        self.discovery = DiscoveryCache(
            program=lambda: self.space.main.image if self.space.main is not None else None)
        self.settler = ProbeSettler(self)
        self.copy_after = COPY_AFTER  # 1: every function is copied at its first fault
        # the fault loop gives back no fault of these any more (cold before, copied now)
        self.now_hot: Callable[[set[int]], None] = lambda addresses: None
        # a fault at an original instruction moves the thread to this address of the copy
        # in the fault loop, without the tracer's Python (0: no more)
        self.loop_move: Callable[[int, int], None] = lambda original, to: None

    # ---------------------------------------------------------------- lookups
    def area_of(self, address: int) -> CodeArea | None:
        return self.code_areas.area_of(address)

    def copy_at(self, address: int) -> FunctionCopy | None:
        starts, copies = self._copy_index
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < copies[i].copy_end:
            return copies[i]
        return None

    def copy_address(self, original: int) -> int | None:
        """Where the instruction at ``original`` runs in its function's latest copy
        (None: no copy, or not there).  For a breakpoint's owner that has stepped
        a thread over the function's first instruction: resuming there instead of
        in the original code saves the fault that would move the thread."""
        bounds = self.bounds(original)
        state = self.functions.get(bounds[1]) if bounds else None
        if state is None or state.latest is None or state.refused:
            return None
        if state.self_entry == "baked" and self.links.patched(original, original + 1):
            return None       # the copy holds function tracing's jump there
        return state.latest.old_to_new.get(original)

    def original_address(self, address: int) -> int:
        copy = self.copy_at(address)
        if copy is None:
            return address
        original = copy.original_of(address)
        return address if original is None else original

    def bounds(self, rip: int):
        """(module, start, end, FDE or None) of the function holding ``rip``."""
        found = self._bounds_of.get(rip, self)
        if found is self:
            found = self._bounds_of[rip] = self._find_bounds(rip)
        return found

    def _find_bounds(self, rip: int):
        module = self.space.module_for(rip)
        if module is None and self.space.mapping_for(rip) is None:
            module = self._learn_module(rip)     # mapped since the space was read: dlopen
        if module is None:
            return None
        rel = rip - module.bias
        symbol = module.image.symbol_at(rel)
        fde = self._eh_of(module).fde_at(rel)
        if symbol is not None and symbol.kind in ("FUNC", "IFUNC") and symbol.size:
            return module, module.bias + symbol.address, module.bias + symbol.address + symbol.size, fde
        if fde is None:
            return None
        return module, module.bias + fde.start, module.bias + fde.end, fde

    def _learn_module(self, rip: int):
        """The module holding ``rip`` from the maps read again (a library loaded by
        dlopen after the address space was read), added to the address space."""
        try:
            maps = read_maps(self.tracee.pid)
        except MadtraceError:
            return None
        added = self.space.learn_modules(maps, self.tracee.mem.read, pid=self.tracee.pid)
        if added:
            self.stats["modules learnt at a fault"] += len(added)
            if self.warm_start_wanted():    # what earlier runs learnt of it
                self.warm_start(added)
        return self.space.module_for(rip)

    def warm_start_wanted(self) -> bool:
        """Whether what earlier runs relocated is laid out before it faults: in a
        launched program only (engine.warm_start: at an attach the threads are
        anywhere); MADTRACE_WARM_START=0 turns it off (the comparison), and so does
        --copy-after N > 1 (functions copied once hot in this run)."""
        return bool(getattr(self.engine, "warm_start", False)) and \
            os.environ.get("MADTRACE_WARM_START", "1") != "0" and self.copy_after <= 1

    def warm_start(self, modules=None) -> int:
        """The functions earlier runs relocated in ``modules`` (default: every module
        of the address space) relocated now, their entries pointed at their copies
        (discovery_cache.py), so that they do not fault first.  Every thread is
        stopped.  Returns how many were laid out."""
        laid = 0
        # thousands of long-lived objects made at once (analyses, copies): the
        # collector's passes over them cost more than the copies (then frozen)
        gc.disable()
        try:
            for module in modules if modules is not None else list(self.space.modules):
                if module.name == "[vdso]" or getattr(module.image, "path", None) is None:
                    continue
                for start, end, wanted in self.discovery.functions(module):
                    bounds = self.bounds(start)
                    if bounds is None or bounds[1:3] != (start, end):
                        continue              # not the function it was (its bounds changed)
                    state = self._state(start)
                    if state is None or state.copies or state.refused:
                        continue
                    state.wanted.update(wanted)
                    if self._relocate(state) and state.latest is not None:
                        redirect_entry(self, state, state.latest)
                        laid += 1
        finally:
            if modules is None:      # the start: what it made lives as long as the run
                gc.freeze()
            gc.enable()
        self.discovery.stats["functions laid out before their first fault"] += laid
        return laid

    def _eh_of(self, module) -> EhFrame:
        eh = self._eh.get(module.name)
        if eh is None:
            eh = self._eh[module.name] = EhFrame(module.image)
        return eh

    def _state(self, rip: int) -> FunctionState | None:
        bounds = self.bounds(rip)
        if bounds is None:
            self.refused["outside any known function"] += 1
            return None
        module, start, end, fde = bounds
        state = self.functions.get(start)
        if state is None:
            state = self.functions[start] = FunctionState(start, end, module, fde=fde)
        return state

    # -------------------------------------------------------------- discovery
    def discover(self, tid: int, regs) -> bool:
        """A fault of ``tid`` at ``regs.rip`` on a traced page: True when the thread
        now runs a probe of that instruction (it was resumed), False when the fault
        path must handle it."""
        rip = regs.rip
        copy = self.copy_at(rip)
        if copy is not None:
            if copy.probe_at(rip) is not None:
                return False               # a probe's own access, on a page without alias
            original = copy.original_of(rip)
            if original is None:
                return False
        else:
            if self.plt.discover(tid, regs):
                return True                # a PLT stub's jump through the GOT
            original = self.engine.code_address(rip)   # a trampoline's relocated prologue
        state = self._state(original)
        if state is None or state.refused:
            return False
        self._retry_unregistered()
        if state.unregistered is not None:
            return False
        was_cold = state.cold if not state.copies else set()
        if not state.copies and not self._hot(state, original):
            return False                   # cold: the fault path carries it
        if state.copies and self._stale(state):
            state.wanted.add(original)
            if not self._relocate(state):
                return False
        if not state.probed(original):
            if original in state.wanted:
                return False               # wanted before, could not be probed
            state.wanted.add(original)
            if not self._relocate(state):
                return False
            if not state.probed(original):
                return False
        regs.rip = state.latest.old_to_new[original]
        self.tracee.set_regs(regs, tid)
        redirect_entry(self, state, state.latest)   # the thread is out of the old code now
        self.tracee.resume(tid, 0)
        self.stats["moved"] += 1
        # the next fault there moves the thread in the fault loop: a thread comes back
        # into old code again and again when code no fault ever copies jumps there (a
        # function's .cold part into the middle of its hot part: 5000 moves of python3)
        for address in was_cold | ({original} if copy is None and rip == original else set()):
            self._move_in_loop(state, address)
        return True

    def _move_in_loop(self, state: FunctionState, original: int) -> None:
        latest = state.latest
        if latest is not None and not state.self_entry and latest.probe_of(original) is not None:
            state.loop_moves.add(original)
            self.loop_move(original, latest.old_to_new[original])

    def _hot(self, state: FunctionState, original: int) -> bool:
        """A fault of a function not copied yet: whether it is hot now (COPY_AFTER)."""
        state.heat += COLD_ASK + 1 if original in state.cold else 1
        if state.heat < self.copy_after:
            state.cold.add(original)
            self.stats["cold faults"] += 1
            return False
        if state.cold:
            self.now_hot(state.cold)
            state.cold = set()
        return True

    def cold(self, original: int) -> bool:
        """Whether ``original`` is carried by the fault path until its function is hot."""
        state = self._known_state(original)
        return state is not None and original in state.cold

    def waiting(self, original: int) -> bool:
        """Whether the function holding ``original`` has a copy waiting for its
        unwind information (``_retry_unregistered``)."""
        state = self._known_state(original)
        return state is not None and state.unregistered is not None

    def _known_state(self, original: int) -> FunctionState | None:
        bounds = self.bounds(original)
        return self.functions.get(bounds[1]) if bounds else None

    def why_not(self, original: int) -> str:
        """Why the instruction at ``original`` has no probe."""
        if self.plt.tried.get(original):
            return f"PLT stub: {self.plt.tried[original]}"
        bounds = self.bounds(original)
        state = self.functions.get(bounds[1]) if bounds else None
        if state is None:
            return "outside any known function"
        if state.refused:
            return _reason_kind(state.refused)
        latest = state.latest
        if latest is not None and original in latest.unprobed:
            return latest.unprobed[original]
        return "not probed"

    def _want(self, state: FunctionState):
        engine = self.engine

        def want(mem) -> bool:
            if mem.address in state.wanted:
                return True
            op = mem.operands[0]
            if op.base == "rsp" or (op.base == "rbp" and state.frame_pointer):
                return False               # the stack
            if op.base == "rip":
                return engine.is_protected((mem.end + op.disp) & ~4095)
            return True
        return want

    def _stale(self, state: FunctionState) -> bool:
        """The latest copy no longer fits function tracing's patch at the entry:
        it keeps the jump to a trampoline that is gone, or a branch of it to its
        entry (a call, for function tracing) would skip the entry record."""
        if not state.self_entry:
            return False
        return (state.self_entry == "baked") != self.links.traced(state.start)

    def _code(self, state: FunctionState, entry: bool = True) -> bytes:
        """The function's bytes as the program has them (madtrace's own patches
        undone; function tracing's at the entry too, with ``entry``)."""
        code = bytearray(self.tracee.mem.read(state.start, state.end - state.start))
        for patch in self.patches.covering(state.start, state.end):
            if state.start <= patch.address:
                # (an entry jump may reach past a short function's end, into padding)
                at = patch.address - state.start
                kept = patch.original[:len(code) - at]
                code[at:at + len(kept)] = kept
        if entry and self.links.traced(state.start):
            for address, original in self.links.original(state.start, state.start + 1):
                if address == state.start:
                    code[:len(original)] = original
        for address, byte in self._breakpoints().items():
            if state.start <= address < state.end:
                code[address - state.start] = byte[0]
        for address, original in self.engine.entry_hooks.original_code(state.start, state.end).items():
            code[address - state.start:address - state.start + len(original)] = original
        return bytes(code)

    def _breakpoints(self) -> dict[int, bytes]:
        out = {}
        for hooks in self.engine.all_hooks():
            if hooks.active:
                out.update(hooks.saved_bytes)
        return out

    def _relocate(self, state: FunctionState) -> bool:
        code = self._code(state)
        if not state.copies:
            state.frame_pointer = code[:8].replace(b"\xf3\x0f\x1e\xfa", b"")[:4] in \
                (b"\x55\x48\x89\xe5", b"\x55\x48\x8b\xec")
        copy = self._copy(state, code)
        self_entry = ""
        if copy and state.start in copy.targets and \
                not to_original_entry(code, state.start, copy, _branches_to_start(state)):
            self_entry = "internal"
            if self.links.traced(state.start):   # a branch to the entry is a call for it
                copy, self_entry = self._copy(state, self._code(state, entry=False)), "baked"
        if not copy:
            state.refused = copy.reason
            self.refused[_reason_kind(copy.reason)] += 1
            return False
        if not self.code_areas.place(self.code_areas.newest[state.module.name], copy):
            state.refused = "the code area is full"
            return False
        (starts, copies), at = self._copy_index, copy.address
        i = bisect.bisect_left(starts, at)
        self._copy_index = (starts[:i] + [at] + starts[i:], copies[:i] + [copy] + copies[i:])
        self.stats["copies"] += 1
        return self._activate(state, copy, self_entry)

    def _copy(self, state: FunctionState, code: bytes):
        """``code`` copied with probes, for the code area's next free address."""
        try:
            area = self.code_areas.for_module(state.module,
                                              len(code) * 3 + PROBE_BYTES * len(code) // 3 + 64)
        except TracerInternalError as exc:      # no room near the module: not relocated
            return Refusal(str(exc))
        at = (area.cursor + 15) & ~15

        def new_id(mem, op=None, first: int = 1) -> int:
            op = op or mem.operands[0]
            return self.ids.add(mem.address, op.size, (1 if op.load else 0) | (2 if op.store else 0),
                                mem.size, first)

        analysis = self._analysis(state, code)
        if isinstance(analysis, Refusal):
            return analysis
        copy = copy_function(code, state.start, state.end, at, self.L, self._want(state), new_id,
                             self.ctl, self.bitmap, analysis=analysis)
        if not isinstance(copy, Refusal) and copy.address + len(copy.code) > area.end:
            # larger than planned (string instructions' probes): in an area with room for it
            try:
                area = self.code_areas.for_module(state.module, len(copy.code) + 64)
            except TracerInternalError as exc:
                return Refusal(str(exc))
            at = (area.cursor + 15) & ~15
            copy = copy_function(code, state.start, state.end, at, self.L, self._want(state),
                                 new_id, self.ctl, self.bitmap, analysis=analysis)
        return copy

    def _retry_unregistered(self) -> None:
        """Copies whose unwind information waits for the unwinder's lock: tried at
        every fault (of any function: the thread that held the lock has likely
        left it by then), at most every RETRY_INTERVAL seconds."""
        if not self._unregistered or time.monotonic() < self._next_retry:
            return
        while self._unregistered:
            state = self._unregistered[0]
            if not self._activate(state, *state.unregistered):
                if state.unregistered is not None:     # still held: later
                    self._next_retry = time.monotonic() + RETRY_INTERVAL
                    return
            self._unregistered.pop(0)

    def _activate(self, state: FunctionState, copy: FunctionCopy, self_entry: str) -> bool:
        """The copy goes into use once the unwinder knows it (copy_frames.py)."""
        state.unregistered = None
        if self.frames.loaded():
            built = self.frames.build(state, copy)
            if isinstance(built, str):
                state.refused = f"no unwind information for its copy: {built}"
                self.refused[_reason_kind(state.refused)] += 1
                return False
            if built is not None and not self.frames.register(*built):
                if state not in self._unregistered:
                    self._unregistered.append(state)
                state.unregistered = (copy, self_entry)   # the unwinder's lock was held: later
                self.stats["unwind registrations deferred"] += 1
                return False
        state.copies.append(copy)
        state.self_entry = self_entry
        self.discovery.learnt(state.module, state.start, state.end, state.wanted)
        moves, state.loop_moves = state.loop_moves, set()
        for original in moves:          # to the new copy, or back to Python
            self._move_in_loop(state, original)
            if original not in state.loop_moves:
                self.loop_move(original, 0)
        # call-site trampolines return into the copy from now on (entry_links.py)
        self.stats["call sites returning into copies"] += \
            self.links.point_returns(state.start, state.end, copy.old_to_new)
        return True

    def _analysis(self, state: FunctionState, code: bytes) -> FunctionAnalysis | Refusal:
        """The function's analysis: made once, kept while its bytes stay the same
        (its instructions' entries from the copier cache where they are there)."""
        if state.analysis is None or state.analysis.code != code:
            made = self.analysis_cache.get(state.module, code, state.start, state.end)
            if made is None:
                self.entry_cache.prepare(state.module)
                made = analyse(code, state.start, state.end)
                if isinstance(made, Refusal):
                    return made
                self.entry_cache.used(state.module, (code[o:o + z] for o, z in
                                                     zip(made.offset.tolist(), made.size)))
                self.analysis_cache.put(state.module, made)
            state.analysis = made
        return state.analysis

    def _stopped_thread(self) -> int | None:
        return next((t for t, s in self.tracee.threads.items() if not s.running), None)

    def _step_aside(self, start: int) -> None:
        """Function tracing patches the entry at ``start`` (every thread stopped):
        the jump to the copy goes, so that it relocates the function's own bytes;
        its trampoline goes on to the copy instead (calls/entry_links.py)."""
        state = self.functions.get(start)
        if state is not None:
            # the next fault in its original code comes to discover (the entry is
            # pointed at the copy again there), not to the fault loop's move
            for original in state.loop_moves:
                self.loop_move(original, 0)
            state.loop_moves = set()
        if state is not None and state.slot:
            self.patches.revert(self.tracee.mem, [start])
            state.slot, state.slot_area = 0, None
            self.stats["entries given to function tracing"] += 1

    # ----------------------------------------------------------- fix-ups
    def settle(self, tid: int, regs, synchronous: bool = False):
        """Move a stopped thread out of a probe (see the module and probe_settle.py);
        returns its registers as they are now."""
        return self.settler.settle(tid, regs, synchronous)

    # ------------------------------------------------------------- leaving
    def detach(self) -> None:
        """Every thread out of its probe and back in the original code, the entries
        back: calls made in copies return to the original code (``return_points``,
        given back by MadtraceAreas' release, which unmaps the copies when no
        frame needs them)."""
        for tid, thread in list(self.tracee.threads.items()):
            if thread.running:
                continue
            self._out_of_copy(self.tracee, tid, self.settle(tid, self.tracee.get_regs(tid)))
        self.patches.revert(self.tracee.mem)
        # trampolines back to the original code, and written so from now on (function
        # tracing may go on: REPL `trace data off`; its patches are still mirrored into
        # the copies, which a thread returning into one may run until the session ends)
        self.links.reset()
        self.links.step_aside = self.links.copy_address = None
        # threads go on running calls made in the copies, and loops of them, until
        # the session ends: MadtraceAreas' release moves those stopped at one of
        # their instructions back (every patch is reverted by then)
        for area in self.code_areas.all:
            area.area.move_out = self._out_of_copy
            area.area.original_of = self._original_instruction

    def fork_child(self, child) -> None:
        """A fork child (stopped at its first stop, not traced further): the
        entries back to the original code in its copy of the memory (the
        footprint then unmaps its copies of the copies), its thread too."""
        self.patches.revert_copy(child.mem)
        for tid in child.threads:
            self._to_original(child, tid, child.get_regs(tid))

    def _out_of_copy(self, tracee, tid: int, regs) -> None:
        """A stopped thread in a copy goes to the original code: inside an indirect
        jump's stub (stopped there by the detach's stop), it runs on to the
        instruction the stub jumps to first (a few straight instructions)."""
        after = self._after_syscall(tracee, regs.rip)
        if after is not None:
            # stopped in (or just out of) a system call made in the copy, where what
            # follows the syscall in the copy is no translated instruction: the
            # original's syscall is left the same way (a call the kernel restarts
            # goes back 2 bytes, onto it); stepping would wait for the call to end
            regs.rip = after
            tracee.set_regs(regs, tid)
            return
        if self._between_instructions(regs.rip):
            step_until_out(tracee, tid, SimpleNamespace(contains=self._between_instructions))
            if tid not in tracee.threads:
                return
            regs = tracee.get_regs(tid)
        self._to_original(tracee, tid, regs)

    def _after_syscall(self, tracee, address: int) -> int | None:
        """The original address after the syscall instruction that ends at
        ``address`` in a copy, when ``address`` itself is no translated
        instruction's start (None otherwise)."""
        copy = self.copy_at(address)
        if copy is None or address >= copy.address + copy.code_size or \
                self._original_instruction(address) is not None:
            return None
        original = self._original_instruction(address - 2)
        if original is None:
            return None
        try:
            if tracee.mem.read(address - 2, 2) != SYSCALL or \
                    tracee.mem.read(original, 2) != SYSCALL:
                return None
        except MadtraceError:
            return None
        return original + 2

    def _between_instructions(self, address: int) -> bool:
        """``address`` lies in a copy's code but at no translated instruction's start."""
        copy = self.copy_at(address)
        return copy is not None and address < copy.address + copy.code_size and \
            self._original_instruction(address) is None

    def _original_instruction(self, address: int) -> int | None:
        """The original instruction a copy's instruction at ``address`` stands for
        (None: ``address`` is not the start of one, a probe's say)."""
        copy = self.copy_at(address)
        if copy is None or address >= copy.address + copy.code_size:
            return None
        original = copy.original_of(address)
        return original if original is not None and copy.old_to_new.get(original) == address \
            else None

    def _to_original(self, tracee, tid: int, regs) -> None:
        """A thread at the start of a translated instruction goes to the original
        (or, where function tracing's entry patch still is, to the trampoline's
        relocated copy of that instruction: its call is recorded already)."""
        if self.plt.to_original(tracee, tid, regs):
            return
        copy = self.copy_at(regs.rip)
        if copy is not None and regs.rip < copy.address + copy.code_size:
            original = copy.original_of(regs.rip)
            if original is not None and copy.old_to_new.get(original) == regs.rip:
                regs.rip = self.links.resume_at(original) if tracee is self.tracee else original
                tracee.set_regs(regs, tid)

    def report(self) -> dict:
        cache = self.entry_cache.stats
        if cache["files_read"] or cache["files_written"]:
            self.stats["instruction entries from the copier cache"] = cache["loaded"]
            self.stats["copier cache files written"] = cache["files_written"]
        self.stats.update({k: v for k, v in self.analysis_cache.stats.items() if v})
        self.stats.update({k: v for k, v in self.discovery.stats.items() if v})
        relocated = [s for s in self.functions.values() if s.copies]
        cold = [s for s in self.functions.values() if s.cold and not s.copies]
        return {"functions_relocated": len(relocated),
                "functions_cold": len(cold), "instructions_cold": sum(len(s.cold) for s in cold),
                "copies": sum(len(s.copies) for s in relocated),
                "probes": sum(len(s.latest.probes) for s in relocated),
                "refused": dict(self.refused), **{k: v for k, v in self.stats.items()}}


def _branches_to_start(state: FunctionState) -> list[int] | None:
    """Where the function's direct branches to its own start are (its analysis)."""
    a = state.analysis
    if a is None or a.refusal is not None:
        return None
    return [a.address[i] for i, target in zip(a.branch_index.tolist(), a.branch_target.tolist())
            if target == state.start]


def _reason_kind(reason: str) -> str:
    """A refusal's kind, without addresses (for counting)."""
    return reason.split(" at 0x")[0].split(" '")[0]

