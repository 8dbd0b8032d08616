# SPDX-License-Identifier: GPL-2.0-or-later
"""PLT stubs moved off a traced page's faults (the hybrid data engine).

Under partial RELRO (many distributions' default, Debian's python3 among
them) ``.got.plt`` shares its last page with ``.data``: the page is traced,
so it is protected, and every call through the PLT faults on it although it
reads no traced byte (a GOT slot): a ptrace stop per call of a library
function, the "untraced faults" of meta.json.  At the first such fault of a
stub, ``PltCopies.discover`` writes a replacement of the stub's jump into
the rewriter's code area (arch/x86_64/plt_jump.py: the GOT slot read through
the alias, or at its own address when the alias bitmap says the page is not
aliased) and patches the stub's first five bytes with a jump to it.  The
stub's other bytes are left as they are (the lazy binder's ``push; jmp
PLT0`` after the jump is still reached through the GOT).

Left on the fault path: a slot in traced bytes (its accesses are recorded
there), a page without alias, a stub whose first bytes a thread is stopped
inside, PLT0 (the lazy binder's first call of each symbol).  Detach and fork
children get the stubs back with the rewriter's other patches; a thread
stopped inside a replacement starts the stub again (nothing happened yet).
"""

from __future__ import annotations

import bisect
import struct

from ...arch.x86_64.plt_jump import aliased_jump, got_jump
from ...target.patchset import Patch, PatchConflict
from .alias import ALIAS_BIT

PAGE_SHIFT = 12


class PltCopies:
    def __init__(self, rewriter):
        self.rewriter = rewriter
        self.engine = rewriter.engine
        self.tracee = rewriter.tracee
        self.tried: dict[int, str] = {}          # stub -> why it stays on faults, or "moved"
        self.replacement: dict[int, int] = {}    # stub -> its replacement
        self._starts: list[int] = []             # replacement starts, sorted
        self._spans: list[tuple[int, int, int]] = []   # (start, end, stub) alike

    def at(self, address: int) -> int | None:
        """The stub whose replacement holds ``address``, if any."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._spans[i][1]:
            return self._spans[i][2]
        return None

    def discover(self, tid: int, regs) -> bool:
        """A fault of ``tid`` at a PLT stub's jump: True when the thread now runs
        the replacement (resumed), False when the fault path must handle it."""
        rip = regs.rip
        module = self.engine.space.module_for(rip)
        symbol = module.image.symbol_at(rip - module.bias) if module is not None else None
        if symbol is None or symbol.kind != "PLT":
            return False
        stub = module.bias + symbol.address
        if stub in self.tried and self.tried[stub] != "moved":
            return False
        jump = got_jump(self.tracee.mem.read(rip, 8), rip)
        why = self._refusal(stub, symbol.size, rip, jump)
        if why or jump is None:
            why = why or "not a jump through the GOT"
            self.tried[stub] = self.tried[rip] = why
            self.rewriter.stats[f"plt stubs left on faults: {why}"] += 1
            return False
        at = self.replacement.get(stub) or self._write(module, stub, jump[1])
        regs.rip = at
        self.tracee.set_regs(regs, tid)
        self._patch(stub, at)
        self.tracee.resume(tid, 0)
        self.rewriter.stats["moved to a plt replacement"] += 1
        return True

    def _write(self, module, stub: int, slot: int) -> int:
        area = self.rewriter.code_areas.for_module(module, 64)
        at = (area.cursor + 15) & ~15
        code = aliased_jump(slot, self.rewriter.bitmap + (slot >> 15), (slot >> PAGE_SHIFT) & 7,
                            slot ^ ALIAS_BIT)
        area.area.write(at, code)
        area.cursor = at + len(code)
        i = bisect.bisect_left(self._starts, at)
        self._starts.insert(i, at)
        self._spans.insert(i, (at, at + len(code), stub))
        self.replacement[stub] = at
        return at

    def _refusal(self, stub: int, size: int, rip: int, jump) -> str | None:
        if jump is None:
            return "not a jump through the GOT"
        if size < 5 or rip + jump[0] > stub + max(size, 5):
            return "shorter than 5 bytes"
        slot = jump[1]
        if self.engine.regions.find(slot) is not None:
            return "its GOT slot is traced"
        alias = self.engine.alias
        if alias is None or not alias.usable(slot, slot + 8):
            return "no alias for its GOT slot"
        return None

    def _patch(self, stub: int, at: int) -> None:
        if self.tried.get(stub) == "moved":
            return
        original = self.tracee.mem.read(stub, 5)
        patch = Patch(stub, original, b"\xe9" + struct.pack("<i", at - stub - 5),
                      f"PLT stub at {stub:#x}")
        engine = self.engine
        held = engine.hold_threads()
        try:
            rips = [self.tracee.get_regs(t).rip for t, s in self.tracee.threads.items()
                    if not s.running]
            self.rewriter.patches.apply(self.tracee.mem, [patch], rips)
            self.tried[stub] = "moved"
            self.rewriter.stats["plt stubs redirected"] += 1
        except PatchConflict as exc:
            self.rewriter.stats[f"plt stub not redirected: {exc}"] += 1
        finally:
            engine.resume_threads(held)

    def to_original(self, tracee, tid: int, regs) -> bool:
        """A thread inside a replacement starts its stub again; True if moved."""
        stub = self.at(regs.rip)
        if stub is None:
            return False
        regs.rip = stub
        tracee.set_regs(regs, tid)
        return True
