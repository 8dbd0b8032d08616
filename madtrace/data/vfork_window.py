# SPDX-License-Identifier: GPL-2.0-or-later
"""Data tracing while a vfork child runs in its parent's memory.

A vfork child shares the parent's address space until it execs or exits, and
it is not traced (unless forks are followed).  Protected pages and the
allocation tracker's breakpoints are in that shared memory: the child's first
touch of a traced global (``environ`` in execve's libc wrapper) was delivered
to the guard in the child, which took the whole data engine down in the
parent too, and the child died of SIGSEGV (``posix_spawn`` and ``vfork``
callers saw their child fail).

So, at the parent's PTRACE_EVENT_VFORK, before the child runs: every other
thread of the parent is stopped, the stubs' slots are written back, the traced
pages are opened and the breakpoints taken out; the child runs its few
instructions to exec on plain memory.  At the parent's PTRACE_EVENT_VFORK_DONE
(the child has exec'd or exited) pages and breakpoints go back and the other
threads resume.  No thread of the parent runs meanwhile, so none of its
accesses is missed; the child's own accesses before its exec are not traced
(``windows`` counts these spans, reported in meta.json).
"""

from __future__ import annotations

from ..process.remote_syscall import RemoteSyscalls
from ..process.tracee import Tracee

INT3 = b"\xcc"


class VforkWindow:
    def __init__(self, engine):
        self.engine = engine
        self.windows = 0
        # parent tid -> (events met while stopping the others, pages opened)
        self._open: dict[int, tuple[list, list[int]]] = {}

    def started(self, parent: Tracee, tid: int, child: Tracee) -> None:
        """At the parent's vfork event; ``child`` is stopped at its first stop."""
        engine = self.engine
        if parent is not engine.tracee or not engine.active:
            return
        events = [e for e in parent.stop_all() if e.tid != tid]
        engine.area.loop.flush()
        for other in list(parent.threads):
            engine.area.leave(other)
        engine.area.discard_unfinished()
        pages = [p for p in engine.protected if engine.is_protected(p)]
        # the parent's thread waits for its child (it cannot run a call); the child
        # shares the memory, so its calls change the parent's protections
        with RemoteSyscalls(child) as rs:
            engine.unprotect(rs, pages)
        for hooks in engine.all_hooks():
            if hooks.active:
                for address, byte in hooks.saved_bytes.items():
                    parent.mem.write(address, byte)
        engine.entry_hooks.pause(parent.mem)      # the hook stubs' entries too
        self._open[tid] = (events, pages)
        self.windows += 1

    def done(self, parent: Tracee, tid: int) -> None:
        """At the parent's vfork-done event: the child no longer uses the memory."""
        if tid not in self._open:
            return
        engine = self.engine
        events, pages = self._open.pop(tid)
        if engine.active:
            with RemoteSyscalls(parent) as rs:
                engine.protect(rs, pages)
            for hooks in engine.all_hooks():
                if hooks.active:
                    for address, original in hooks.saved_bytes.items():
                        parent.mem.write(address, INT3 * len(original))
            engine.entry_hooks.unpause(parent.mem)
        met = {e.tid for e in events}
        for other, state in list(parent.threads.items()):
            if other != tid and other not in met and not state.running:
                parent.resume(other)
        engine.defer(events)
