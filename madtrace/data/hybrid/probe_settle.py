# SPDX-License-Identifier: GPL-2.0-or-later
"""Moving a stopped thread out of a probe or an indirect jump's stub of a
function copy (rewriting.py): before a signal is delivered to it, and at
detach.  Back to the original instruction when the probe's record is not
published yet (the registers are in the probe's frame), forward past the
instruction otherwise (single steps).  Split from rewriting.py."""

from __future__ import annotations

import signal

from ...arch.x86_64.function_copy import FRAME as STUB_FRAME
from ...arch.x86_64.function_copy import Probe
from ...arch.x86_64.jump_stubs import pushf_offset
from ...arch.x86_64.string_probes import PAIR, REPE, REPNE
from ...errors import TracerInternalError
from ...process import ptrace_raw as pr
from ...process.events import INSTRUCTION_FAULTS, SignalStop
from ...process.stepping import step
from .alias import ALIAS_BIT


MASK64 = (1 << 64) - 1
ZF = 0x40
FLAG_BITS = 0xCD5             # CF PF AF ZF SF DF OF: what the fix-up's popfq gives back
ALU_SIZE = 5                  # sub/add reg, [rsp + disp8] (string_probes.py _alu_rsp)
STORE_SIZE = 5                # mov [rsp + disp8], reg


class ProbeSettler:
    def __init__(self, rewriter):
        self.rw = rewriter

    def settle(self, tid: int, regs, synchronous: bool = False):
        """Move a stopped thread out of a probe (see the module); returns its
        registers as they are now.  ``synchronous``: the signal about to be
        delivered was raised by the thread's own instruction (a fault)."""
        copy = self.rw.copy_at(regs.rip)
        stub = copy.stub_at(regs.rip) if copy is not None else None
        if stub is not None:
            return self._settle_stub(tid, regs, stub)
        probe = copy.probe_at(regs.rip) if copy is not None else None
        if probe is None:
            return regs
        if probe.string:
            self.rw.stats["threads settled"] += 1
            return self._settle_string(tid, regs, probe, synchronous)
        L = self.rw.L
        marks = L.templates["probe"].marks
        body, rip = probe.body, regs.rip
        self.rw.stats["threads settled"] += 1
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
            used = self.rw.tracee.mem.read_u64(frame + L.MT_PF_ADDR)
            if synchronous or not self.rw.engine.alias.covers(used ^ ALIAS_BIT, (used ^ ALIAS_BIT) + 1):
                return self._roll_back(tid, regs, probe, True, restored=True)
            try:
                regs = self._step(tid)            # the access itself, through the alias
            except StepFaulted:                   # not carried out: back to the original
                return self._roll_back(tid, self.rw.tracee.get_regs(tid), probe, True,
                                       restored=True)
            rip = regs.rip
        while probe.insn < rip < probe.insn_end:   # a push's store of its value (the stack)
            regs = self._step(tid)
            rip = regs.rip
        frame = regs.rsp
        setattr(regs, probe.reg, self.rw.tracee.mem.read_u64(frame + L.MT_PF_SAVED))
        regs.rsp = frame + L.MT_PROBE_FRAME + probe.stack
        regs.rip = probe.end
        self.rw.tracee.set_regs(regs, tid)
        return regs

    def _settle_string(self, tid: int, regs, probe: Probe, synchronous: bool):
        """A thread in a string instruction's probe (arch/x86_64/string_probes.py):
        back to the instruction before its records are published (with the
        iterations done so far: rsi, rdi and rcx say where a rep stands), else on
        through the iteration and the loop's control to the loop's first byte
        (the instruction, its next iteration) or past the loop.

        What is plain register arithmetic (the probe's head, the registers'
        fix-up, the loop's control) is done here, not stepped: a madtrace
        killed while a thread is stopped after a single step leaves the trap
        flag set, and the fix-up's pushfq would even keep it in the flags it
        restores.  Only the published template's tail and the instruction
        itself are stepped."""
        L = self.rw.L
        template = L.templates["string_probe" if probe.string == PAIR else "probe"]
        marks = template.marks
        rip = regs.rip
        if rip == probe.start:
            return regs
        if rip < probe.head or rip >= probe.end:          # the loop's control
            return self._loop_on(tid, regs, probe)
        if rip < probe.body:                             # the head: only rsp is moved
            if rip > probe.head:
                regs.rsp += L.MT_PROBE_FRAME
            regs.rip = self._original_or_copy(probe.original, probe.start)
            self.rw.tracee.set_regs(regs, tid)
            return regs
        body, slow = probe.body, probe.body + marks["slow"]
        if body <= rip < body + marks["published"] or slow <= rip < body + template.size:
            return self._roll_back(tid, regs, probe, rip >= body + marks["flags"])
        while rip < probe.insn:                          # published: on to the instruction
            regs = self._step(tid)
            rip = regs.rip
        read = self.rw.tracee.mem.read_u64
        if rip == probe.insn:
            frame = regs.rsp
            used = [read(frame + L.MT_PF_ADDR)] + \
                ([read(frame + L.MT_PF_ADDR2)] if probe.string == PAIR else [])
            covered = all(self.rw.engine.alias.covers(a ^ ALIAS_BIT, (a ^ ALIAS_BIT) + 1) for a in used)
            if synchronous or not covered:
                return self._roll_back(tid, regs, probe, True, restored=True)
            try:
                regs = self._step(tid)
            except StepFaulted:
                return self._roll_back(tid, self.rw.tracee.get_regs(tid), probe, True,
                                       restored=True)
        if regs.rip < probe.end:
            regs = self._fix_up(regs, probe)
            self.rw.tracee.set_regs(regs, tid)
        return self._loop_on(tid, regs, probe)

    def _fix_up(self, regs, probe: Probe):
        """The fix-up and the tail of a string probe carried out on ``regs``: a
        thread after its instruction (string_probes.py ``_parts``: pushfq, sub
        and add per register, popfq, the store to the saved slot; then the
        reload and the frame popped), anywhere up to the probe's end."""
        L = self.rw.L
        read = self.rw.tracee.mem.read_u64
        other = "rdi" if probe.reg == "rsi" else "rsi"
        ops = [(probe.reg, -1, L.MT_PF_ADDR), (probe.reg, 1, L.MT_PF_SAVED)]
        if probe.string == PAIR:
            ops += [(other, -1, L.MT_PF_ADDR2), (other, 1, L.MT_PF_SAVED2)]
        fix = 1 + ALU_SIZE * len(ops) + 1 + STORE_SIZE
        start = probe.insn_end - fix
        rip = regs.rip
        if rip >= probe.insn_end:                        # the tail: the register reloaded
            frame = regs.rsp
            setattr(regs, probe.reg, read(frame + L.MT_PF_SAVED))
        else:
            popf = start + 1 + ALU_SIZE * len(ops)
            if start < rip <= popf:                      # the flags pushed: the frame is above
                frame = regs.rsp + 8
                done = (rip - start - 1) // ALU_SIZE
                if rip <= popf:
                    flags = read(regs.rsp)
                    regs.eflags = (regs.eflags & ~FLAG_BITS) | (flags & FLAG_BITS)
            else:
                frame = regs.rsp
                done = 0 if rip == start else len(ops)
            for name, sign, slot in ops[done:]:
                value = (getattr(regs, name) + sign * read(frame + slot)) & MASK64
                setattr(regs, name, value)
        regs.rsp = frame + L.MT_PROBE_FRAME
        regs.rip = probe.end
        return regs

    def _loop_on(self, tid: int, regs, probe: Probe):
        """After an iteration (or in the loop's control, ``lea rcx, [rcx - 1]``,
        ``jne``/``je``, ``jrcxz``, ``jmp``): on to the loop's next iteration,
        which is the instruction's place in the copy, or past the loop."""
        if not probe.loop:
            return regs
        rip = regs.rip
        tail = probe.end
        conditional = probe.loop in (REPE, REPNE)
        test = tail + 4 + (2 if conditional else 0)      # jrcxz
        if rip == tail:
            regs.rcx = (regs.rcx - 1) & MASK64
            rip = tail + 4
        done = False
        if conditional and rip == tail + 4:
            zf = bool(regs.eflags & ZF)
            done = (probe.loop == REPE and not zf) or (probe.loop == REPNE and zf)
            rip = test
        if not done and rip == test:
            done = regs.rcx == 0
        elif rip not in (test, test + 2, probe.head, probe.start, probe.last):
            raise TracerInternalError(f"thread {tid} at {regs.rip:#x} in the loop of a string "
                                      f"instruction")
        regs.rip = probe.last if done or rip == probe.last else probe.start
        self.rw.tracee.set_regs(regs, tid)
        return regs

    def _settle_stub(self, tid: int, regs, stub):
        """A thread in an indirect jump's stub: back to the jump up to the stub's
        pushfq (its target's load may read traced memory: stepping it faulted for
        ever at detach), on to the jump's target after it (the stub's table and
        the stack only)."""
        if regs.rip == stub.start:
            return regs
        mem = self.rw.tracee.mem
        pushf = stub.load + pushf_offset(mem.read(stub.load, 16))
        if regs.rip <= pushf:
            if regs.rip > stub.load:       # rax holds the target: the thread's is saved
                regs.rax = mem.read_u64(regs.rsp)
            regs.rsp += STUB_FRAME
            regs.rip = self._original_or_copy(stub.original, stub.start)
            self.rw.tracee.set_regs(regs, tid)
            self.rw.stats["threads put back at a jump"] += 1
            return regs
        while stub.start < regs.rip < stub.end:
            regs = self._step(tid)
        return regs

    def _original_or_copy(self, original: int, copied: int) -> int:
        """Where a thread moved back goes: the original instruction, unless it lies
        in the bytes an entry jump took (the copy's or function tracing's: back
        there, a call would be recorded twice)."""
        bounds = self.rw.bounds(original)
        state = self.rw.functions.get(bounds[1]) if bounds else None
        patched = max(state.start + 5 if state.slot else 0,
                      self.rw.engine.entry_hooks.patched_end(state.start)) if state else 0
        if state is not None and state.start < original < patched:
            return copied
        if self.rw.links.patched(original, original + 1):
            return copied
        return original

    def _roll_back(self, tid: int, regs, probe: Probe, flags_saved: bool, restored: bool = False):
        """Back to the original instruction: the registers from the probe's frame."""
        L = self.rw.L
        frame = regs.rsp
        read = self.rw.tracee.mem.read_u64
        if restored:      # at the instruction: rax, rcx, rdx, flags are back; rA is not
            setattr(regs, probe.reg, read(frame + L.MT_PF_SAVED))
            if probe.string == PAIR:
                regs.rdi = read(frame + L.MT_PF_SAVED2)
        else:
            regs.rax, regs.rcx, regs.rdx = (read(frame + off) for off in
                                            (L.MT_PF_RAX, L.MT_PF_RCX, L.MT_PF_RDX))
            if flags_saved:
                saved = read(frame + L.MT_PF_FLAGS)
                ah, of = (saved >> 8) & 0xFF, saved & 1
                regs.eflags = (regs.eflags & ~0x8D5) | (ah & 0xD5) | (of << 11)
        regs.rsp = frame + L.MT_PROBE_FRAME
        regs.rip = self._original_or_copy(probe.original, probe.start)
        self.rw.tracee.set_regs(regs, tid)
        return regs

    def _step(self, tid: int):
        """One instruction; the thread's own asynchronous signals met meanwhile are
        kept for its next resume.  An instruction that faults is not carried out
        (it would fault again at each step): StepFaulted."""
        state = self.rw.tracee.threads[tid]
        while True:
            event = step(self.rw.tracee, tid)      # never a stale interrupt's trap
            if isinstance(event, SignalStop) and event.signum in INSTRUCTION_FAULTS:
                raise StepFaulted(f"thread {tid}: signal {event.signum} at "
                                  f"{self.rw.tracee.get_regs(tid).rip:#x} while moved out of a copy")
            if isinstance(event, SignalStop) and event.signum != signal.SIGTRAP:
                state.pending_signal = state.pending_signal or event.signum
                continue
            # a jump stub's popfq stepped: the trap flag would stay set (ptrace_raw)
            return pr.clear_stepped_trap_flag(tid, self.rw.tracee.get_regs(tid))


class StepFaulted(TracerInternalError):
    """A thread moved out of a probe or a stub met a fault: the instruction was
    not carried out, the thread stays where it was."""
