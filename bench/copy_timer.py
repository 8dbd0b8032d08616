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
import json
import sys
import time

import madtrace.capture.rewriting as rewriting

OUT = sys.argv.pop(1)
SPENT = {"copy_function": 0.0, "analyse": 0.0, "copies": 0}


def _timed(name: str, function):
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - t0
            if name == "copy_function":
                SPENT["copies"] += 1
    return timed


rewriting.copy_function = _timed("copy_function", rewriting.copy_function)
if hasattr(rewriting, "analyse"):
    rewriting.analyse = _timed("analyse", rewriting.analyse)


@atexit.register
def _write() -> None:
    with open(OUT, "w") as f:
        json.dump(SPENT, f)


from madtrace.cli.main import main  # noqa: E402

sys.exit(main())
