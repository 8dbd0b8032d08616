# SPDX-License-Identifier: GPL-2.0-or-later
"""The background thread that looks after a RingSet's rings (rings/rings.py),
and when it does.

While the C drain thread runs (rings/drain_thread.c), this one only looks
after the ring pool (claims, threads that ended) and the drain's failures,
every ``SERVICE`` s while records come, backing off to ``idle_max`` s while
none do.  Otherwise (the hybrid data engine's rings: ring_split.py) it drains
them itself: again at once while a ring fills fast (more than 1/16 of a ring
moved: a writer must rarely find its ring full), every ``interval`` s while
records come, and backs off to ``idle_max`` s while none do.  (A Python drain timed
for takes of 1/16 of a ring took 12-20% off the tracer's CPU; the C drain,
paced so, measured the same as unpaced, and is not.)

The drain holds the GIL in its Python parts, so another thread of the tracer
holding it (the store's writer converting, or importing pyarrow) delays it:
the switch interval is lowered to SWITCH_INTERVAL (Python's default is 5 ms,
more than a ring's worth at full speed: ~3 ms), and ``busy()`` tells such
threads to leave the CPU and the GIL alone while records pour in.
"""

from __future__ import annotations

import sys
import threading

from ..errors import TracerInternalError

SERVICE = 0.001            # s: the pool's claims are adopted this soon while records come
SWITCH_INTERVAL = 0.0005   # s: the drain waits for the GIL at most about that long


class DrainLoop:
    def __init__(self, rings, interval: float = 0.0002, idle_max: float = 0.004):
        self.rings = rings
        self.interval = interval
        self.idle_max = idle_max
        self._stop = threading.Event()
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self._thread = threading.Thread(target=self._loop, name="madtrace-drain", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        rings = self.rings
        busy = rings.L.MT_RING_RECORDS // 16
        idle = self.interval
        while not self._stop.is_set():
            try:
                moved = rings.drain_all(background=True)
            except Exception as exc:    # a bug: said at the end, and no writer waits on
                with rings.lock:
                    rings.fail(TracerInternalError(f"the ring drain failed: {exc!r}"))
            if rings.failure is not None:
                return
            native = rings.spill.active
            if moved >= busy and not native:
                idle = self.interval
                continue
            step = SERVICE if native else self.interval
            idle = step if moved else min(max(idle, step) * 2, self.idle_max)
            self._stop.wait(idle)
