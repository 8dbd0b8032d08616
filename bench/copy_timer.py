# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace's command line with the hybrid engine's function copier timed.

``python bench/copy_timer.py OUT.json ARGS...`` runs ``madtrace ARGS...``
(whichever madtrace this python imports: run it with another tree's venv to
time that tree) and writes to OUT.json the seconds spent in the rewriter's
``copy_function`` and, where it exists, ``analyse`` (the calls the rewriter
makes, one clock read around each), and the number of copies.  Used by
bench/bench_copier.py ``--record``.
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
import time

import madtrace.data.hybrid.rewriting as rewriting

OUT = sys.argv.pop(1)
SPENT = {"copy_function": 0.0, "analyse": 0.0, "copy_function_cpu": 0.0, "analyse_cpu": 0.0,
         "gc": 0.0, "copies": 0}
_inside = [0]
_gc_start = [0.0]


def _timed(name: str, function):
    def timed(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        _inside[0] += 1
        try:
            return function(*args, **kwargs)
        finally:
            _inside[0] -= 1
            SPENT[name] += time.perf_counter() - t0
            SPENT[name + "_cpu"] += time.thread_time() - c0
            if name == "copy_function":
                SPENT["copies"] += 1
    return timed


def _collecting(phase: str, _info: dict) -> None:
    if not _inside[0]:
        return
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        SPENT["gc"] += time.perf_counter() - _gc_start[0]


gc.callbacks.append(_collecting)


rewriting.copy_function = _timed("copy_function", rewriting.copy_function)
if hasattr(rewriting, "analyse"):
    rewriting.analyse = _timed("analyse", rewriting.analyse)


@atexit.register
def _write() -> None:
    with open(OUT, "w") as f:
        json.dump(SPENT, f)


from madtrace.cli.main import main  # noqa: E402

sys.exit(main())
