# SPDX-License-Identifier: GPL-2.0-or-later
"""Instrumenting a live, attached target in short stops (the aim: the target
stopped <= 10 ms for tens of functions).

``stage(engine, patterns, stop_for)`` runs while the target runs (a live
command's ``prepare``) and does what ``install`` or ``add`` of ``patterns``
would, but the commit:

* the plan and the memory it needs in the target (the control block, a code
  area per module, ring blocks; for a first install, what the ring pool
  will need too) are made in a brief stop of their own, ``stop_for(work)``
  (every thread stopped for ``work``, then resumed), and only when there is
  something to map or an IFUNC to resolve (``needs_target``);
* the trampolines are written through the tracer's own mapping of the code
  areas: nothing in the target jumps to them before the patches exist.

The command's stop (``install``/``add`` of the same patterns: ``take``) then
registers the threads and writes the jumps: ``PatchSet.apply`` checks that
each function's code is still the code its trampoline was built from, and
that no thread is stopped inside it.  An exec, or a module unmapped, in
between drops what was staged (the engine's ``forget_*``).
"""

from __future__ import annotations

from ..native import load

REPORT_KEYS = ("patched", "skipped", "inexact")
IFUNC_SKIPPED = "IFUNC"           # plan.py's reason for an IFUNC it could not resolve


class Staged:
    """What ``stage`` prepared: the functions to patch and their trampolines."""

    def __init__(self, patterns: list[str]):
        self.patterns = list(patterns)
        # where the engine's report lists stood before (what ``add`` reports is after)
        self.report_from = {key: 0 for key in REPORT_KEYS}
        self.functions: list = []
        self.built: dict[int, object] = {}  # function id -> FunctionTracer.build's result


def stage(engine, patterns: list[str], stop_for, pool: bool) -> Staged:
    """See the module doc.  ``pool``: a first install maps the ring pool's needs too."""
    engine.staged = None
    first = engine.plan is None
    if first:
        load("libmtdrain.so", "the ring drain")    # (loading it was 0.9 ms of the stop)
        ahead = engine.make_plan(None, patterns)
        plan = None if _unresolved_ifunc(ahead) else ahead     # (planned in the stop)
        stop_for(lambda: engine.map_areas(patterns, pool=pool, plan=plan))
        staged = Staged(patterns)
        staged.functions = list(engine.plan.functions)
    else:
        staged = engine.plan_more(patterns, stop_for)
    for fn in staged.functions:
        staged.built[fn.fid] = engine.build(fn)
    if pool and engine.threads.pool is None:
        engine.threads.stage_hooks()        # the ring pool's hooks of fork and exec
    engine.staged = staged
    return staged


def take(engine, patterns: list[str]) -> Staged | None:
    """What was staged for ``patterns`` (once), or None."""
    staged, engine.staged = engine.staged, None
    if staged is None or staged.patterns != list(patterns):
        return None
    return staged


def needs_target(engine, patterns: list[str]) -> bool:
    """Whether adding ``patterns`` to a running engine needs a stopped thread: an
    IFUNC to resolve, or a code area without room for the new trampolines
    (counted as if every matching function were new)."""
    fresh = engine.make_plan(None, patterns)
    if _unresolved_ifunc(fresh):
        return True
    for module in {fn.module.name: fn.module for fn in fresh.functions}.values():
        need = engine.code_size(fresh, [fn for fn in fresh.functions if fn.module is module])
        area = engine.code_areas.get(module.name)
        if area is None or area.cursor + need + 16 > area.area.end:
            return True
    return False


def _unresolved_ifunc(plan) -> bool:
    return any(why.startswith(IFUNC_SKIPPED) for _, why in plan.skipped)
