# SPDX-License-Identifier: GPL-2.0-or-later
"""Chrome / Perfetto JSON trace events of a trace (madtrace export --format chrome).

One JSON object ``{"traceEvents": [...], "displayTimeUnit": "ns", ...}``:

* each dynamic call is a complete event (``"ph": "X"``) on its thread's
  track: ``name`` its function, ``ts``/``dur`` in microseconds from the
  first record of the trace, ``args`` its call_id, fate and access counts
  (self and inclusive).  Calls nest exactly as the segmentation found them
  (a call left by longjmp ends where that was proved).  Unmatched exits
  (calls that began before tracing) are left out.  A viewer nests slices by
  their times alone, so a thread's records get strictly increasing times, in
  whole nanoseconds (a record read from a TSC that ran behind the one
  before, after the thread moved to another CPU, is put 1 ns after it):
  a call never begins before its caller or ends after it.
* each data access is a thread-scoped instant event (``"ph": "i"``):
  ``name`` its data (``values[3]``, ``<malloc0014@f+33>+8``), ``cat`` ``L``
  or ``S``, ``args`` address, size and instruction.  Accesses carry no
  timestamp of their own: they are spread evenly between the records
  around them, so each lies inside its call.
* ``M`` events name the process and the threads.

Without timestamps (``--no-time``) the time axis is each thread's record
index (one "microsecond" per call record), the accesses spread between.

``--max-events N`` bounds the output.  When the trace has more events, the
export still covers the whole run, at a coarser grain (``Coverage``): the
accesses are left out (each call's args keep their counts), and if the calls
alone are still too many, the calls shorter than a duration D are left out
too, D the shortest that keeps at most N (found from a histogram of the calls'
durations, a first pass over the records).  A call is never shorter than a
call inside it, so what is kept nests as before.  The file says so
(``otherData.coverage``), and so does one line on stderr.  With ``first``
(``--first``) the export keeps every event up to the time T at which N events
are reached instead (from a histogram of the event times, read from the raw
records), cuts calls still open at T (``args.cut``) and says so.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .replay import EVENT_ACCESS, EVENT_BEGIN, EVENT_END, FATE_UNMATCHED, FATES
from .segmentation import iter_thread_chunks, load_tables
from .record_files import ACCESS_RECORDS, CALL_RECORDS
from .format import KIND_LOAD
from .meta import read_meta
from .naming import AccessNamer

HISTOGRAM_BINS = 1 << 16
CHUNK = 1 << 20
# call durations: log2 of ns in 1/DURATION_STEPS octaves, from 1 ns to 2^48 ns
DURATION_STEPS = 32
DURATION_BINS = 48 * DURATION_STEPS


class Clock:
    """Event times in microseconds: from the TSC when recorded, else positions."""

    def __init__(self, directory: str):
        tables = load_tables(directory, required=False)
        self.timed = bool(tables.timestamps and tables.tsc_hz)
        self.tsc_hz = tables.tsc_hz or 1.0
        firsts = []
        for _, path in CALL_RECORDS.files(directory):
            first = CALL_RECORDS.read(path, 0, 1)
            if len(first):
                firsts.append(int(first["tsc"][0]))
        self.origin = min(firsts) if firsts and self.timed else 0

    def us(self, tsc) -> np.ndarray:
        return (np.asarray(tsc, dtype=np.float64) - self.origin) * (1e6 / self.tsc_hz)


def _event_times(directory: str, clock: Clock):
    """Yields arrays of event times (µs) of every call begin and access, thread
    by thread, from the raw files (an access at its previous record's time)."""
    records = dict(CALL_RECORDS.files(directory))
    accesses = dict(ACCESS_RECORDS.files(directory))
    for tid in sorted(set(records) | set(accesses)):
        rec = CALL_RECORDS.map(records[tid]) if tid in records else \
            np.zeros(0, dtype=CALL_RECORDS.dtype)
        n_rec = len(rec)
        for start in range(0, n_rec, CHUNK):
            part = rec[start:start + CHUNK]
            entries = (part["code"] & 1) == 0
            yield clock.us(part["tsc"][entries]) if clock.timed else \
                np.flatnonzero(entries).astype(np.float64) + start
        if tid not in accesses:
            continue
        for rows in ACCESS_RECORDS.chunks(accesses[tid], CHUNK):   # a .dat file decoded
            s = rows["seq"].astype(np.int64)
            prev = np.clip(s - 1, 0, max(n_rec - 1, 0))
            if clock.timed:
                yield clock.us(rec["tsc"][prev]) if n_rec else np.zeros(len(s))
            else:
                yield prev.astype(np.float64)


def cut_time(directory: str, clock: Clock, max_events: int) -> tuple[float | None, int]:
    """(T, total events): keep events before T to stay within ``max_events``
    (T None: everything fits).  T is the first edge of a histogram bin left out:
    an event exactly at it is that bin's (kept "at or before T", it made 501
    events of 500)."""
    total, lo, hi = 0, np.inf, -np.inf
    for times in _event_times(directory, clock):
        total += len(times)
        if len(times):
            lo, hi = min(lo, float(times.min())), max(hi, float(times.max()))
    if total <= max_events:
        return None, total
    edges = np.linspace(lo, hi, HISTOGRAM_BINS + 1)
    counts = np.zeros(HISTOGRAM_BINS, dtype=np.int64)
    for times in _event_times(directory, clock):
        counts += np.histogram(times, bins=edges)[0]
    cumulative = np.cumsum(counts)
    k = int(np.searchsorted(cumulative, max_events, side="right"))   # bins fully kept
    return (float(edges[k]) if k > 0 else float(np.nextafter(lo, np.inf))), total


def before_cut(time: float, limit: float | None) -> bool:
    """Whether an event at ``time`` is exported under the cut ``limit`` (cut_time)."""
    return limit is None or time < limit


class Coverage:
    """What a coarse export keeps: every call of at least ``min_duration`` (µs,
    or record positions without timestamps), no access when ``accesses`` is
    False; the counts of what it leaves out."""

    def __init__(self, total_calls: int, total_accesses: int, min_duration: float,
                 accesses: bool, kept_calls: int):
        self.total_calls, self.total_accesses = total_calls, total_accesses
        self.min_duration, self.accesses, self.kept_calls = min_duration, accesses, kept_calls

    def to_dict(self, timed: bool) -> dict:
        return {"whole_run": True, "calls": self.total_calls, "calls_kept": self.kept_calls,
                "accesses": self.total_accesses,
                "accesses_kept": self.total_accesses if self.accesses else 0,
                ("min_duration_us" if timed else "min_duration_records"): self.min_duration}

    def line(self, max_events: int, timed: bool) -> str:
        unit = "µs" if timed else "records"
        shorter = (f", the {self.total_calls - self.kept_calls} calls shorter than "
                   f"{self.min_duration:g} {unit}" if self.kept_calls < self.total_calls else "")
        left = ([f"its {self.total_accesses} accesses"] if self.total_accesses else []) + \
            ([shorter.removeprefix(", ")] if shorter else [])
        return (f"the trace has {self.total_calls + self.total_accesses} events, more than "
                f"--max-events {max_events}: exported the whole run without "
                f"{' and '.join(left)} (the calls' args count their accesses; --first exports "
                "every event up to the budget instead)")


def _call_durations(chunk, clock: Clock) -> np.ndarray:
    """The durations of a chunk's ended calls (unmatched exits left out), as the
    coarse export measures them: µs between the records, else record positions."""
    return _call_durations_all(chunk.segments[chunk.segments["fate"] != FATE_UNMATCHED], clock)


def _call_durations_all(segments: np.ndarray, clock: Clock) -> np.ndarray:
    """_call_durations of every segment row (unmatched ones too, aligned)."""
    if clock.timed:
        return clock.us(segments["end_tsc"]) - clock.us(segments["begin_tsc"])
    return (segments["end_seq"] - segments["begin_seq"]).astype(np.float64)


def _duration_bin(durations: np.ndarray) -> np.ndarray:
    scaled = np.maximum(durations * 1000.0, 1.0)        # ns (or positions x 1000)
    return np.minimum((np.log2(scaled) * DURATION_STEPS).astype(np.int64), DURATION_BINS - 1)


def coverage(directory: str, clock: Clock, max_events: int, tables) -> Coverage | None:
    """None when the trace fits in ``max_events``, else what to keep (see the module)."""
    calls = accesses = 0
    for _, path in CALL_RECORDS.files(directory):
        for part in CALL_RECORDS.chunks(path, CHUNK):
            calls += int(np.count_nonzero((part["code"] & 1) == 0))
    meta = read_meta(directory)
    accesses = sum(int(c["L"]) + int(c["S"]) for c in (meta.get("accesses") or {}).values()) \
        if meta.get("accesses") else ACCESS_RECORDS.total_rows(directory)
    if calls + accesses <= max_events:
        return None
    counts = np.zeros(DURATION_BINS, dtype=np.int64)
    ended = 0
    for chunk in iter_thread_chunks(directory, accesses=False, tables=tables):
        durations = _call_durations(chunk, clock)
        ended += len(durations)
        counts += np.bincount(_duration_bin(durations), minlength=DURATION_BINS)
    if ended <= max_events:
        return Coverage(ended, accesses, 0.0, False, ended)
    kept_from = np.cumsum(counts[::-1])[::-1]          # calls in bin k or above
    k = int(np.searchsorted(-kept_from, -max_events, side="left"))  # first bin that fits
    k = min(k, DURATION_BINS - 1)
    threshold = float(2.0 ** (k / DURATION_STEPS) / 1000.0)
    kept = int(kept_from[k]) if k < DURATION_BINS else 0
    return Coverage(ended, accesses, threshold, False, kept)


def _spread(times: np.ndarray, is_record: np.ndarray, last: float) -> tuple[np.ndarray, float]:
    """Times of a chunk's events: records have theirs; each run of accesses
    between two records is spread evenly between them (after the chunk's last
    record: at that record's time).  ``last``: the previous chunk's last record time."""
    n = len(times)
    idx = np.arange(n)
    rec_idx = np.where(is_record, idx, -1)
    prev_i = np.maximum.accumulate(rec_idx)
    prev_t = np.where(prev_i >= 0, times[np.maximum(prev_i, 0)], last)
    nxt = np.where(is_record, idx, n)
    next_i = np.minimum.accumulate(nxt[::-1])[::-1]
    has_next = next_i < n
    next_t = np.where(has_next, times[np.minimum(next_i, n - 1)], prev_t)
    gap = next_i - prev_i            # events from the previous record to the next
    rank = idx - prev_i              # 1.. within the gap
    spread = prev_t + (next_t - prev_t) * rank / np.maximum(gap, 1)
    out = np.where(is_record, times, np.where(has_next, spread, prev_t))
    new_last = float(times[rec_idx.max()]) if is_record.any() else last
    return out, new_last


def _record_times(times_us: np.ndarray, is_record: np.ndarray, last_ns: int) -> tuple[np.ndarray, int]:
    """The records' times (µs) in whole ns, each at least 1 ns after the one
    before it in the thread (``last_ns``: the previous chunk's last); the
    other events' entries are left as they are.  Returns them and the new last."""
    out = times_us.copy()
    rec = np.flatnonzero(is_record)
    if not len(rec):
        return out, last_ns
    k = np.arange(len(rec), dtype=np.int64)
    ns = np.round(times_us[rec] * 1000).astype(np.int64)
    ns = np.maximum.accumulate(np.maximum(ns - k, last_ns + 1)) + k
    out[rec] = ns / 1000
    return out, int(ns[-1])


def chrome_events(directory: str, max_events: int | None, warn=None, first: bool = False,
                  plan: Coverage | None = None):
    """Yields the trace events (dicts) of ``directory``; ``warn(message)`` is
    called once if --max-events cut the trace (``first``) or thinned it
    (``plan``, coverage()'s)."""
    clock = Clock(directory)
    tables = load_tables(directory, required=False)
    names = tables.names
    meta = read_meta(directory)
    pid = int(meta.get("pid") or 0)
    command = " ".join(meta.get("command") or []) or f"pid {pid}"
    limit, total = cut_time(directory, clock, max_events) if max_events is not None and first \
        else (None, None)
    namer = AccessNamer(directory) if ACCESS_RECORDS.files(directory) else None
    yield {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": command}}
    emitted = 0
    current, last, last_ns = None, 0.0, -(1 << 62)
    begins: dict[int, float] = {}      # call_id -> its begin (µs), for the calls still open
    for chunk in iter_thread_chunks(directory, tables=tables):
        if chunk.tid != current:
            current, last, last_ns = chunk.tid, 0.0, -(1 << 62)
            begins.clear()
            yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": chunk.tid,
                   "args": {"name": f"thread {chunk.tid}"}}
        ev = chunk.events
        if not len(ev):
            continue
        is_record = ev["type"] != EVENT_ACCESS
        record_times = clock.us(ev["tsc"]) if clock.timed else ev["ref"].astype(np.float64)
        record_times, last_ns = _record_times(record_times, is_record, last_ns)
        times, last = _spread(record_times, is_record, last)
        opened = np.flatnonzero(ev["type"] == EVENT_BEGIN)
        begins.update(zip(ev["call_id"][opened].tolist(), times[opened].tolist()))
        for item in _chunk_events(chunk, ev, times, begins, names, namer, pid, limit, plan,
                                  clock):
            emitted += 1
            yield item
    if limit is not None and warn is not None:
        warn(f"the trace has {total} events: exported the first {emitted} (up to "
             f"{limit:.3f} µs; raise --max-events for more)")
    if plan is not None and warn is not None:
        warn(plan.line(max_events or 0, clock.timed))


def _chunk_events(chunk, ev, times, begins, names, namer, pid, limit, plan, clock):
    tid = chunk.tid
    segments = chunk.segments
    ends = np.flatnonzero(ev["type"] == EVENT_END)
    access_rows = np.flatnonzero(ev["type"] == EVENT_ACCESS)
    if plan is not None and not plan.accesses:
        access_rows = access_rows[:0]
    long_enough = None
    if plan is not None and plan.min_duration > 0:
        # the same measure and bins as coverage() counted them with
        threshold_bin = _duration_bin(np.array([plan.min_duration]))[0]
        long_enough = _duration_bin(_call_durations_all(segments, clock)) >= threshold_bin
    acc = chunk.accesses
    data = instr = None
    if len(access_rows) and len(acc) and namer is not None:
        data = namer.data_labels(acc["addr"], acc["block"], acc["freed"])
        codes, insn_names = namer.code_names(acc["rip"])
        instr = [insn_names[c] for c in codes.tolist()]
    out = []
    for k, i in enumerate(ends.tolist()):
        seg = segments[k]
        if seg["fate"] == FATE_UNMATCHED:
            continue
        if long_enough is not None and not long_enough[k]:
            begins.pop(int(seg["call_id"]))
            continue
        begin, end = begins.pop(int(seg["call_id"])), float(times[i])
        if not before_cut(begin, limit):
            continue
        args = {"call_id": int(seg["call_id"]), "fate": FATES[int(seg["fate"])],
                "accesses_self": int(seg["accesses_self"]),
                "accesses_incl": int(seg["accesses_incl"])}
        if limit is not None and end > limit:
            end, args["cut"] = limit, True
        ts = round(begin, 3)      # µs with ns digits; dur from the rounded end, so that a
        dur = round(max(round(end, 3) - ts, 0.0), 3)   # call ending at a sibling's start
        out.append((begin, {"name": names[int(seg["fid"])], "cat": "call", "ph": "X",  # never
                            "ts": ts, "dur": dur,                              # overlaps it
                            "pid": pid, "tid": tid, "args": args}))
    for k, i in enumerate(access_rows.tolist()):
        ts = float(times[i])
        if not before_cut(ts, limit):
            continue
        a = acc[k]
        out.append((ts, {"name": data[k] if data else f"{int(a['addr']):#x}",
                         "cat": "L" if a["kind"] == KIND_LOAD else "S", "ph": "i", "s": "t",
                         "ts": round(ts, 3), "pid": pid, "tid": tid,
                         "args": {"addr": f"{int(a['addr']):#x}", "size": int(a["size"]),
                                  "instruction": instr[k] if instr else f"{int(a['rip']):#x}"}}))
    for _, item in out:
        yield item


def write_chrome(directory: str, out, max_events: int | None, warn=None,
                 first: bool = False) -> int:
    """Writes the JSON object to ``out`` (a text file); returns the events written.
    Beyond ``max_events``: the whole run at a coarser grain, or with ``first`` the
    events up to the budget (see the module)."""
    plan = None
    other: dict = {"producer": "madtrace", "trace_directory": os.path.abspath(directory)}
    if max_events is not None and not first:
        clock = Clock(directory)
        plan = coverage(directory, clock, max_events, load_tables(directory, required=False))
        if plan is not None:
            other["coverage"] = plan.to_dict(clock.timed)
    out.write('{"displayTimeUnit": "ns", "otherData": ')
    out.write(json.dumps(other))
    out.write(', "traceEvents": [\n')
    n = 0
    for event in chrome_events(directory, max_events, warn, first, plan):
        out.write((",\n" if n else "") + json.dumps(event, separators=(",", ":")))
        n += 1
    out.write("\n]}\n")
    return n


