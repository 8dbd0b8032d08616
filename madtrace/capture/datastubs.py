"""Out-of-line stubs of the data engine's fast path (template: injector/
trampolines.S, ``dataopen`` + relocated instruction + ``dataclose``).

One stub per (faulting instruction, pages it touches): the pages are
immediates of the stub, so stubs are safe with threads and signals.  They
live in code areas within rel32 reach of the instruction's module (the
relocated instruction may be RIP-relative), created on demand.  Instructions
that branch, repeat (rep), or cannot be relocated take the slow path.
"""

from __future__ import annotations

import bisect

from ..arch.x86_64.memops import MemInstruction
from ..arch.x86_64.relocate import relocate_entry
from ..binary.address_space import AddressSpace
from ..errors import MadtraceError
from ..inject.areas import SharedArea, gap_for_module
from ..inject.templates import load_injector
from ..process import ptrace_raw as pr
from ..process.remote_syscall import PROT_NONE, RemoteSyscalls
from ..process.tracee import Tracee
from .regions import page_runs

AREA_SIZE = 8 << 20
MAX_STUBS = 200_000
SLOW_MNEMONICS = ("call", "jmp", "ret", "j", "loop", "syscall", "int", "xbegin", "enter", "leave")


class StubCache:
    def __init__(self, tracee: Tracee, space: AddressSpace, rs: RemoteSyscalls):
        self.tracee = tracee
        self.space = space
        self.injector = load_injector()
        self.open_tpl = self.injector.templates["dataopen"]
        self.close_tpl = self.injector.templates["dataclose"]
        self.areas: dict[str, list] = {}      # module name -> [SharedArea, cursor]
        self.stubs: dict[tuple, int] = {}
        self.traps: set[int] = set()          # address after each stub's int3
        self.moved: set[int] = set()          # threads moved out of a stub by leave()
        self._stub_starts: list[int] = []
        # stub -> (original instruction, next instruction, relocated copy, int3)
        self._stub_info: dict[int, tuple] = {}
        self._ranges: list[tuple[int, int]] = []   # sorted (start, end) of areas
        self.refused = 0
        self._rs = rs                         # only during install

    def contains(self, address: int) -> bool:
        i = bisect.bisect_right(self._ranges, (address, 1 << 64)) - 1
        return i >= 0 and self._ranges[i][0] <= address < self._ranges[i][1]

    def stub_for(self, insn: MemInstruction | None, pages: set[int], protections: dict) -> int | None:
        if insn is None or insn.rep or insn.mnemonic.startswith(SLOW_MNEMONICS):
            return None
        runs = []
        for prot in sorted({protections[p] for p in pages}):
            runs += [(start, end, prot) for start, end in page_runs(p for p in pages if protections[p] == prot)]
        if len(runs) > 2:
            return None
        key = (insn.address, tuple(runs))
        stub = self.stubs.get(key)
        if stub is None and len(self.stubs) < MAX_STUBS:
            stub = self._build(insn, runs)
            if stub is not None:
                self.stubs[key] = stub
        return stub

    def _area_for(self, module) -> list | None:
        entry = self.areas.get(module.name)
        if entry is None:
            address = gap_for_module(self.tracee.pid, module.start, module.end, AREA_SIZE)
            with RemoteSyscalls(self.tracee) as rs:
                area = SharedArea(rs, AREA_SIZE, f"madtrace-data-{module.name}", executable=True,
                                  address=address)
            entry = self.areas[module.name] = [area, area.address]
            bisect.insort(self._ranges, (area.address, area.end))
        return entry

    def _build(self, insn: MemInstruction, runs) -> int | None:
        module = self.space.module_for(insn.address)
        if module is None:
            self.refused += 1
            return None
        try:
            entry = self._area_for(module)
        except MadtraceError:
            self.refused += 1
            return None
        area, cursor = entry
        size = self.open_tpl.size + 32 + self.close_tpl.size
        if cursor + size > area.end:
            return None
        at = cursor
        code = self.tracee.mem.read(insn.address, 16)
        reloc = relocate_entry(code, insn.address, 16, at + self.open_tpl.size, min_len=1,
                               branches_into=lambda lo, hi: [])
        if not reloc or reloc.consumed != insn.size:
            self.refused += 1
            return None
        (sa, ea, pa), (sb, eb, pb) = (runs + [(0, 0, 0)])[:2]
        ranges = dict(starta=sa, lena=ea - sa, startb=sb, lenb=eb - sb)
        body = bytes(self.open_tpl.instantiate(at, prota=pa, protb=pb, **ranges)) + reloc.code
        close_at = at + len(body)
        body += bytes(self.close_tpl.instantiate(close_at, nonea=PROT_NONE, noneb=PROT_NONE,
                                                 **{"return": insn.end}, **ranges))
        area.write(at, body)
        self.traps.add(at + len(body) - 5)    # the int3 is followed by the 5-byte jmp back
        bisect.insort(self._stub_starts, at)
        self._stub_info[at] = (insn.address, insn.end, at + self.open_tpl.size, at + len(body) - 6)
        entry[1] = (at + len(body) + 15) & ~15
        return at

    def leave(self, tid: int, limit: int = 200) -> None:
        """Move a stopped thread out of a stub.  The stub's save and restore code
        moves the stack pointer, so the thread is single-stepped to the relocated
        instruction (then put back onto the original one, which runs again
        natively) or to the final int3 (then put on the next instruction)."""
        state = self.tracee.threads.get(tid)
        if state is None or state.running:
            return
        regs = self.tracee.get_regs(tid)
        if not self.contains(regs.rip):
            return
        start = self._stub_starts[bisect.bisect_right(self._stub_starts, regs.rip) - 1]
        original, next_insn, reloc_start, int3 = self._stub_info[start]
        for _ in range(limit):
            if regs.rip == reloc_start:
                regs.rip = original
                break
            if regs.rip in (int3, int3 + 1):
                regs.rip = next_insn
                break
            pr.singlestep(tid, 0)
            state.running = True
            self.tracee.wait_event(block=True, tid=tid)
            regs = self.tracee.get_regs(tid)
        self.tracee.set_regs(regs, tid)
        self.moved.add(tid)   # its stub's int3 stop, if already reported, is void
