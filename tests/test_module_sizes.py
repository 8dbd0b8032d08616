"""The project's rule, checked by a tool rather than by memory: every Python module
of madtrace stays under 600 lines (split it by what its parts are about)."""

from __future__ import annotations

from pathlib import Path

from .util import ROOT

LIMIT = 600


def test_every_module_stays_under_600_lines():
    sizes = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for path in Path(ROOT, "madtrace").rglob("*.py")}
    assert sizes, "no module found"
    assert {name: n for name, n in sizes.items() if n >= LIMIT} == {}
