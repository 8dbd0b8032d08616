# SPDX-License-Identifier: GPL-2.0-or-later
"""The background thread that drains a RingSet's rings (capture/rings.py), and
when it does.

While records come, the next drain is timed for a take of about 1/16 of a ring
(at the rate the last drains saw), at least ``interval`` s and at most
PACED_MAX s away: a writer keeps 15/16 of its ring before it would wait, and
each drain (~30 us of Python) moves many records.  Without records, the wait
doubles up to ``idle_max`` s.

The drain holds the GIL in its Python parts, so another thread of the tracer
holding it (the store's writer converting, or importing pyarrow) delays it:
the switch interval is lowered to SWITCH_INTERVAL (Python's default is 5 ms,
more than a ring's worth at full speed: ~3 ms), and ``busy()`` tells such
threads to leave the CPU and the GIL alone while records pour in.
"""

from __future__ import annotations

import sys
import threading
import time

from ..errors import TracerInternalError

PACED_MAX = 0.001          # s: the longest wait while records come
BUSY_WINDOW = 0.1          # s: busy() while more than a ring's worth comes per window
SWITCH_INTERVAL = 0.0005   # s: the drain waits for the GIL at most about that long


class DrainLoop:
    def __init__(self, rings, interval: float = 0.0002, idle_max: float = 0.004):
        self.rings = rings
        self.interval = interval
        self.idle_max = idle_max
        self.rate = 0.0                 # records per s, all rings, at the last drain
        self._stop = threading.Event()
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self._thread = threading.Thread(target=self._loop, name="madtrace-drain", daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        return self.rate * BUSY_WINDOW > self.rings.L.MT_RING_RECORDS

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.rate = 0.0

    def _loop(self) -> None:
        rings = self.rings
        target = rings.L.MT_RING_RECORDS // 16
        idle = self.interval
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                moved = rings.drain_all()
            except Exception as exc:    # a bug: said at the end, and no writer waits on
                with rings.lock:
                    rings.fail(TracerInternalError(f"the ring drain failed: {exc!r}"))
            if rings.failure is not None:
                return
            now = time.monotonic()
            self.rate = moved / max(now - last, 1e-6)
            if moved:
                idle = min(max(target / self.rate, self.interval), PACED_MAX)
            else:
                idle = min(idle * 2, self.idle_max)
            last = now
            self._stop.wait(idle)
