# SPDX-License-Identifier: GPL-2.0-or-later
"""The formats of ``madtrace export``: one module per format, found at import.

Each module of this package defines ``EXPORT``, an :class:`Export`: its name,
its phrase in the help text, its own options and ``write(args)``, which
writes the trace ``args.directory`` in that format to ``args.output`` (a
file, or a directory for table formats) or stdout.  ``export --format`` and
the help text come from ``FORMATS``: adding a format is one module here
plus its test.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import OutputExistsError, writing


@dataclass(frozen=True)
class Export:
    name: str
    help: str  # its phrase in `export --help` (joined by "; ", or
    order: int  # by " " when it starts with "or ")
    write: Callable[[Any], int]  # (args) -> exit status
    add_arguments: Callable[[Any], None] | None = None


def _discover() -> dict[str, Export]:
    found = []
    for module in pkgutil.iter_modules(__path__):
        export = getattr(importlib.import_module(f"{__name__}.{module.name}"), "EXPORT", None)
        if isinstance(export, Export):
            found.append(export)
    return {e.name: e for e in sorted(found, key=lambda e: (e.order, e.name))}


def help_text() -> str:
    text = ""
    for export in FORMATS.values():
        text += (" " if export.help.startswith("or ") else "; ") + export.help if text else export.help
    return text


def check_output(path: str, force: bool) -> None:
    if os.path.lexists(path) and not force:
        raise OutputExistsError(f"{path} already exists (use --force to overwrite it)")


def write_lines(args, lines) -> int:
    """``lines`` to ``args.output`` (never over an existing file without
    --force) or stdout, one a line."""
    if args.output:
        if os.path.exists(args.output) and not args.force:
            raise OutputExistsError(f"{args.output} already exists (use --force to overwrite it)")
        with writing(args.output), open(args.output, "w") as out:
            for line in lines:
                out.write(line + "\n")
    else:
        import sys

        write = sys.stdout.write
        for line in lines:
            write(line + "\n")
    return 0


FORMATS: dict[str, Export] = _discover()  # last: the format modules import the helpers above
