# SPDX-License-Identifier: GPL-2.0-or-later
"""One pass over the accesses shared by the report kinds (analysis/shared_pass.py).

Contract exercised:
  madtrace report DIR --kind all --json   (the kinds with a part: one pass)
  madtrace report DIR --kind K --json     (each kind alone)
  madtrace report DIR --html FILE

A report of several kinds gives each kind exactly what it gives alone, on a
trace of one thread (every kind of the page in the pass, the cache
simulation too) and of several (the NUMA first touches found before the
pass; the cache merges the threads in a pass of its own).
"""

from __future__ import annotations

import json
from functools import lru_cache

import pytest

from .util import madtrace, prog, report_json

TRACES = {"one thread": ("data_alloc", "O0-nopie"), "threads": ("data_threads", "O2-pie")}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    base = tmp_path_factory.mktemp("shared-pass")

    @lru_cache(maxsize=None)
    def record(name: str, variant: str) -> str:
        out = str(base / f"{name}-{variant}")
        result = madtrace("record", "-q", "--data", "-o", out, "--", prog(name, variant), timeout=300)
        assert result.returncode == 0, result.stderr
        return out

    return record


@pytest.mark.parametrize("trace", sorted(TRACES))
def test_every_kind_of_a_report_equals_the_kind_alone(recorded, trace, tmp_path):
    directory = recorded(*TRACES[trace])
    together = report_json(directory, "--kind", "all")["reports"]
    kinds = {"heatmap", "alloc", "numa", "source", "cache", "sharing", "reuse"}
    assert kinds <= set(together)
    for kind in sorted(kinds):
        alone = report_json(directory, "--kind", kind)
        assert json.dumps(together[kind], sort_keys=True) == json.dumps(alone, sort_keys=True), kind
    page = tmp_path / "page.html"
    result = madtrace("report", directory, "--html", str(page))
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    for kind in kinds - {"sharing"}:
        assert f'id="kind-{kind}"' in text, kind
