# SPDX-License-Identifier: GPL-2.0-or-later
"""The kinds of ``madtrace report``: one module per kind, found at import.

Each module of this package defines ``KIND``, a :class:`Kind`: its name and
help phrase, what it needs from a trace (for ``report all``; asked for by
name, the analysis itself raises NoDataError, exit 24, when the trace lacks
it), how it is computed and each of its renderings (text, JSON, PNG, an
HTML section; None: not offered).  ``report --kind``, ``report all``, the
HTML page, the ``--png`` list and the help text all come from ``KINDS``, so
adding a kind is one module here plus its test.

A kind that reads every access can also give a ``part`` of one pass shared
with the other kinds of the report (analysis/shared_pass.py): ``compute``
computes several kinds with one pass over the accesses.

Three orders, each as madtrace has always printed them: ``order`` (help
text and ``--kind`` choices), ``all_order`` (``report all``: text and JSON;
None: not part of it) and ``html_order`` (sections of the page).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from ..trace.record_files import ACCESS_RECORDS
from ..trace.format import FUNCTIONS_FILE, NUMA_FILE

# what a kind can need from a trace directory, and how to tell it is there
NEEDS: dict[str, Callable[[str], bool]] = {
    "calls": lambda d: os.path.exists(os.path.join(d, FUNCTIONS_FILE)),
    "accesses": lambda d: bool(ACCESS_RECORDS.files(d)),
    "numa": lambda d: os.path.exists(os.path.join(d, NUMA_FILE)),
}


@dataclass(frozen=True)
class Kind:
    name: str
    help: str  # the phrase in `report --help`
    order: int
    needs: tuple[str, ...]  # keys of NEEDS
    compute: Callable[[str, Any], Any]  # (directory, args) -> result
    text: Callable[[Any, int, Any, Any], None]  # (result, top, args, out)
    json: Callable[[Any, Any], dict] | None = None  # (result, args) -> a JSON value
    png: Callable[[Any, str], Any] | None = None  # (result, path)
    html: Callable[[Any], str] | None = None  # (result) -> a section
    all_order: int | None = None
    html_order: int | None = None
    html_with_accesses: bool = False  # a section of every page that shows a kind of accesses
    default_top: int = 20  # rows per text table
    text_only: str | None = None  # a listing: the error for --json/--png/--html
    # (directory, args) -> its analysis/shared_pass.Part (None: computed alone)
    part: Callable[[str, Any], Any] | None = None


def _discover() -> dict[str, Kind]:
    found = []
    for module in pkgutil.iter_modules(__path__):
        kind = getattr(importlib.import_module(f"{__name__}.{module.name}"), "KIND", None)
        if isinstance(kind, Kind):
            found.append(kind)
    return {k.name: k for k in sorted(found, key=lambda k: (k.order, k.name))}


KINDS: dict[str, Kind] = _discover()


def available(directory: str) -> list[Kind]:
    """The kinds ``report all`` covers: those whose inputs the trace has."""
    have = {need for need, present in NEEDS.items() if present(directory)}
    kinds = [k for k in KINDS.values() if k.all_order is not None and set(k.needs) <= have]
    return sorted(kinds, key=lambda k: k.all_order or 0)


def html_sections(kinds: list[Kind]) -> list[Kind]:
    """The sections of the HTML page of a report of ``kinds``, in page order."""
    accesses = any("accesses" in k.needs for k in kinds)
    shown = [
        k
        for k in KINDS.values()
        if k.html is not None
        and k.html_order is not None
        and (k in kinds or (k.html_with_accesses and accesses))
    ]
    return sorted(shown, key=lambda k: k.html_order or 0)


def compute(kinds: list[Kind], directory: str, args) -> dict[str, Any]:
    """The result of each of ``kinds``, in order (its errors first): those that
    give a part, from one pass over the accesses; the others each alone."""
    results: dict[str, Any] = {}
    parts: dict[str, Any] = {}
    for kind in kinds:
        part = kind.part(directory, args) if kind.part is not None else None
        if part is None:
            results[kind.name] = kind.compute(directory, args)
        else:
            parts[kind.name] = part
    if parts:
        from ..analysis.shared_pass import run_parts

        results.update(zip(parts, run_parts(directory, list(parts.values()))))
    return {kind.name: results[kind.name] for kind in kinds}
