# SPDX-License-Identifier: GPL-2.0-or-later
"""Where the hybrid engine's function copies go: one code area per module,
within rel32 reach of it (a new, larger one when it is full), each listing the
return points of its copies in its tail (copy_returns.py).

``for_module(module, need)`` gives the area the next copy of a function of
``module`` goes into (mapping one in the target if needed; TracerInternalError
when no free range lies near the module); ``place(area, copy)`` writes a copy
there and records its return points; ``area_of(address)`` finds an area;
``all`` lists every area made (a module's newest is the one copies go into).
"""

from __future__ import annotations

from ...target.areas import CodeArea, SharedArea, gap_for_module
from ...process.remote_syscall import RemoteSyscalls
from .copy_returns import TABLE_BYTES, ReturnTable

AREA_SIZE = 64 << 20


class CopyAreas:
    def __init__(self, tracee, group: str, stopped_thread):
        """``group``: what the areas stay or go with (target/mappings.py);
        ``stopped_thread()``: a thread that can run a remote system call."""
        self.tracee = tracee
        self.group = group
        self.stopped_thread = stopped_thread
        self.newest: dict[str, CodeArea] = {}     # module name -> the area copies go into
        self.all: list[CodeArea] = []
        self._tables: dict[int, ReturnTable] = {}   # id(code area) -> its return points

    def area_of(self, address: int) -> CodeArea | None:
        return next((a for a in self.all if a.area.contains(address)), None)

    def for_module(self, module, need: int) -> CodeArea:
        area = self.newest.get(module.name)
        if area is None or area.room() < need + 64:
            size = max(AREA_SIZE, need * 2 + TABLE_BYTES)
            with RemoteSyscalls(self.tracee, self.stopped_thread()) as rs:
                address = gap_for_module(self.tracee.pid, module.start, module.end, size)
                area = self.newest[module.name] = CodeArea(SharedArea(
                    rs, size, f"madtrace-copies-{module.name}", executable=True, address=address,
                    group=self.group))
            table = self._tables[id(area)] = ReturnTable(area.area)
            area.end = table.start
            self.all.append(area)
        return area

    def place(self, area: CodeArea, copy) -> bool:
        """Writes ``copy`` at the area's next free address (False: it was made for
        another address, or it does not fit)."""
        if copy.address != (area.cursor + 15) & ~15 or copy.address + len(copy.code) > area.end:
            return False
        area.area.write(copy.address, copy.code)
        area.cursor = copy.address + len(copy.code)
        # a call made in the copy returns to the original code once the session ends
        # (or, should it be killed, the next one: copy_returns.py)
        area.area.return_points.update(copy.returns)
        self._tables[id(area)].add(copy.returns)
        return True
