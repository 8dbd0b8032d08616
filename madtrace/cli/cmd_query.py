# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace query DIR "SQL" [--json]"""

from __future__ import annotations

import datetime
import decimal
import json
import sys

from ..errors import CorruptTraceError, QueryError
from ..trace.meta import read_meta

NAME = "query"
VIEW_NAMES = ("events", "records", "calls", "accesses", "allocations", "sites")
HELP = (f"run SQL (DuckDB) on a trace's store; views: {', '.join(VIEW_NAMES)} "
        "(rows as text, or a JSON list of objects with --json)")
BATCH = 10_000
WIDTH_ROWS = 200        # text output: column widths from the first rows


def add_arguments(parser) -> None:
    parser.add_argument("directory", help="trace directory written by madtrace record/attach")
    parser.add_argument("sql", help='the query, e.g. "SELECT function, count(*) FROM calls '
                                    'GROUP BY ALL ORDER BY 2 DESC"')
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")


def _plain(value):
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _text(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(_plain(value))


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def query_error(directory, exc):
    """QueryError for the query's own mistakes; CorruptTraceError when a store file
    turned out unreadable halfway through (its footer was fine when connecting)."""
    import duckdb
    if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)) and ".parquet" in str(exc):
        where = directory or "the trace directory"
        return CorruptTraceError(f"the store of {where} is corrupt ({_first_line(exc)}): remove "
                                 f"its store/ folder and it is rebuilt from the trace files")
    return QueryError(f"query failed: {_first_line(exc)}")


def run_query(directory: str, sql: str):
    """(column names, cursor) of ``sql`` on the store of ``directory``."""
    import duckdb
    from ..trace.query import connect
    read_meta(directory)          # a clear error for anything but a trace directory
    con = connect(directory, sys.stderr)
    try:
        cursor = con.execute(sql)
    except duckdb.Error as exc:
        raise query_error(directory, exc) from None
    columns = [d[0] for d in cursor.description] if cursor.description else []
    return columns, cursor


def _batches(cursor):
    import duckdb
    while True:
        try:
            rows = cursor.fetchmany(BATCH)
        except duckdb.Error as exc:
            raise query_error(None, exc) from None
        if not rows:
            return
        yield rows


def run(args) -> int:
    columns, cursor = run_query(args.directory, args.sql)
    write = sys.stdout.write
    if args.json:
        write("[")
        first = True
        for rows in _batches(cursor):
            for row in rows:
                write(("" if first else ",\n") +
                      json.dumps(dict(zip(columns, (_plain(v) for v in row)))))
                first = False
        write("]\n")
        return 0
    if not columns:
        return 0
    widths = None
    for rows in _batches(cursor):
        cells = [[_text(v) for v in row] for row in rows]
        if widths is None:
            widths = [max([len(c)] + [len(r[i]) for r in cells[:WIDTH_ROWS]])
                      for i, c in enumerate(columns)]
            write("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip() + "\n")
        for r in cells:
            write("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() + "\n")
    if widths is None:
        write("  ".join(columns) + "\n")
    return 0
