# SPDX-License-Identifier: GPL-2.0-or-later
"""A recording as a flight recorder (``--flight SIZE`` / ``--keep SECONDS``):
the recorder's ticks, its triggers and its snapshots, for one Recording.

The recording writes into the recorder's scratch directory (in memory);
``tick`` runs on the tracer's thread every BOUND_PERIOD (the controller's
timer); a trigger asks the controller for a snapshot at its next safe point
(``Controller.request_action``), written while the target runs on, as the
REPL's ``save`` does (Recording.snapshot).  A signal that would
kill the program is a trigger too: the snapshot is written in its stop, before
the signal is delivered, and the program then dies of it as it would have.
When the recording ends without any snapshot, the window that led to the
end is written (trigger "end").
"""

from __future__ import annotations

import signal
import time

import numpy as np

from ..errors import UsageError
from ..trace import store
from ..trace.format import RECORD_DTYPE
from ..trace.meta import write_meta
from ..trace.record_files import CALL_RECORDS
from ..trace.reader import entry_counts
from .recorder import FlightRecorder, window_access_counts
from .triggers import GAP, CallTriggers, Trigger

# signals whose default action kills the program with a core (or not): a crash
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS)


def handled_signals(pid: int) -> int:
    """The mask of signals ``pid`` catches or ignores (/proc/PID/status SigCgt | SigIgn)."""
    mask = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigCgt:", "SigIgn:")):
                    mask |= int(line.split()[1], 16)
    except OSError:
        pass
    return mask


class FlightSession:
    def __init__(
        self, recording, bound: int | None, keep: float | None, snapshots: int | None, triggers: list[Trigger]
    ):
        self.recording = recording
        self.recorder = FlightRecorder(recording.options.output, bound, keep, snapshots)
        self.triggers: CallTriggers | None = None
        if triggers:
            from ..rings.tsc import tsc_hz

            self.triggers = CallTriggers(triggers, tsc_hz())
            self.recorder.on_call_chunks = self._feed
        self.suppressed = 0  # triggers within GAP of the last snapshot
        self._last_trigger = -GAP
        self._pending: tuple[str, int | None] | None = None  # a trigger's, not written yet
        self.unbound: list[str] = []  # trigger functions without a traced site
        self._cut_tsc: int | None = None  # the snapshot being written ends there
        self.failed = False

    @property
    def scratch(self) -> str:
        return self.recorder.scratch

    def create_folder(self, force: bool) -> None:
        self.recorder.create_folder(force)

    # ------------------------------------------------------------- each tick
    def tick(self) -> None:
        """The controller's timer (tracer thread, a signal handler).  A failure
        stops the recording (said in one line): the bound would not hold any more."""
        if self.failed:
            return
        tracee = self.recording.tracee
        self.recorder.pid = tracee.pid if tracee is not None else 0
        try:
            self.recorder.tick()
        except Exception as exc:  # (a signal handler: the run loop ends the recording)
            self.failed = True
            self.recording.log(f"flight recorder: {exc}: recording stops here")
            self.recording.controller.request_stop("flight recorder error")

    def _feed(self, new_calls: list) -> None:
        """FlightRecorder.on_call_chunks: the triggers see each call record once."""
        if self.triggers is None:
            return
        self._bind()
        self.triggers.forget_ended(self.recorder.pid)
        for path, tid, offset, length in new_calls:
            window = self.recorder.streams[path]
            records = np.frombuffer(window.payload(offset, length), dtype=RECORD_DTYPE)
            fired = self.triggers.feed(tid, records)
            if fired is not None:
                reason = fired.trigger + (
                    f" ({fired.seconds * 1e3:.3f} ms, thread {fired.tid})"
                    if fired.seconds
                    else f" (thread {fired.tid})"
                )
                self.fire(reason, fired.tsc)

    def _bind(self) -> None:
        functions = self.recording.functions
        if functions is None or functions.plan is None or self.triggers is None:
            return
        sites = [(s.sid, s.function.name) for s in functions.plan.sites]
        missing = self.triggers.bind(sites)
        if missing and missing != self.unbound:
            self.unbound = missing
            self.recording.log(
                f"flight recorder: no traced call of {', '.join(missing)} yet (trace it with -f)"
            )

    def fire(self, reason: str, cut_tsc: int | None = None) -> None:
        """A trigger: a snapshot at the controller's next safe point (``cut_tsc``:
        it ends at the call record with this time stamp)."""
        now = time.monotonic()
        if self._pending is not None or now - self._last_trigger < GAP:
            self.suppressed += 1
            return
        self._last_trigger, self._pending = now, (reason, cut_tsc)
        self.recording.controller.request_action(lambda: self.snapshot(reason, cut_tsc=cut_tsc))

    def signal_to_tracer(self, signum, frame) -> None:
        """SIGUSR1 to madtrace: a snapshot."""
        self.fire("SIGUSR1 to madtrace")

    def before_forward_signal(self, tracee, event) -> None:
        """Controller hook: a signal about to be delivered; one that kills the
        program (default action, not caught) gets a snapshot first."""
        if event.signum not in CRASH_SIGNALS or tracee is not self.recording.tracee:
            return
        if handled_signals(tracee.pid) & (1 << (event.signum - 1)):
            return  # the program handles it: not (yet) a crash
        name = signal.Signals(event.signum).name
        self.snapshot(f"crash: {name} in thread {event.tid}")

    # ------------------------------------------------------------- snapshots
    def snapshot(
        self, reason: str, directory: str | None = None, force: bool = False, cut_tsc: int | None = None
    ) -> dict:
        """The window now into ``directory`` (default: the folder's next
        snapshot.N); Recording.snapshot writes its meta.json."""
        self._pending = None
        directory = directory or self.recorder.next_snapshot()
        self._cut_tsc = cut_tsc
        try:
            result = self.recording.snapshot(directory, force=force, flight_reason=reason)
        finally:
            self._cut_tsc = None
        self.recorder.taken_one(directory, reason, result["flight"])
        self.recording.log(
            f"flight recorder: {reason}: the last {result['flight']['seconds']:.2f} s "
            f"written to {directory} ({result['records']} call records, "
            f"{result['accesses']} accesses)"
        )
        return result

    def window_into(self, directory: str, meta: dict, reason: str) -> dict:
        """For Recording.snapshot: the window's files into ``directory`` and
        meta.json's window fields into ``meta``."""
        flight = self.recorder.write_window(directory, self._cut_tsc)
        flight.update(trigger=reason, triggers_suppressed=self.suppressed)
        meta["flight"] = flight
        if "function_tracing" in meta:  # the window's records, not the recording's
            meta["function_tracing"] = dict(
                meta["function_tracing"], records=CALL_RECORDS.total_rows(directory)
            )
        data = self.recording.data
        if data is not None:
            meta["accesses"] = window_access_counts(directory, data.instruction_name)
        return flight

    def end(self) -> None:
        """The recording has written its end into the scratch directory: a trigger
        the last records fired, or else, if no snapshot was taken, the end itself,
        writes the window that led to it; the scratch goes."""
        recording = self.recording
        try:
            self.recorder.tick()  # the last records, seen by the triggers too
            reason, cut = self._pending or ("end", None)
            if self._pending is not None or not self.recorder.taken:
                self._pending = None
                directory = self.recorder.next_snapshot()
                store.create_trace_dir(directory, False)
                meta = dict(recording.meta)
                self._cut_tsc = cut
                try:
                    flight = self.window_into(directory, meta, reason)
                finally:
                    self._cut_tsc = None
                functions = recording.functions
                if functions is not None and functions.rings is not None:
                    meta["calls"] = functions.call_counts(entry_counts(directory, functions.rings.sites))
                write_meta(directory, meta)
                self.recorder.taken_one(directory, reason, flight)
                what = "the end" if cut is None and reason == "end" else reason
                recording.log(
                    f"flight recorder: the last {flight['seconds']:.2f} s before "
                    f"{what} written to {directory}"
                )
        finally:
            self.recorder.close()
        if self.suppressed:
            recording.log(
                f"flight recorder: {self.suppressed} more trigger"
                f"{'s' * (self.suppressed != 1)} within {GAP:g} s of a snapshot "
                f"(none written for {'them' if self.suppressed != 1 else 'it'})"
            )


def flight_session(recording) -> FlightSession | None:
    """The recording's flight recorder, if its options ask for one."""
    options = recording.options
    if options.flight_bytes is None and options.keep_seconds is None:
        if options.triggers or options.snapshots is not None:
            raise UsageError(
                "--trigger-on, --trigger-slow and --snapshots go with --flight SIZE (or --keep SECONDS)"
            )
        return None
    if options.max_bytes is not None:
        raise UsageError(
            "--max-size and --flight contradict each other (a flight recorder keeps the last SIZE)"
        )
    if options.store:
        raise UsageError(
            "--store and --flight contradict each other (build a snapshot's "
            "store with madtrace query or report)"
        )
    if any(t.kind == "slow" for t in options.triggers) and not options.timestamps:
        raise UsageError("--trigger-slow needs the call records' times: not with --no-time")
    if options.triggers and not options.trace_functions:
        raise UsageError("--trigger-on and --trigger-slow need function tracing: not with --no-functions")
    return FlightSession(
        recording, options.flight_bytes, options.keep_seconds, options.snapshots, options.triggers
    )
