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
function tracing).

``settle(tid, regs)`` moves a stopped thread out of a probe before a signal
is delivered to it (or before detach): back to the original instruction
when the record is not published yet (the registers are in the probe's
frame), forward past the instruction otherwise (single steps).
"""

from __future__ import annotations

import bisect
import ctypes
import struct
from collections import Counter
from dataclasses import dataclass, field

from ..arch.x86_64.function_copy import FRAME as STUB_FRAME
from ..arch.x86_64.function_copy import FunctionCopy, Probe, copy_function
from ..binary.eh_frame import EhFrame
from ..inject.areas import SharedArea, gap_for_module
from ..inject.patchset import Patch, PatchConflict, PatchSet
from ..process import ptrace_raw as pr
from ..process.events import SignalStop
from ..process.remote_syscall import RemoteSyscalls
from .alias import ALIAS_BIT
from .instruction_table import InstructionTable

AREA_SIZE = 64 << 20
# the copies, the alias bitmap their probes read and the rings of a data-only session
# stay or go together (inject/footprint.py)
GROUP = "madtrace-rewriting"
ENTRY_SLOT = 16          # jmp [rip + 0]; 2 bytes of padding; .quad target
PROBE_BYTES = 420        # room planned per memory instruction of a function
UNWINDER = "_Unwind_RaiseException"


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

    @property
    def latest(self) -> FunctionCopy | None:
        return self.copies[-1] if self.copies else None

    def probed(self, address: int) -> bool:
        latest = self.latest
        return latest is not None and any(p.original == address for p in latest.probes)


class CodeArea:
    def __init__(self, area: SharedArea):
        self.area = area
        self.cursor = area.address

    def room(self) -> int:
        return self.area.end - self.cursor


class Rewriter:
    def __init__(self, engine, ctl: int, bitmap: int, ids: InstructionTable, injector):
        self.engine = engine
        self.tracee = engine.tracee
        self.space = engine.space
        self.ctl = ctl
        self.bitmap = bitmap
        self.ids = ids
        self.L = injector
        self.areas: dict[str, CodeArea] = {}
        self.functions: dict[int, FunctionState] = {}
        self.refused: Counter = Counter()        # why functions were not relocated
        self.patches = PatchSet()
        self.stats: Counter = Counter()
        # (starts, copies) by address, replaced whole: the drain thread looks copies up
        self._copy_index: tuple[list[int], list[FunctionCopy]] = ([], [])
        self._eh: dict[str, EhFrame] = {}
        self.unwinder = any(self.space.find_functions(f"*:{UNWINDER}")) if \
            hasattr(self.space, "find_functions") else False

    # ---------------------------------------------------------------- lookups
    def copy_at(self, address: int) -> FunctionCopy | None:
        starts, copies = self._copy_index
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and address < copies[i].copy_end:
            return copies[i]
        return None

    def original_address(self, address: int) -> int:
        copy = self.copy_at(address)
        if copy is None:
            return address
        original = copy.original_of(address)
        return address if original is None else original

    def _bounds(self, rip: int):
        module = self.space.module_for(rip)
        if module is None:
            return None
        rel = rip - module.bias
        symbol = module.image.symbol_at(rel)
        if symbol is not None and symbol.kind in ("FUNC", "IFUNC") and symbol.size:
            fde = self._eh_of(module).fde_at(rel)
            lsda = fde.lsda if fde is not None and fde.start == symbol.address else 0
            return module, module.bias + symbol.address, module.bias + symbol.address + symbol.size, lsda
        fde = self._eh_of(module).fde_at(rel)
        if fde is None:
            return None
        return module, module.bias + fde.start, module.bias + fde.end, fde.lsda

    def _eh_of(self, module) -> EhFrame:
        eh = self._eh.get(module.name)
        if eh is None:
            eh = self._eh[module.name] = EhFrame(module.image)
        return eh

    def _state(self, rip: int) -> FunctionState | None:
        bounds = self._bounds(rip)
        if bounds is None:
            self.refused["outside any known function"] += 1
            return None
        module, start, end, lsda = bounds
        state = self.functions.get(start)
        if state is None:
            state = self.functions[start] = FunctionState(start, end, module)
            if lsda:
                state.refused = "C++ exception tables (no unwind information for moved code yet)"
            elif self.unwinder:
                state.refused = "a C++ unwinder is loaded (no unwind information for moved code yet)"
            if state.refused:
                self.refused[state.refused] += 1
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
            original = rip
        state = self._state(original)
        if state is None or state.refused:
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
        self._redirect_entry(state, state.latest)   # the thread is out of the old code now
        self.tracee.resume(tid, 0)
        self.stats["moved"] += 1
        return True

    def why_not(self, original: int) -> str:
        """Why the instruction at ``original`` has no probe."""
        bounds = self._bounds(original)
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

    def _code(self, state: FunctionState) -> bytes:
        """The function's bytes as the program has them (madtrace's own patches undone)."""
        code = bytearray(self.tracee.mem.read(state.start, state.end - state.start))
        for patch in self.patches.applied.values():
            if state.start <= patch.address < state.end:
                code[patch.address - state.start:patch.end - state.start] = patch.original
        for address, byte in self._breakpoints().items():
            if state.start <= address < state.end:
                code[address - state.start] = byte[0]
        for address, original in self.engine.entry_hooks.original_code(state.start, state.end).items():
            code[address - state.start:address - state.start + len(original)] = original
        return bytes(code)

    def _breakpoints(self) -> dict[int, bytes]:
        out = {}
        for hooks in self.engine._all_hooks():
            if hooks.active:
                out.update(hooks.saved_byte)
        return out

    def _relocate(self, state: FunctionState) -> bool:
        code = self._code(state)
        if not state.copies:
            state.frame_pointer = code[:8].replace(b"\xf3\x0f\x1e\xfa", b"")[:4] in \
                (b"\x55\x48\x89\xe5", b"\x55\x48\x8b\xec")
        area = self._area(state.module, len(code) * 3 + PROBE_BYTES * len(code) // 3 + 64)
        at = (area.cursor + 15) & ~15

        def new_id(mem) -> int:
            op = mem.operands[0]
            return self.ids.add(mem.address, op.size, (1 if op.load else 0) | (2 if op.store else 0),
                                mem.size)

        copy = copy_function(code, state.start, state.end, at, self.L, self._want(state), new_id,
                             self.ctl, self.bitmap)
        if not copy:
            state.refused = copy.reason
            self.refused[_reason_kind(copy.reason)] += 1
            return False
        if at + len(copy.code) > area.area.end:
            state.refused = "the code area is full"
            return False
        area.area.write(at, copy.code)
        area.cursor = at + len(copy.code)
        # a call made in the copy returns to the original code once the session ends
        area.area.return_points.update(copy.returns)
        state.copies.append(copy)
        starts, copies = self._copy_index
        i = bisect.bisect_left(starts, at)
        self._copy_index = (starts[:i] + [at] + starts[i:], copies[:i] + [copy] + copies[i:])
        self.stats["copies"] += 1
        return True

    def _area(self, module, need: int) -> CodeArea:
        area = self.areas.get(module.name)
        if area is None or area.room() < need + 64:
            size = max(AREA_SIZE, need * 2)
            with RemoteSyscalls(self.tracee, self._stopped_thread()) as rs:
                address = gap_for_module(self.tracee.pid, module.start, module.end, size)
                area = self.areas[module.name] = CodeArea(SharedArea(
                    rs, size, f"madtrace-copies-{module.name}", executable=True, address=address,
                    group=GROUP))
        return area

    def _stopped_thread(self) -> int | None:
        return next((t for t, s in self.tracee.threads.items() if not s.running), None)

    def _redirect_entry(self, state: FunctionState, copy: FunctionCopy) -> None:
        if self.engine.entry_hooks.continue_at(state.start, copy.address):
            return     # a hook stub's function (inline_hooks.py): the stub goes on in the copy
        if state.slot:
            # a newer copy: one aligned 8-byte store, seen whole by a thread jumping through it
            offset = state.slot + 8 - state.slot_area.area.address
            ctypes.c_uint64.from_buffer(state.slot_area.area.local, offset).value = copy.address
            return
        area = self.areas[state.module.name]
        why = self._entry_unpatchable(state, copy)
        if why:
            self.stats[f"entry not redirected: {why}"] += 1
            return
        slot = (area.cursor + 15) & ~15
        if slot + ENTRY_SLOT > area.area.end:
            return
        area.area.write(slot, b"\xff\x25\x02\x00\x00\x00\xcc\xcc" + struct.pack("<Q", copy.address))
        area.cursor = slot + ENTRY_SLOT
        original = self.tracee.mem.read(state.start, 5)
        patch = Patch(state.start, original, b"\xe9" + struct.pack("<i", slot - state.start - 5),
                      f"entry of the relocated {state.start:#x}")
        held = self.engine._hold_all()
        try:
            rips = [self.tracee.get_regs(t).rip for t, s in self.tracee.threads.items()
                    if not s.running]
            self.patches.apply(self.tracee.mem, [patch], rips)
            state.slot, state.slot_area = slot, area
            self.stats["entries redirected"] += 1
        except PatchConflict as exc:
            self.stats[f"entry not redirected: {exc}"] += 1
        finally:
            self.engine._resume(held)

    def _entry_unpatchable(self, state: FunctionState, copy: FunctionCopy) -> str | None:
        if state.end - state.start < 5:
            return "shorter than 5 bytes"
        if any(state.start <= a < state.start + 5 for a in self._breakpoints()):
            return "a breakpoint of madtrace's"
        if any(state.start <= a < state.start + 5 for a in self.engine.patched_addresses):
            return "patched by function tracing"
        if any(state.start < t < state.start + 5 for t in copy.targets):
            return "a branch targets its first bytes"
        return None

    # ----------------------------------------------------------- fix-ups
    def settle(self, tid: int, regs, synchronous: bool = False):
        """Move a stopped thread out of a probe (see the module); returns its
        registers as they are now.  ``synchronous``: the signal about to be
        delivered was raised by the thread's own instruction (a fault)."""
        copy = self.copy_at(regs.rip)
        stub = copy.stub_at(regs.rip) if copy is not None else None
        if stub is not None:
            return self._settle_stub(tid, regs, stub, synchronous)
        probe = copy.probe_at(regs.rip) if copy is not None else None
        if probe is None:
            return regs
        L = self.L
        marks = L.templates["probe"].marks
        body, rip = probe.body, regs.rip
        self.stats["threads settled"] += 1
        while probe.start < rip < body:           # saving the registers: a few steps on
            regs = self._step(tid)
            rip = regs.rip
        slow = body + marks["slow"]
        template_end = body + L.templates["probe"].size
        if rip == probe.start:
            return regs
        if body <= rip < body + marks["published"] or slow <= rip < template_end:
            return self._roll_back(tid, regs, probe, rip >= body + marks["flags"])
        while rip < probe.insn:                    # published: on to the instruction
            regs = self._step(tid)
            rip = regs.rip
        if rip == probe.insn:
            frame = regs.rsp
            used = self.tracee.mem.read_u64(frame + L.MT_PF_ADDR)
            if synchronous or not self.engine.alias.covers(used ^ ALIAS_BIT, (used ^ ALIAS_BIT) + 1):
                return self._roll_back(tid, regs, probe, True, restored=True)
            regs = self._step(tid)                # the access itself, through the alias
            rip = regs.rip
        frame = regs.rsp
        setattr(regs, probe.reg, self.tracee.mem.read_u64(frame + L.MT_PF_SAVED))
        regs.rsp = frame + L.MT_PROBE_FRAME
        regs.rip = probe.end
        self.tracee.set_regs(regs, tid)
        return regs

    def _settle_stub(self, tid: int, regs, stub, synchronous: bool):
        """A thread in an indirect jump's stub: on to the jump's target, or back to
        the jump when its target's load faulted."""
        if regs.rip == stub.start:
            return regs
        if synchronous and regs.rip == stub.load:
            read = self.tracee.mem.read_u64
            regs.rax, regs.rcx = read(regs.rsp), read(regs.rsp + 8)
            regs.rsp += STUB_FRAME
            regs.rip = self._original_or_copy(stub.original, stub.start)
            self.tracee.set_regs(regs, tid)
            return regs
        while stub.start < regs.rip < stub.end:
            regs = self._step(tid)
        return regs

    def _original_or_copy(self, original: int, copied: int) -> int:
        """Where a thread moved back goes: the original instruction, unless it lies
        in the five bytes the entry jump took."""
        bounds = self._bounds(original)
        state = self.functions.get(bounds[1]) if bounds else None
        patched = max(state.start + 5 if state.slot else 0,
                      self.engine.entry_hooks.patched_end(state.start)) if state else 0
        if state is not None and state.start < original < patched:
            return copied
        return original

    def _roll_back(self, tid: int, regs, probe: Probe, flags_saved: bool, restored: bool = False):
        """Back to the original instruction: the registers from the probe's frame."""
        L = self.L
        frame = regs.rsp
        read = self.tracee.mem.read_u64
        if restored:      # at the instruction: rax, rcx, rdx, flags are back; rA is not
            setattr(regs, probe.reg, read(frame + L.MT_PF_SAVED))
        else:
            regs.rax, regs.rcx, regs.rdx = (read(frame + off) for off in
                                            (L.MT_PF_RAX, L.MT_PF_RCX, L.MT_PF_RDX))
            if flags_saved:
                saved = read(frame + L.MT_PF_FLAGS)
                ah, of = (saved >> 8) & 0xFF, saved & 1
                regs.eflags = (regs.eflags & ~0x8D5) | (ah & 0xD5) | (of << 11)
        regs.rsp = frame + L.MT_PROBE_FRAME
        regs.rip = self._original_or_copy(probe.original, probe.start)
        self.tracee.set_regs(regs, tid)
        return regs

    def _step(self, tid: int):
        state = self.tracee.threads[tid]
        while True:
            pr.singlestep(tid, 0)
            state.running = True
            event = self.tracee.wait_event(block=True, tid=tid)
            if isinstance(event, SignalStop) and event.signum != 5:
                state.pending_signal = state.pending_signal or event.signum
                continue
            return self.tracee.get_regs(tid)

    # ------------------------------------------------------------- leaving
    def detach(self) -> None:
        """Every thread out of its probe and back in the original code, the entries
        back: calls made in copies return to the original code (``return_points``,
        given back by the footprint's release, which unmaps the copies when no
        frame needs them)."""
        for tid, thread in list(self.tracee.threads.items()):
            if thread.running:
                continue
            self._to_original(self.tracee, tid, self.settle(tid, self.tracee.get_regs(tid)))
        self.patches.revert(self.tracee.mem)

    def fork_child(self, child) -> None:
        """A fork child (stopped at its first stop, not traced further): the
        entries back to the original code in its copy of the memory (the
        footprint then unmaps its copies of the copies), its thread too."""
        self.patches.revert_copy(child.mem)
        for tid in child.threads:
            self._to_original(child, tid, child.get_regs(tid))

    def _to_original(self, tracee, tid: int, regs) -> None:
        """A thread at the start of a translated instruction goes to the original."""
        copy = self.copy_at(regs.rip)
        if copy is not None and regs.rip < copy.address + copy.code_size:
            original = copy.original_of(regs.rip)
            if original is not None and copy.old_to_new.get(original) == regs.rip:
                regs.rip = original
                tracee.set_regs(regs, tid)

    def report(self) -> dict:
        relocated = [s for s in self.functions.values() if s.copies]
        return {"functions_relocated": len(relocated),
                "copies": sum(len(s.copies) for s in relocated),
                "probes": sum(len(s.latest.probes) for s in relocated),
                "refused": dict(self.refused), **{k: v for k, v in self.stats.items()}}


def _reason_kind(reason: str) -> str:
    """A refusal's kind, without addresses (for counting)."""
    return reason.split(" at 0x")[0].split(" '")[0]
