# SPDX-License-Identifier: GPL-2.0-or-later
"""export --format parquet: the store, one Parquet file per table (trace/query.py)."""

from __future__ import annotations

import sys

from ..errors import UsageError, writing
from . import Export, check_output


def _write(args) -> int:
    from ..trace.query import copy_store

    if not args.output:
        raise UsageError("--format parquet writes a directory: give it with -o DIR")
    check_output(args.output, args.force)
    with writing(args.output):
        copy_store(args.directory, args.output, sys.stderr)
    return 0


EXPORT = Export(name="parquet", help="its store as one Parquet file per table", order=3, write=_write)
