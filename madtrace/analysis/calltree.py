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
low 32 bits still compares correctly.  The rules are implemented once, in
replay.c, and applied by segmentation.py; this module builds on its stream.

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

from dataclasses import dataclass, field

from ..trace.replay import EVENT_BEGIN, FATE_UNMATCHED
from ..trace.segmentation import iter_thread_chunks, load_tables

DEFAULT_CHUNK_RECORDS = 1 << 18
DEFAULT_MAX_NODES = 100_000
TRUNCATED_NAME = "[truncated]"
ROOT_NAME = "[root]"

# Tree nodes are lists (fast to update in the event loop):
# [calls, incl_ticks, excl_ticks, completed, unwound, open, children{fid: node}, fid, depth]
CALLS, INCL, EXCL, COMPLETED, UNWOUND, OPEN, CHILDREN, FID, DEPTH = range(9)
ROOT_FID, TRUNCATED_FID = -1, -2


def new_node(fid: int, depth: int, children: dict | None = None) -> list:
    return [0, 0, 0, 0, 0, 0, {} if children is None else children, fid, depth]


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


class ThreadBuilder:
    """Builds one thread's calls into the tree from its segmented stream (the
    SegmentChunks of that thread, in order).  A call's exclusive time is its
    inclusive time less its callees' (they nest inside it)."""

    def __init__(self, tid: int, tree: CallTree):
        self.tid = tid
        self.tree = tree
        # a root of its own (for the time outside traced frames) whose children
        # are the shared root's
        self.root = new_node(ROOT_FID, 0, tree.root[CHILDREN])
        self.nodes = [self.root]      # the open calls' nodes, innermost last
        self.starts = [0]

    def feed(self, events) -> None:
        tree_child = self.tree.child
        nodes, starts = self.nodes, self.starts
        push_node, push_start = nodes.append, starts.append
        pop_node, pop_start = nodes.pop, starts.pop
        top = nodes[-1]
        for typ, fid, tsc, fate in zip(events["type"].tolist(), events["fid"].tolist(),
                                       events["tsc"].tolist(), events["fate"].tolist()):
            if typ == EVENT_BEGIN:
                node = top[6].get(fid)                       # CHILDREN
                if node is None:
                    node = tree_child(top, fid)
                node[0] += 1                                 # CALLS
                push_node(node)
                push_start(tsc)
                top = node
            elif fate != FATE_UNMATCHED:                     # END (accesses are not read)
                node = pop_node()
                ticks = tsc - pop_start()
                node[1] += ticks                             # INCL
                node[2] += ticks                             # EXCL (callees taken off below)
                node[3 + fate] += 1                          # COMPLETED, UNWOUND or OPEN
                top = nodes[-1]
                top[2] -= ticks

    def totals(self, stats: dict) -> ThreadTotals:
        totals = ThreadTotals(self.tid, **{k: stats[k] for k in (
            "records", "entries", "exits", "unmatched_exits", "unwound_frames", "open_frames",
            "first_tsc", "last_tsc")})
        totals.outside_ticks = totals.last_tsc - totals.first_tsc + self.root[EXCL]
        return totals


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
    builder = None
    for chunk in iter_thread_chunks(directory, accesses=False, chunk_rows=chunk_records,
                                    tables=tables):
        if builder is None:
            builder = ThreadBuilder(chunk.tid, tree)
        builder.feed(chunk.events)
        if chunk.last:
            analysis.threads[chunk.tid] = builder.totals(chunk.stats)
            builder = None
    _aggregate(analysis)
    return analysis


def thread_dict(analysis: CallAnalysis, totals: ThreadTotals) -> dict:
    return {"records": totals.records, "entries": totals.entries, "exits": totals.exits,
            "unmatched_exits": totals.unmatched_exits, "unwound_frames": totals.unwound_frames,
            "open_frames": totals.open_frames,
            "span_ns": analysis.ns(totals.last_tsc - totals.first_tsc),
            "outside_ns": analysis.ns(totals.outside_ticks)}
