# SPDX-License-Identifier: GPL-2.0-or-later
"""The status line of a recording on a terminal: what madtrace is doing while
the target runs, redrawn in place twice a second after the first second:

  madtrace: recording 12 s: 3.4 M call records, 45.2 M accesses (3.6 M/s,
  12,044 on faults), 123 relocated, 0 dropped

("relocated": functions copied with probes by the hybrid engine).

It keeps the terminal's last row for itself (a scroll region above it, as
apt's progress bar does), so what the program and madtrace print scrolls
above it and is never overwritten; each redraw is one write (saved cursor,
the last row, restored cursor).  Quiet under -q, when stderr is not a
terminal (a log, a pipe) or is too small; the region and the row are given
back when the recording ends.  It reads counters only (the collaborators'
``live_counts``), on a thread of its own: it never stops the target nor
calls into it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

PERIOD = 0.5
AFTER = 1.0


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} M"
    return f"{n:,}"


def status_text(elapsed: float, counts: dict[str, int], rate: float | None) -> str:
    """The line for ``counts`` (call_records, accesses, on_faults, relocated,
    dropped; each optional) after ``elapsed`` seconds; ``rate``: accesses/s."""
    parts = []
    if "call_records" in counts:
        parts.append(f"{_count(counts['call_records'])} call records")
    if "accesses" in counts:
        speed = f"{_count(int(rate))}/s, " if rate is not None else ""
        parts.append(f"{_count(counts['accesses'])} accesses ({speed}"
                     f"{_count(counts.get('on_faults', 0))} on faults)")
    if counts.get("relocated"):
        parts.append(f"{counts['relocated']:,} relocated")
    if "dropped" in counts:
        parts.append(f"{counts['dropped']:,} dropped")
    return f"madtrace: recording {elapsed:.0f} s: " + ", ".join(parts) if parts else \
        f"madtrace: recording {elapsed:.0f} s"


class StatusLine:
    """``with StatusLine(counts, out):`` around the target's run; ``counts()``
    returns the counters (an exception: that redraw is skipped)."""

    def __init__(self, counts: Callable[[], dict[str, int]], out):
        self.counts, self.out = counts, out
        self.rows = 0
        try:
            if out is not None and out.isatty():
                self.rows, self.columns = os.get_terminal_size(out.fileno())[::-1]
        except (AttributeError, ValueError, OSError):
            self.rows = 0
        self.on = self.rows >= 4
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.shown = False

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def __enter__(self) -> "StatusLine":
        if self.on:
            self.start = time.monotonic()
            self._thread = threading.Thread(target=self._run, daemon=True, name="madtrace-status")
            self._thread.start()
        return self

    def _claim(self) -> None:
        """A new last line, the rows above it a scroll region, the cursor back in it."""
        self._write(f"\n\x1b7\x1b[1;{self.rows - 1}r\x1b8\x1b[1A")
        self.shown = True

    def _run(self) -> None:
        if self._stop.wait(AFTER):
            return
        last: tuple[float, int] | None = None
        while True:
            now = time.monotonic()
            try:
                counts = self.counts()
            except Exception:  # a collaborator mid-change: the next redraw shows it
                counts = None
            if counts is not None:
                accesses = counts.get("accesses")
                rate = None
                if accesses is not None and last is not None and now > last[0]:
                    rate = max(accesses - last[1], 0) / (now - last[0])
                if accesses is not None:
                    last = (now, accesses)
                if not self.shown:
                    self._claim()
                text = status_text(now - self.start, counts, rate)[: max(self.columns - 1, 1)]
                self._write(f"\x1b7\x1b[{self.rows};1H\x1b[K{text}\x1b8")
            if self._stop.wait(PERIOD):
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.shown:  # the last row cleared, the whole screen scrolls again
            self._write(f"\x1b7\x1b[{self.rows};1H\x1b[K\x1b[r\x1b8")
