# SPDX-License-Identifier: GPL-2.0-or-later
"""What the NUMA analysis (NUMAPROF's metrics) needs, recorded with the data
accesses: where each thread may run and on which node each traced page is.

* Thread bindings: each thread's CPU mask when tracing starts
  (sched_getaffinity, before madtrace pins the threads to its own CPU), a new
  thread's mask is its creator's (what clone() gives it natively: the live
  mask is madtrace's pin), and each successful ``sched_setaffinity`` the
  target makes changes the mask of the thread it names from then on.  Each
  change is stamped with the tracer's event ``order`` (shared with the
  accesses), so an access is judged with the binding its thread had then.
* Page nodes: ``move_pages`` with no target nodes (process/numa.py), for every
  traced page, when the target's memory is about to go away: before a
  munmap/mremap/brk shrink of traced pages, at the end of the process (its
  last thread's exit), at detach and at each snapshot.  Each observation is
  stamped with ``order``: an access lies before the first observation of
  its page that comes after it, which says where the page it touched was.
  Pages never touched physically (-ENOENT) are left out.

data/numa.json: ``{"nodes": {node: [cpus]}, "threads": {tid: [[order,
[cpus]], ...]}, "pages": [[order, first_page_address, page_count, node],
...]}`` (runs of consecutive pages on one node, observed together).
"""

from __future__ import annotations

import json
import os

from ..process.numa import node_cpus, page_nodes, thread_cpus
from ..trace.format import NUMA_FILE, PAGE

SYS_SCHED_SETAFFINITY, SYS_SCHED_GETAFFINITY = 203, 204
SYS_MUNMAP, SYS_BRK, SYS_MREMAP = 11, 12, 25


class NumaRecorder:
    def __init__(self, engine):
        self.engine = engine
        self.nodes = node_cpus()
        self.bindings: dict[int, list[tuple[int, list[int]]]] = {}
        self.current: dict[int, list[int]] = {}
        self.observations: list[list[int]] = []
        self.on_binding = None          # callback(tid, cpus): the session's CPU pinning

    # ------------------------------------------------------------- threads
    def _bind(self, tid: int, cpus: list[int] | None, order: int, notify: bool = True) -> None:
        if cpus is None:
            return
        self.current[tid] = cpus
        self.bindings.setdefault(tid, []).append((order, cpus))
        if notify and self.on_binding is not None:
            self.on_binding(tid, set(cpus))   # restored to it when the pinning ends

    def initial_threads(self, tids) -> None:
        """The masks of the threads there when tracing starts (not pinned yet)."""
        for tid in tids:
            self._bind(tid, thread_cpus(tid), 0, notify=False)

    def new_thread(self, tid: int) -> None:
        if tid in self.current:
            return
        state = self.engine.tracee.threads.get(tid)
        creator = state.creator if state is not None else None
        cpus = self.current.get(creator) if creator is not None else None
        if cpus is None:      # creator unknown: the process's first thread's mask
            cpus = self.current.get(self.engine.tracee.pid) or thread_cpus(tid)
        self._bind(tid, cpus, self.engine.next_order())

    def syscall_exit(self, tid: int, nr: int, args: list[int], result: int) -> None:
        if nr == SYS_SCHED_GETAFFINITY and result > 0:
            self._answer_getaffinity(tid, args, result)
            return
        if nr != SYS_SCHED_SETAFFINITY or result != 0:
            return
        target = args[0] or tid
        if target not in self.engine.tracee.threads:
            return                      # another process's thread
        size = min(args[1], 1024)
        try:
            raw = self.engine.tracee.mem.read(args[2], size)
        except Exception:
            cpus = thread_cpus(target)
        else:
            mask = int.from_bytes(raw, "little")
            cpus = [cpu for cpu in range(size * 8) if mask >> cpu & 1]
        self._bind(target, cpus, self.engine.next_order())

    def _answer_getaffinity(self, tid: int, args: list[int], result: int) -> None:
        """The thread asked for its mask: it gets its own, not madtrace's pin."""
        cpus = self.current.get(args[0] or tid)
        if cpus is None:
            return
        mask = sum(1 << cpu for cpu in cpus if cpu < result * 8)
        try:
            self.engine.tracee.mem.write(args[2], mask.to_bytes(result, "little"))
        except Exception:
            pass          # the buffer went away: the call's own answer stays

    # --------------------------------------------------------------- pages
    def observe(self, pages) -> None:
        """Where ``pages`` are now (those that exist); stamped with the next order."""
        pages = sorted(set(pages))
        if not pages:
            return
        alias = self.engine.alias
        # aliased memory is touched through its alias: its own address may have no page
        query = [alias.image(p) if alias is not None and alias.covers(p, p + PAGE) else p
                 for p in pages]
        nodes = page_nodes(self.engine.tracee.pid, query)
        order = self.engine.next_order()
        run: list[int] | None = None
        for page, node in zip(pages, nodes):
            if node < 0:
                run = None
                continue
            if run is not None and run[3] == node and run[1] + run[2] * PAGE == page:
                run[2] += 1
                continue
            run = [order, page, 1, node]
            self.observations.append(run)

    def observe_range(self, start: int, end: int) -> None:
        """Traced pages in [start, end), before they are unmapped or moved."""
        first = start & ~(PAGE - 1)
        self.observe(self.engine.protected.pages_in(first, end))

    def mapping_call(self, nr: int, args: list[int]) -> None:
        """At the entry of munmap/mremap/brk: the traced pages they may take away."""
        if nr in (SYS_MUNMAP, SYS_MREMAP):
            self.observe_range(args[0], args[0] + args[1])
        elif nr == SYS_BRK and args[0]:
            heap = next((r for r in self.engine.regions.regions if r.label == "[heap]"), None)
            if heap is not None and args[0] < heap.end:
                self.observe_range(args[0], heap.end)

    def observe_all(self) -> None:
        self.observe(list(self.engine.protected))

    # ---------------------------------------------------------------- file
    def to_dict(self) -> dict:
        return {"nodes": {str(n): cpus for n, cpus in self.nodes.items()},
                "threads": {str(tid): [[order, cpus] for order, cpus in events]
                            for tid, events in sorted(self.bindings.items())},
                "pages": self.observations}

    def write(self, out_dir: str) -> None:
        path = os.path.join(out_dir, NUMA_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(self.to_dict(), f)
        os.replace(path + ".tmp", path)

