# SPDX-License-Identifier: GPL-2.0-or-later
"""What long work says while it runs (the write-out of a recording, the
reading of debug info): nothing for the first second; then, on a terminal,
one line redrawn in place (a bar with the percentage, or the elapsed time for
work of unknown length), elsewhere a plain line at most once a second.
``out=None`` (the CLI's -q) says nothing."""

from __future__ import annotations

import threading
import time

BAR = 24


def _is_tty(out) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """``madtrace: WHAT [#####.....] 45% (n of total UNIT)``: call it with the
    work done so far; ``done()`` closes the line."""

    def __init__(self, what: str, total: int, out=None, after: float = 1.0, unit: str = "events"):
        self.what, self.total, self.unit = what, max(total, 1), unit
        self.out = out
        self.tty = _is_tty(out)
        self.start = time.monotonic()
        self.after = after
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int) -> None:
        if self.out is None:
            return
        now = time.monotonic()
        if now - self.start < self.after or now - self.last < (0.1 if self.tty else 1.0):
            return
        self.last = now
        self.shown = True
        done = min(done, self.total)    # the total is an estimate (a trace's meta.json)
        share = done / self.total
        text = f"madtrace: {self.what} {int(100 * share)}% ({done} of {self.total} {self.unit})"
        if self.tty:
            fill = int(BAR * share)
            text = f"\rmadtrace: {self.what} [{'#' * fill}{'.' * (BAR - fill)}] " \
                   f"{int(100 * share):3d}% ({done} of {self.total} {self.unit})\x1b[K"
            print(text, end="", file=self.out, flush=True)
        else:
            print(text, file=self.out, flush=True)

    def done(self) -> None:
        if self.shown:
            end = f"madtrace: {self.what} done in {time.monotonic() - self.start:.1f} s"
            print(f"\r{end}\x1b[K" if self.tty else end, file=self.out, flush=True)


class Activity:
    """A context manager for work of unknown length: after ``after`` seconds
    ``madtrace: WHAT...`` (with the elapsed time redrawn on a terminal), and
    ``WHAT done in N s`` at the end; silent when it ends sooner."""

    def __init__(self, what: str, out=None, after: float = 1.0):
        self.what, self.out, self.after = what, out, after
        self.tty = _is_tty(out)
        self.shown = False
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "Activity":
        self.start = time.monotonic()
        if self.out is not None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="madtrace-progress")
            self._thread.start()
        return self

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        self.shown = True
        if not self.tty:
            print(f"madtrace: {self.what}...", file=self.out, flush=True)
            return
        while not self._stop.wait(0.2):
            print(f"\rmadtrace: {self.what}... {time.monotonic() - self.start:.0f} s\x1b[K", end="",
                  file=self.out, flush=True)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.shown:
            end = f"madtrace: {self.what} done in {time.monotonic() - self.start:.1f} s"
            print(f"\r{end}\x1b[K" if self.tty else end, file=self.out, flush=True)
