"""CPU placement for tight stop loops.

A ptrace stop costs ~4 us when tracer and target share a CPU and 84-142 us
when they run on different vCPUs of these VMs (pitfall 1).  ``SameCpu`` pins
the tracer and every target thread to one CPU for the duration of a scope and
restores all original affinity masks when it ends (so the target's own
sched_getaffinity answers are unchanged once tracing stops).
"""

from __future__ import annotations

import os


def last_cpu(tid: int) -> int:
    """The CPU the thread last ran on (field 39 of /proc/TID/stat)."""
    with open(f"/proc/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


class SameCpu:
    """``tids``: threads to pin now.  With ``pid``, threads of that process created
    meanwhile (they inherit the pinned mask) get the leader's original mask back
    when the scope ends."""

    def __init__(self, tids: list[int], cpu: int | None = None, pid: int | None = None):
        self.tids = list(tids)
        self.cpu = cpu
        self.pid = pid
        self._saved: dict[int, set[int]] = {}

    def __enter__(self) -> "SameCpu":
        allowed = os.sched_getaffinity(0)
        if self.cpu is None:
            cpu = last_cpu(self.tids[0]) if self.tids else min(allowed)
            self.cpu = cpu if cpu in allowed else min(allowed)
        for tid in [0] + self.tids:
            try:
                self._saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {self.cpu})
            except (ProcessLookupError, PermissionError, OSError):
                self._saved.pop(tid, None)
        return self

    def set_original(self, tid: int, mask: set[int]) -> None:
        """The mask ``tid`` gets back when the scope ends (the target set it itself,
        or a thread created meanwhile inherited it from its creator)."""
        if self._saved:
            self._saved[tid] = set(mask)

    def __exit__(self, *exc) -> None:
        if self.pid is not None and self.pid in self._saved:
            try:
                current = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
            except OSError:
                current = []
            for tid in current:
                self._saved.setdefault(tid, self._saved[self.pid])
        for tid, mask in self._saved.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass  # the thread exited
        self._saved.clear()
