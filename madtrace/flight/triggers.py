# SPDX-License-Identifier: GPL-2.0-or-later
"""What makes a flight recorder write a snapshot, evaluated in the tracer on
the call records as the recorder indexes them (``CallTriggers.feed``, each
tick): no ptrace stop per call, no code in the target.

* ``--trigger-on F`` (every call of F) or ``F:N`` (every Nth call);
* ``--trigger-slow F:DURATION`` (``5ms``, ``200us``, ``1.5s``): a call of F
  that took longer, from its entry record to its exit record (the thread's
  calls of F nested in it matched as a stack);
* besides these: a signal that would kill the program (Recording), SIGUSR1
  to the tracer, ``snapshot`` in the REPL or ``madtrace ctl PID snapshot``.

Snapshots of triggers are at least ``GAP`` seconds apart: a trigger that
fires again within it is counted (``suppressed``), not written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:  # (numpy when the triggers run: the options are parsed without it)
    import numpy as np

GAP = 1.0  # s between two snapshots of triggers, at least
STACK_DEPTH = 256  # entries of F open per thread, at most (deeper: forgotten)
_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass
class Trigger:
    kind: str  # "on" or "slow"
    function: str
    every: int = 1  # on: every Nth call
    seconds: float = 0.0  # slow: longer than this
    calls: int = 0  # on: calls seen
    entry_codes: np.ndarray | None = None  # of its function's sites (CallTriggers.bind)
    exit_codes: np.ndarray | None = None

    @property
    def spec(self) -> str:
        if self.kind == "slow":
            return f"slow {self.function}:{self.seconds * 1e3:g}ms"
        return f"on {self.function}" + (f":{self.every}" if self.every > 1 else "")


def parse_on(text: str) -> Trigger:
    name, _, count = text.rpartition(":") if re.search(r":\d+$", text) else (text, "", "")
    if not name:
        raise UsageError(f"--trigger-on {text!r}: FUNCTION or FUNCTION:N")
    every = int(count) if count else 1
    if every < 1:
        raise UsageError(f"--trigger-on {text!r}: N must be at least 1")
    return Trigger("on", name, every=every)


def parse_slow(text: str) -> Trigger:
    m = re.fullmatch(r"(.+):(\d+(?:\.\d+)?)(ns|us|ms|s)", text.strip())
    if not m or float(m.group(2)) <= 0:
        raise UsageError(f"--trigger-slow {text!r}: FUNCTION:DURATION, such as handle:5ms (ns, us, ms or s)")
    return Trigger("slow", m.group(1), seconds=float(m.group(2)) * _UNITS[m.group(3)])


@dataclass
class Fired:
    trigger: str  # what fired, for meta.json and the log
    tid: int
    tsc: int  # the record that fired it (its exit, for a slow call)
    seconds: float = 0.0  # a slow call's duration


class CallTriggers:
    """The triggers on functions, matched against call record codes (site id << 1,
    | 1 for an exit).  ``bind(sites)``: (site id, function name) of the sites
    patched; ``feed(tid, records)``: a thread's new records, in order."""

    def __init__(self, triggers: list[Trigger], tsc_hz: float):
        self.triggers = triggers
        self.tsc_hz = tsc_hz
        self.stacks: dict[tuple[int, int], list[int]] = {}  # (trigger, tid) -> entry tscs
        self.bound_sites = 0

    def bind(self, sites: list[tuple[int, str]]) -> list[str]:
        """Codes of each trigger's function; returns the functions without a site."""
        import numpy as np

        if len(sites) == self.bound_sites:
            return []
        self.bound_sites = len(sites)
        missing = []
        for trigger in self.triggers:
            ids = [sid for sid, name in sites if name == trigger.function]
            trigger.entry_codes = np.array([sid << 1 for sid in ids], dtype=np.uint32)
            trigger.exit_codes = np.array([sid << 1 | 1 for sid in ids], dtype=np.uint32)
            if not ids:
                missing.append(trigger.function)
        return missing

    def feed(self, tid: int, records: np.ndarray) -> Fired | None:
        import numpy as np

        fired = None
        codes = records["code"]
        for index, trigger in enumerate(self.triggers):
            if trigger.entry_codes is None or not len(trigger.entry_codes):
                continue
            if trigger.kind == "on":
                entries = np.flatnonzero(np.isin(codes, trigger.entry_codes))
                if not len(entries):
                    continue
                first = trigger.calls
                trigger.calls += len(entries)
                crossed = trigger.calls // trigger.every - first // trigger.every
                if crossed and fired is None:
                    nth = (first // trigger.every + 1) * trigger.every - first - 1
                    at = int(entries[nth])
                    fired = Fired(trigger.spec, tid, int(records["tsc"][at]))
                continue
            exits = trigger.exit_codes if trigger.exit_codes is not None else trigger.entry_codes
            mine = np.flatnonzero(np.isin(codes, trigger.entry_codes) | np.isin(codes, exits))
            stack = self.stacks.setdefault((index, tid), [])
            for at in mine.tolist():
                tsc = int(records["tsc"][at])
                if int(codes[at]) & 1 == 0:
                    if len(stack) < STACK_DEPTH:
                        stack.append(tsc)
                    continue
                if not stack:
                    continue  # its entry came before the trigger was armed
                took = (tsc - stack.pop()) / self.tsc_hz
                if took > trigger.seconds and fired is None:
                    fired = Fired(trigger.spec, tid, tsc, took)
        return fired

    def forget_ended(self, pid: int) -> None:
        """The open calls of threads of ``pid`` that ended (a thread per request)."""
        for key in [k for k in self.stacks if not os.path.exists(f"/proc/{pid}/task/{k[1]}")]:
            del self.stacks[key]
