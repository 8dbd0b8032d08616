# SPDX-License-Identifier: GPL-2.0-or-later
"""Unwind information for the rewriter's copies, given to the target's unwinder.

A relocated function's calls return into its copy: a C++ exception, a thread
cancellation or ``backtrace()`` unwinds through the copy, so the copy needs
the unwind information of its original, moved (data/hybrid/copy_unwind.py), and
registered with the target's unwinder before any thread runs it
(target/unwind_registry.py).  Registration is a call of
``__register_frame_info`` in the target, made with every other thread
stopped and the traced pages open for that call only: what
it writes is madtrace's, not the program's, and so are the records it would
make (its thread's ring is muted meanwhile).  The call takes the unwinder's
lock: if a stopped thread holds it (in the middle of an unwind), the call is
abandoned and tried again at the function's next fault; the copy is not used
until then.

Nothing is registered while no unwinder is loaded (a C program that never
throws): there is nothing to unwind with.
"""

from __future__ import annotations

from .copy_unwind import copy_unwind
from ...target.unwind_registry import Unwinder, UnwindObjects
from ...process.remote_syscall import RemoteSyscalls

GROUP = "madtrace-unwind-copies"   # kept by a fork child's unwinder: a group of its own
SLACK = 16                          # the object's size may grow by its LSDA's alignment


class CopyFrames:
    def __init__(self, engine, injector, rings=None):
        self.engine = engine
        self.tracee = engine.tracee
        self.rings = rings
        self.unwinder = Unwinder(engine.space)
        self.objects = UnwindObjects(self.unwinder, injector, GROUP)
        self.deferred = 0            # registrations abandoned (the unwinder's lock was held)

    def loaded(self) -> bool:
        return self.unwinder.registrar() is not None

    def build(self, state, copy):
        """A builder of the copy's object (address -> bytes) and its size, or why
        there is none; None when the function has no unwind information."""
        fde = state.fde
        if fde is None:
            return None
        module = state.module
        if (module.bias + fde.start, module.bias + fde.end) != (state.start, state.end):
            return (f"its unwind entry covers [{module.bias + fde.start:#x}, "
                    f"{module.bias + fde.end:#x}), not the function")
        personality = None
        if fde.cie.personality:
            personality = module.bias + fde.cie.personality
            if fde.cie.personality_indirect:
                personality = self.tracee.mem.read_u64(personality)
        image = module.image

        def read_lsda(address: int) -> bytes:
            """From the process (its pointers relocated), up to its section's end."""
            rel = address - module.bias
            section = image.section_at(rel)
            if section is None:
                return b""
            return self.tracee.mem.read(address, section.address + section.size - rel)

        code_end = copy.address + copy.code_size

        def locate(address: int) -> int | None:
            return code_end if address == state.end else copy.old_to_new.get(address)

        def make(at: int):
            return copy_unwind(fde, module.bias, copy.address, code_end, locate, at,
                               read_lsda, personality)
        first = make(0)
        if isinstance(first, str):
            return first
        return make, len(first) + SLACK

    def register(self, make, size: int) -> bool:
        """Registers one object (``build``'s); False when abandoned (tried again later)."""
        engine = self.engine
        held = engine.hold_threads()
        try:
            pages = self._traced_pages()
            with RemoteSyscalls(self.tracee) as rs:
                engine.unprotect(rs, pages)
                try:
                    if self.rings is not None:
                        with self.rings.mute(rs.tid):
                            done = self.objects.register(rs, make, size, patient=True)
                    else:
                        done = self.objects.register(rs, make, size, patient=True)
                finally:
                    engine.protect(rs, pages)
        finally:
            engine.resume_threads(held)
        if not done:
            self.deferred += 1
        return done

    def _traced_pages(self) -> list[int]:
        """Every protected page: the unwinder writes its own and takes a lock with
        libc's code, which reads libc's."""
        return [page for page, prot in self.engine.protected.items() if prot]
