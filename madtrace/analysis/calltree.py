"""Rebuild the dynamic calls of a trace directory and aggregate them.

Input: ``functions.json`` (the sites: id, function name, kind) and
``calls/<tid>.rec`` (16-byte records ``u64 tsc, u32 code, u32 rsp_low32``;
``code`` is ``site id << 1``, ``| 1`` for an exit).  Each thread's file is
replayed in order against a stack of open frames:

* an entry record opens a frame whose ``rsp`` is the stack pointer at the
  callee's entry (the slot of its return address); its exit record carries
  the same ``rsp`` and closes it;
* a ``call`` entry at ``rsp`` R proves that every open frame whose ``rsp`` is
  <= R is over (a call always pushes below its caller's frame);
* an ``entry`` or ``tail`` entry at R proves that open frames below R
  (numerically less) are over; at exactly R it nests inside the frame it
  was jumped to from (a tail jump keeps the stack pointer);
* ``tail`` sites have no exit record: a tail frame pushed onto a frame with
  the same ``rsp`` ("enclosed") ends with that frame and shares its fate; a
  tail frame with no traced frame at its ``rsp`` ends when a later record
  proves its ``rsp`` is gone, and counts as completed;
* frames closed without their own exit record (a ``longjmp`` skipped them)
  count as "unwound"; they end at the record that revealed it;
* an exit that matches no open frame (tracing began inside the call, e.g.
  after an attach) counts as "unmatched" and closes the frames at its ``rsp``.

``rsp_low32`` is compared as an offset from the thread's first record
(modulo 2**32, centred), so a stack that straddles a 4 GiB boundary of the
low 32 bits still compares correctly.

Output (:class:`CallAnalysis`): per function the calls (entries), completed /
unwound / open frames, inclusive time (outermost activations only, so a
recursion is not counted twice), exclusive time, maximum stack depth and
recursion depth; a calling-context tree merged over threads (one node per
distinct path of function names from a thread's root, capped at
``max_nodes``: frames beyond the cap are aggregated per function under a
"[truncated]" node); per-thread totals and global counters.

Memory stays bounded: each thread file is read in chunks of
``chunk_records`` records; what is kept is the tree, one frame per open call
and per-thread totals.  Times are in ns (``tsc / tsc_hz * 1e9``), ``None``
when the trace was recorded with ``--no-time``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import CorruptTraceError
from ..trace.store import per_thread_files

RECORD_DTYPE = np.dtype([("tsc", "<u8"), ("code", "<u4"), ("rsp", "<u4")])
RECORD_SIZE = RECORD_DTYPE.itemsize
FUNCTIONS_FILE = "functions.json"
CALLS_DIR = "calls"
DEFAULT_CHUNK_RECORDS = 1 << 18
DEFAULT_MAX_NODES = 100_000
TRUNCATED_NAME = "[truncated]"
ROOT_NAME = "[root]"

# Frame kinds.  Frames are tuples (rsp, node, start_tsc, exit_code, kind).
KIND_CALL, KIND_ENTRY, KIND_TAIL_ENCLOSED, KIND_TAIL_FREE, KIND_ROOT = range(5)
SITE_KINDS = {"call": KIND_CALL, "entry": KIND_ENTRY, "tail": KIND_TAIL_FREE}
FRAME_RSP, FRAME_NODE, FRAME_START, FRAME_EXIT, FRAME_KIND = range(5)
SENTINEL_RSP = 1 << 40     # above every (relative) 32-bit stack pointer
NO_EXIT = -1               # exit code of frames that get no exit record

# Tree nodes are lists (fast to update in the record loop):
# [calls, incl_ticks, excl_ticks, completed, unwound, open, children{fid: node}, fid, depth]
CALLS, INCL, EXCL, COMPLETED, UNWOUND, OPEN, CHILDREN, FID, DEPTH = range(9)
ROOT_FID, TRUNCATED_FID = -1, -2


def new_node(fid: int, depth: int, children: dict | None = None) -> list:
    return [0, 0, 0, 0, 0, 0, {} if children is None else children, fid, depth]


# ------------------------------------------------------------------ input
@dataclass
class CallTables:
    """What functions.json says about the record codes."""

    names: list[str]            # function names; a fid indexes this list
    timestamps: bool
    tsc_hz: float | None
    code_fid: list[int]         # indexed by record code (entry and exit codes)
    code_kind: list[int]        # frame kind opened by an entry code
    code_exit: list[int]        # exit code expected by the frame an entry code opens
    code_valid: np.ndarray      # bool per code: does the site exist

    @property
    def n_codes(self) -> int:
        return len(self.code_fid)


def load_tables(directory: str) -> CallTables:
    path = os.path.join(directory, FUNCTIONS_FILE)
    if not os.path.isdir(directory):
        raise CorruptTraceError(f"{directory}: no such trace directory")
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise CorruptTraceError(f"{directory}: no {FUNCTIONS_FILE} "
                                "(recorded without function tracing?)") from None
    except (OSError, ValueError) as exc:
        raise CorruptTraceError(f"{path}: unreadable ({exc})".replace("\n", " ")) from None
    try:
        names: list[str] = []
        fids: dict[str, int] = {}

        def fid_of(name: str) -> int:
            if not isinstance(name, str):
                raise TypeError(f"function name {name!r} is not a string")
            if name not in fids:
                fids[name] = len(names)
                names.append(name)
            return fids[name]

        for fn in doc.get("functions", []):
            if fn.get("method") != "skipped":
                fid_of(fn["name"])
        sites = doc["sites"]
        n_sites = max((int(s["sid"]) for s in sites), default=-1) + 1
        code_fid = [-1] * (2 * n_sites)
        code_kind = [KIND_CALL] * (2 * n_sites)
        code_exit = [NO_EXIT] * (2 * n_sites)
        code_valid = np.zeros(2 * n_sites, dtype=bool)
        for site in sites:
            sid, kind = int(site["sid"]), site["kind"]
            if sid < 0 or kind not in SITE_KINDS:
                raise ValueError(f"site {sid} has kind {kind!r}")
            entry = sid << 1
            fid = fid_of(site["function"])
            code_fid[entry] = code_fid[entry | 1] = fid
            code_kind[entry] = SITE_KINDS[kind]
            code_exit[entry] = NO_EXIT if kind == "tail" else entry | 1
            code_valid[entry] = True
            code_valid[entry | 1] = kind != "tail"
        tsc_hz = doc.get("tsc_hz")
        timestamps = bool(doc.get("timestamps", True))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptTraceError(f"{path}: corrupt ({type(exc).__name__}: {exc})") from None
    return CallTables(names=names, timestamps=timestamps,
                      tsc_hz=float(tsc_hz) if tsc_hz else None,
                      code_fid=code_fid, code_kind=code_kind, code_exit=code_exit,
                      code_valid=code_valid)


def thread_files(directory: str) -> list[tuple[int, str]]:
    """(tid, path) of every calls/<tid>.rec, by tid."""
    return per_thread_files(directory, CALLS_DIR, ".rec")


# ------------------------------------------------------------------- tree
class CallTree:
    """Calling-context tree shared by all threads, at most ``max_nodes`` nodes
    (beyond: one flat node per function under a "[truncated]" node)."""

    def __init__(self, max_nodes: int = DEFAULT_MAX_NODES):
        self.root = new_node(ROOT_FID, 0)
        self.max_nodes = max_nodes
        self.node_count = 0
        self.overflow: dict[int, list] = {}     # fid -> flat node; also their children
        self.overflow_root: list | None = None

    @property
    def truncated(self) -> bool:
        return self.overflow_root is not None

    def child(self, parent: list, fid: int) -> list:
        """The child ``fid`` of ``parent``, created (the caller checked that it
        does not exist yet)."""
        children = parent[CHILDREN]
        if children is not self.overflow and self.node_count < self.max_nodes:
            node = new_node(fid, parent[DEPTH] + 1)
            children[fid] = node
            self.node_count += 1
            return node
        node = self.overflow.get(fid)
        if node is None:
            if self.overflow_root is None:
                self.overflow_root = new_node(TRUNCATED_FID, 1, self.overflow)
                self.root[CHILDREN][TRUNCATED_FID] = self.overflow_root
            node = self.overflow[fid] = new_node(fid, -1, self.overflow)
        return node


# ---------------------------------------------------------------- threads
@dataclass
class ThreadTotals:
    tid: int
    records: int = 0
    entries: int = 0
    exits: int = 0
    unmatched_exits: int = 0
    unwound_frames: int = 0
    open_frames: int = 0
    first_tsc: int = 0
    last_tsc: int = 0
    outside_ticks: int = 0      # time with no traced frame open


class ThreadReplay:
    """Replays one thread's records into a :class:`CallTree`."""

    def __init__(self, tid: int, tables: CallTables, tree: CallTree):
        self.tables = tables
        self.tree = tree
        self.totals = ThreadTotals(tid)
        # a root of its own (for the time outside traced frames) whose
        # children are the shared root's
        self.root = new_node(ROOT_FID, 0, tree.root[CHILDREN])

    def replay_file(self, path: str, chunk_records: int = DEFAULT_CHUNK_RECORDS) -> ThreadTotals:
        size = os.path.getsize(path)
        if size % RECORD_SIZE:
            raise CorruptTraceError(f"{path}: size {size} is not a multiple of {RECORD_SIZE} "
                                    "(truncated or corrupt call records)")
        with open(path, "rb") as f:
            self._replay_stream(f, path, chunk_records)
        return self.totals

    def _chunks(self, f, path: str, chunk_records: int):
        tables = self.tables
        n_codes = tables.n_codes
        done = 0
        while True:
            chunk = np.fromfile(f, dtype=RECORD_DTYPE, count=chunk_records)
            if not len(chunk):
                return
            codes = chunk["code"]
            bad = codes >= n_codes
            if not bad.any():
                bad = ~tables.code_valid[codes]
            if bad.any():
                i = int(np.argmax(bad))
                raise CorruptTraceError(f"{path}: record {done + i} has code {int(codes[i])}, "
                                        "which names no known site")
            done += len(chunk)
            yield chunk

    def _replay_stream(self, f, path: str, chunk_records: int) -> None:
        tables, totals = self.tables, self.totals
        tree_child = self.tree.child
        code_fid, code_exit, code_kind = tables.code_fid, tables.code_exit, tables.code_kind
        exit_slow, entry_slow = self._exit_slow, self._entry_slow
        # stack[0] is a sentinel that is never closed; the top frame is also
        # unpacked in locals
        stack: list[tuple] = [(SENTINEL_RSP, self.root, 0, NO_EXIT, KIND_ROOT)]
        push, pop = stack.append, stack.pop
        top_rsp, top_node, top_start, top_exit, _ = stack[-1]
        base = None
        last = 0
        for chunk in self._chunks(f, path, chunk_records):
            rsp = chunk["rsp"]
            if base is None:
                base = np.uint32((int(rsp[0]) - 0x80000000) & 0xFFFFFFFF)
                last = totals.first_tsc = int(chunk["tsc"][0])
            codes = chunk["code"]
            totals.records += len(chunk)
            totals.exits += int(np.count_nonzero(codes & 1))
            for t, c, r in zip(chunk["tsc"].tolist(), codes.tolist(), (rsp - base).tolist()):
                top_node[2] += t - last                           # EXCL of the running frame
                last = t
                if c & 1:
                    if c == top_exit and r == top_rsp:            # the usual return
                        top_node[1] += t - top_start              # INCL
                        top_node[3] += 1                          # COMPLETED
                        pop()
                        top_rsp, top_node, top_start, top_exit, _ = stack[-1]
                        continue
                    exit_slow(stack, t, c, r)
                elif r < top_rsp:                                 # the usual call
                    fid = code_fid[c]
                    node = top_node[6].get(fid)                   # CHILDREN
                    if node is None:
                        node = tree_child(top_node, fid)
                    node[0] += 1                                  # CALLS
                    top_exit = code_exit[c]
                    push((r, node, t, top_exit, code_kind[c]))
                    top_rsp = r
                    top_node = node
                    top_start = t
                    continue
                else:
                    entry_slow(stack, t, c, r)
                top_rsp, top_node, top_start, top_exit, _ = stack[-1]
        totals.entries = totals.records - totals.exits
        totals.last_tsc = last
        # frames still open at the end: timed up to the last record
        for _, node, start, _, kind in stack[1:]:
            node[INCL] += last - start
            node[OPEN] += 1
        totals.open_frames = len(stack) - 1
        totals.outside_ticks = self.root[EXCL]

    # Slow paths: ``stack`` holds every frame, the sentinel at index 0.
    def _close_from(self, stack: list, k: int, t: int, bottom_fate: int | None) -> None:
        """Close stack[k:] at time t.  Enclosed tail frames share the fate of
        the frame below them; other frames without an exit record were unwound
        (free tail frames: completed)."""
        fate = COMPLETED
        for j in range(k, len(stack)):
            _, node, start, _, kind = stack[j]
            if j == k and bottom_fate is not None:
                fate = bottom_fate
            elif kind == KIND_TAIL_ENCLOSED and j > k:
                pass
            elif kind == KIND_CALL or kind == KIND_ENTRY:
                fate = UNWOUND
            else:
                fate = COMPLETED
            node[INCL] += t - start
            node[fate] += 1
            if fate == UNWOUND:
                self.totals.unwound_frames += 1
        del stack[k:]

    def _exit_slow(self, stack: list, t: int, c: int, r: int) -> None:
        k = len(stack)
        while stack[k - 1][FRAME_RSP] < r:     # deeper frames: abandoned
            k -= 1
        j = k - 1
        while stack[j][FRAME_RSP] == r:
            if stack[j][FRAME_EXIT] == c:
                self._close_from(stack, j, t, COMPLETED)
                return
            j -= 1
        self.totals.unmatched_exits += 1
        self._close_from(stack, j + 1, t, None)

    def _entry_slow(self, stack: list, t: int, c: int, r: int) -> None:
        kind = self.tables.code_kind[c]
        k = len(stack)
        if kind == KIND_CALL:
            while stack[k - 1][FRAME_RSP] <= r:
                k -= 1
        else:
            while stack[k - 1][FRAME_RSP] < r:
                k -= 1
        if k < len(stack):
            self._close_from(stack, k, t, None)
        parent_rsp, parent = stack[-1][FRAME_RSP], stack[-1][FRAME_NODE]
        if kind == KIND_TAIL_FREE and parent_rsp == r:
            kind = KIND_TAIL_ENCLOSED
        fid = self.tables.code_fid[c]
        node = parent[CHILDREN].get(fid)
        if node is None:
            node = self.tree.child(parent, fid)
        node[CALLS] += 1
        stack.append((r, node, t, self.tables.code_exit[c], kind))


# ----------------------------------------------------------------- result
@dataclass
class CallAnalysis:
    directory: str
    timestamps: bool
    tsc_hz: float | None
    names: list[str]
    tree: CallTree
    threads: dict[int, ThreadTotals]
    functions: dict[str, dict] = field(default_factory=dict)
    counters: dict = field(default_factory=dict)

    @property
    def timed(self) -> bool:
        return self.timestamps and self.tsc_hz is not None

    def ns(self, ticks: int) -> float | None:
        if not self.timed:
            return None
        return round(ticks * 1e9 / self.tsc_hz, 1)

    def node_name(self, node: list) -> str:
        fid = node[FID]
        if fid == ROOT_FID:
            return ROOT_NAME
        if fid == TRUNCATED_FID:
            return TRUNCATED_NAME
        return self.names[fid]

    def sorted_children(self, node: list) -> list[list]:
        """Children, the most expensive first (by time, or by calls untimed)."""
        if self.timed:
            key = lambda n: (-n[INCL], -n[CALLS], self.node_name(n))  # noqa: E731
        else:
            key = lambda n: (-n[CALLS], self.node_name(n))  # noqa: E731
        return sorted(node[CHILDREN].values(), key=key)

    def node_dict(self, node: list) -> dict:
        return {"name": self.node_name(node), "calls": node[CALLS],
                "completed": node[COMPLETED], "unwound": node[UNWOUND], "open": node[OPEN],
                "incl_ns": self.ns(node[INCL]), "excl_ns": self.ns(node[EXCL])}

    def tree_dict(self, max_depth: int | None = None, max_children: int | None = None) -> dict:
        """The tree as nested dicts (built without recursion: trees can be
        thousands of levels deep).  Children beyond ``max_children`` per node
        or below ``max_depth`` are summarised in "elided": {"children", "calls"}."""
        top = self.node_dict(self.tree.root)
        top["children"] = []
        pending = [(self.tree.root, top, 0)]
        while pending:
            node, out, depth = pending.pop()
            children = self.sorted_children(node)
            keep = children
            if max_depth is not None and depth >= max_depth:
                keep = []
            elif max_children is not None:
                keep = children[:max_children]
            for child in keep:
                entry = self.node_dict(child)
                entry["children"] = []
                out["children"].append(entry)
                if child[CHILDREN] is not self.tree.overflow:
                    pending.append((child, entry, depth + 1))
            if len(keep) < len(children):
                rest = children[len(keep):]
                out["elided"] = {"children": len(rest), "calls": sum(n[CALLS] for n in rest)}
        return top

    def find_path(self, *names: str) -> dict | None:
        """The node at this path of function names from the root, as a dict."""
        node = self.tree.root
        for name in names:
            matches = [n for n in node[CHILDREN].values() if self.node_name(n) == name]
            if not matches:
                return None
            node = matches[0]
        return self.node_dict(node)


def _aggregate(analysis: CallAnalysis) -> None:
    """Per-function statistics from the tree, plus the root's totals."""
    names, tree = analysis.names, analysis.tree
    per_fid = [dict(calls=0, completed=0, unwound=0, open=0, incl=0, excl=0, max_depth=0,
                    max_recursion=0) for _ in names]
    active = [0] * len(names)
    pending: list[tuple[list, bool]] = [(n, False) for n in tree.root[CHILDREN].values()]
    while pending:
        node, leaving = pending.pop()
        fid = node[FID]
        if fid < 0:                       # the "[truncated]" container
            pending.extend((n, False) for n in node[CHILDREN].values())
            continue
        if leaving:
            active[fid] -= 1
            continue
        stats = per_fid[fid]
        stats["calls"] += node[CALLS]
        stats["completed"] += node[COMPLETED]
        stats["unwound"] += node[UNWOUND]
        stats["open"] += node[OPEN]
        stats["excl"] += node[EXCL]
        if active[fid] == 0:              # outermost activation: no double count
            stats["incl"] += node[INCL]
        if node[CALLS]:
            stats["max_depth"] = max(stats["max_depth"], node[DEPTH])
            stats["max_recursion"] = max(stats["max_recursion"], active[fid] + 1)
        if node[CHILDREN] is not tree.overflow:   # flat "[truncated]" nodes have no subtree
            active[fid] += 1
            pending.append((node, True))
            pending.extend((n, False) for n in node[CHILDREN].values())
    analysis.functions = {}
    for fid, name in enumerate(names):
        s = per_fid[fid]
        analysis.functions[name] = dict(
            calls=s["calls"], completed=s["completed"], unwound=s["unwound"], open=s["open"],
            incl_ns=analysis.ns(s["incl"]), excl_ns=analysis.ns(s["excl"]),
            max_depth=s["max_depth"], max_recursion=s["max_recursion"])
    root = tree.root
    threads = analysis.threads.values()
    root[CALLS] = len(analysis.threads)
    root[INCL] = sum(th.last_tsc - th.first_tsc for th in threads)
    root[EXCL] = sum(th.outside_ticks for th in threads)
    truncated_calls = sum(n[CALLS] for n in tree.overflow.values())
    records = sum(th.records for th in threads)
    analysis.counters = dict(
        records=records, entries=sum(th.entries for th in threads),
        exits=sum(th.exits for th in threads), threads=len(analysis.threads),
        completed_frames=sum(s["completed"] for s in per_fid),
        unmatched_exits=sum(th.unmatched_exits for th in threads),
        unwound_frames=sum(th.unwound_frames for th in threads),
        open_frames=sum(th.open_frames for th in threads),
        tree_nodes=tree.node_count, max_tree_nodes=tree.max_nodes,
        tree_truncated=tree.truncated, truncated_calls=truncated_calls,
        span_ns=analysis.ns(root[INCL]), outside_ns=analysis.ns(root[EXCL]))


def analyze_calls(directory: str, *, chunk_records: int = DEFAULT_CHUNK_RECORDS,
                  max_nodes: int = DEFAULT_MAX_NODES) -> CallAnalysis:
    """Read the trace directory and rebuild its calls (see the module docstring)."""
    tables = load_tables(directory)
    tree = CallTree(max_nodes)
    analysis = CallAnalysis(directory=directory, timestamps=tables.timestamps,
                            tsc_hz=tables.tsc_hz, names=tables.names, tree=tree, threads={})
    for tid, path in thread_files(directory):
        analysis.threads[tid] = ThreadReplay(tid, tables, tree).replay_file(path, chunk_records)
    _aggregate(analysis)
    return analysis


def thread_dict(analysis: CallAnalysis, totals: ThreadTotals) -> dict:
    return {"records": totals.records, "entries": totals.entries, "exits": totals.exits,
            "unmatched_exits": totals.unmatched_exits, "unwound_frames": totals.unwound_frames,
            "open_frames": totals.open_frames,
            "span_ns": analysis.ns(totals.last_tsc - totals.first_tsc),
            "outside_ns": analysis.ns(totals.outside_ticks)}
