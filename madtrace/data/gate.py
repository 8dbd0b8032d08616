# SPDX-License-Identifier: GPL-2.0-or-later
"""Data tracing only while a thread is inside given functions (--data-in FUNC).

The functions get entry and return hooks (call_hooks.py).  A thread records
its accesses from the entry of its outermost call of one of them to that
call's return, nested calls and callees included.  The pages are protected
only while at least one thread is inside (the engine is *armed*): when the
last thread leaves, every page gets its original protection back, so the
rest of the program runs at native speed.  A thread that is not inside while
another is still faults as usual; its accesses are carried out, not recorded.
"""

from __future__ import annotations

from ..errors import UnknownSymbolError, UsageError
from ..process.remote_syscall import RemoteSyscalls
from .heap.call_hooks import CallHooks


class DataGate:
    def __init__(self, engine, patterns: list[str]):
        self.engine = engine
        self.patterns = list(patterns)
        self.hooks = None      # made at install, with the engine's guard
        self.names: list[str] = []
        self.entries = 0          # outermost calls seen
        self.arms = 0             # times the pages were protected again

    def resolve(self, patched: set[int]) -> dict[int, str]:
        """{entry address: name} of the functions the patterns select."""
        space = self.engine.space
        functions: dict[int, str] = {}
        for pattern in self.patterns:
            found = space.find_functions(pattern)
            if not found:
                raise UnknownSymbolError(f"--data-in: no function matches {pattern!r}")
            for symbol in found:
                if symbol.address in patched:
                    raise UsageError(f"--data-in: {symbol.name} is patched at its entry for "
                                     "function tracing; trace it at its call sites "
                                     "(--method callsite) or leave it out of -f")
                functions[symbol.address] = symbol.name
        self.names = sorted(set(functions.values()))
        return functions

    def install(self, rs: RemoteSyscalls, patched: set[int]) -> None:
        self.hooks = CallHooks(self.engine.tracee, "datagate", self._on_entry, self._on_return,
                               self.engine.guard, self.engine.step_fault)
        self.hooks.install(rs, self.resolve(patched))

    def inside(self, tid: int) -> bool:
        return self.hooks is not None and self.hooks.depth(tid) > 0

    def anyone_inside(self) -> bool:
        return any(self.hooks.depth(tid) for tid in list(self.hooks.pending))

    def _on_entry(self, tid: int, name: str, regs):
        if self.hooks.depth(tid) == 0:
            self.entries += 1
            if not self.anyone_inside():
                self._arm(tid)
                self.arms += 1
            self.engine.set_recording(tid, True)
        return None

    def _on_return(self, tid: int, name: str, state, regs, return_address: int) -> None:
        if self.hooks.depth(tid) == 0:
            self.engine.set_recording(tid, False)
            if not self.anyone_inside():
                self._disarm(tid)

    def _arm(self, tid: int) -> None:
        """A thread entered a --data-in function and none was inside: protect."""
        engine = self.engine
        engine.armed = True
        with RemoteSyscalls(engine.tracee, tid) as rs:
            engine.protect(rs, engine.protected)

    def _disarm(self, tid: int) -> None:
        """The last thread left the --data-in functions: every page back to its own
        protection.  No slot may stay pending (its thread would later access the
        open page, and the write-back would come after): threads still in a stub
        are stopped and moved out of it first."""
        engine, area, tracee = self.engine, self.engine.area, self.engine.tracee
        area.loop.flush()
        if area.pending_slots():
            engine.defer(tracee.stop_all())
            area.loop.flush()
            for other in list(tracee.threads):
                area.leave(other)
            area.discard_unfinished()
            held = True
        else:
            held = False
        with RemoteSyscalls(tracee, tid) as rs:
            engine.unprotect(rs, engine.protected)
        engine.armed = False
        engine.tables_changed()
        if held:
            for other, state in list(tracee.threads.items()):
                if other != tid and not state.running:
                    tracee.resume(other)
