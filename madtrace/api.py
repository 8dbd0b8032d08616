# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace's Python API: a trace directory opened for analysis (docs/api.md).

``madtrace.open(DIR)`` returns a :class:`Trace`:

* the views of the store as DuckDB relations (``t.accesses``, ``t.calls``,
  ``t.events``, ``t.records``, ``t.allocations``, ``t.sites``) and ``t.sql(...)``,
  on the connection ``madtrace query`` uses (trace/query.py; the store is built
  on first use);
* ``t.report(KIND, **options)``: the value ``madtrace report DIR --kind KIND
  --json`` prints, as plain Python (the kinds registry, kinds/);
* ``t.meta``: meta.json.

Only the offline side is imported (trace format, store, analyses, reports): none
of the tracer (ptrace, the process, the engines), so scripts and notebooks that
read traces start fast, on machines that cannot trace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO, Union

from .errors import CorruptTraceError, MadtraceError, NoDataError, QueryError, UsageError
from .kinds import KINDS, NEEDS, Kind, available, compute
from .trace.meta import read_meta

if TYPE_CHECKING:
    import duckdb

# the views of ``madtrace query`` (its VIEW_NAMES) -> what the trace must have for
# them (any of; keys of kinds.NEEDS): a view the trace lacks raises NoDataError
VIEWS: dict[str, tuple[str, ...]] = {
    "events": ("calls", "accesses"),
    "records": ("calls",),
    "calls": ("calls",),
    "accesses": ("accesses",),
    "allocations": ("accesses",),
    "sites": ("calls",),
}
_WHAT = {  # need -> (what the trace lacks, how it is recorded)
    "calls": ("call records", "function tracing (not --no-functions)"),
    "accesses": ("data accesses", "--data"),
}

# the options of ``madtrace report`` a report takes, with their defaults (None: the
# command's default; with --json, --top and --depth default to everything)
REPORT_OPTIONS: dict[str, Any] = {"top": None, "depth": None, "topology": None, "cache": None, "line": None}
# what ``report --json`` sets and a report here cannot change
_FIXED_OPTIONS: dict[str, Any] = {"json": True, "png": None, "html": None, "force": False}

Progress = Union[bool, TextIO, None]


def open(directory: str | os.PathLike[str], *, progress: Progress = True) -> Trace:
    """The trace directory ``directory`` (written by ``madtrace record`` or
    ``attach``), opened.  CorruptTraceError for anything but a trace directory.
    ``progress``: where the messages of the store's build go (True: stderr;
    False or None: nowhere; or a text stream)."""
    return Trace(directory, progress=progress)


class Trace:
    """A trace directory.  Views and ``sql`` share one DuckDB connection, made on
    first use (the store is built then if the trace has none); ``close()`` or a
    ``with`` block ends it."""

    def __init__(self, directory: str | os.PathLike[str], *, progress: Progress = True):
        self.directory = os.fspath(directory)
        self.meta: dict = read_meta(self.directory)  # CorruptTraceError: not a trace directory
        self._progress = progress
        self._connection: duckdb.DuckDBPyConnection | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<madtrace.Trace {self.directory!r} ({state})>"

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """End the DuckDB connection (relations taken from it stop working)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------- the store
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection on the store (built first if needed), with every
        view of docs/sql.md."""
        self._check_open()
        if self._connection is None:
            from .trace.query import connect

            self._connection = connect(self.directory, self._progress_out())
        return self._connection

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the trace {self.directory} is closed")

    def _progress_out(self) -> TextIO | None:
        if self._progress is True:
            return sys.stderr
        if self._progress is False or self._progress is None:
            return None
        return self._progress

    def _has(self, need: str) -> bool:
        if need == "accesses" and "data_tracing" in self.meta:  # --data, even with no access
            return True
        return NEEDS[need](self.directory)

    def views(self) -> list[str]:
        """The views this trace has the data for, among those of ``madtrace query``."""
        return [name for name, needs in VIEWS.items() if any(self._has(n) for n in needs)]

    def view(self, name: str) -> duckdb.DuckDBPyRelation:
        """One view of the store as a DuckDB relation; NoDataError when the trace
        lacks its data (``accesses`` of a trace recorded without --data)."""
        if name not in VIEWS:
            raise UsageError(f"no view {name!r}: the views are {', '.join(VIEWS)}")
        self._check_open()
        needs = VIEWS[name]
        if not any(self._has(n) for n in needs):
            what, how = _WHAT[needs[0]]
            raise NoDataError(
                f"{self.directory} has no {what}: the {name} view needs a trace recorded with {how}"
            )
        return self.connection().view(name)

    @property
    def events(self) -> duckdb.DuckDBPyRelation:
        """Call records and accesses of each thread in exact order (ORDER BY tid, pos)."""
        return self.view("events")

    @property
    def records(self) -> duckdb.DuckDBPyRelation:
        """The call records."""
        return self.view("records")

    @property
    def calls(self) -> duckdb.DuckDBPyRelation:
        """One row per dynamic call (the report kind ``calls`` is ``report("calls")``)."""
        return self.view("calls")

    @property
    def accesses(self) -> duckdb.DuckDBPyRelation:
        """One row per data access, named."""
        return self.view("accesses")

    @property
    def allocations(self) -> duckdb.DuckDBPyRelation:
        """One row per heap block."""
        return self.view("allocations")

    @property
    def sites(self) -> duckdb.DuckDBPyRelation:
        """The call sites."""
        return self.view("sites")

    def sql(self, query: str, params: Any = None) -> duckdb.DuckDBPyRelation:
        """``query`` on the store (every view of docs/sql.md; those whose data the
        trace lacks are empty) as a DuckDB relation: ``.fetchall()``, ``.arrow()``,
        ``.df()`` (pandas), ``.pl()`` (polars)...  QueryError for a query DuckDB
        refuses (syntax, unknown column or view), its message included."""
        import duckdb

        con = self.connection()
        try:
            return con.sql(query, params=params)
        except duckdb.Error as exc:
            raise _query_error(self.directory, exc) from exc

    # --------------------------------------------------------------- reports
    def kinds(self, *, available: bool = False) -> list[str]:
        """The report kinds ``report`` computes (those with a JSON form, in the order
        of ``madtrace report --help``); ``available``: only those whose input this
        trace has."""
        return [
            k.name
            for k in KINDS.values()
            if _has_json(k) and (not available or all(self._has(n) for n in k.needs))
        ]

    def report(self, kind: str, **options: Any) -> Any:
        """What ``madtrace report DIR --kind KIND --json [--OPTION VALUE...]`` prints,
        parsed: plain dicts, lists, str, int, float, bool and None.  ``kind``: one of
        ``kinds()``, or ``"all"``; ``options``: those of REPORT_OPTIONS (``top=5``
        for ``--top 5``).  NoDataError when the trace lacks the kind's input."""
        self._check_open()
        args = self._report_args(kind, options)
        if kind != "all":
            spec = KINDS[kind]
            return _plain_json(_as_json(spec, spec.compute(self.directory, args), args))
        kinds = [k for k in available(self.directory) if _has_json(k)]
        if not kinds:
            raise NoDataError(f"{self.directory} has neither call records nor data accesses to report on")
        results = compute(kinds, self.directory, args)  # every error first; one pass over the accesses
        value = {
            "kind": "all",
            "directory": self.directory,
            "reports": {k.name: _as_json(k, results[k.name], args) for k in kinds},
        }
        return _plain_json(value)

    def _report_args(self, kind: str, options: dict[str, Any]) -> argparse.Namespace:
        if kind != "all" and kind not in KINDS:
            raise UsageError(f"no report kind {kind!r}: the kinds are {', '.join(KINDS)}, all")
        if kind != "all" and not _has_json(KINDS[kind]):
            spec = KINDS[kind]
            raise UsageError(spec.text_only or f"the report kind {kind} has no JSON form")
        unknown = sorted(set(options) - set(REPORT_OPTIONS))
        if unknown:
            raise TypeError(
                f"report() got unknown option(s) {', '.join(unknown)}: "
                f"the options are {', '.join(REPORT_OPTIONS)}"
            )
        for option, low in (("top", 1), ("depth", 0)):
            value = options.get(option)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"report(): {option} must be an int, not {type(value).__name__}")
            if value < low:
                raise UsageError(f"{option} must be >= {low}")
        if options.get("topology") is not None and kind not in ("numa", "all"):
            raise UsageError("topology is for the report kind numa")
        values = dict(REPORT_OPTIONS, **options)
        return argparse.Namespace(directory=self.directory, kind=kind, **_FIXED_OPTIONS, **values)


def _has_json(kind: Kind) -> bool:
    return kind.json is not None and not kind.text_only


def _as_json(kind: Kind, result: Any, args: argparse.Namespace) -> Any:
    assert kind.json is not None  # _has_json: checked before
    return kind.json(result, args)


def _query_error(directory: str, exc: Exception) -> MadtraceError:
    """As ``madtrace query``: CorruptTraceError when a store file turned out
    unreadable, QueryError for the query's own mistakes."""
    import duckdb

    from .trace.query import first_line

    if isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)) and ".parquet" in str(exc):
        return CorruptTraceError(
            f"the store of {directory} is corrupt ({first_line(exc)}): remove "
            "its store/ folder and it is rebuilt from the trace files"
        )
    return QueryError(f"query failed: {first_line(exc)}")


# ------------------------------------------------------------- plain values
_PLAIN_LEAVES = (str, int, float, bool, type(None))


def _plain_json(value: Any) -> Any:
    """``value`` as ``json.loads`` reads what report/json_out.write_json writes of
    it (the CLI's --json): dicts with str keys, lists for lists and tuples, each
    leaf through json.dumps/loads; numpy scalars and arrays as their Python values.
    Without recursion: call trees can be thousands of levels deep."""
    root: list[Any] = [None]
    pending: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while pending:
        item, parent, slot = pending.pop()
        if isinstance(item, dict):
            entries = {str(k): v for k, v in item.items()}  # as json.loads: the last value of a key
            out: dict[str, Any] = dict.fromkeys(entries)
            parent[slot] = out
            pending.extend((v, out, k) for k, v in entries.items())
        elif isinstance(item, (list, tuple)):
            items: list[Any] = [None] * len(item)
            parent[slot] = items
            pending.extend((v, items, i) for i, v in enumerate(item))
        elif type(item) in _PLAIN_LEAVES:
            parent[slot] = item
        else:
            tolist = getattr(item, "tolist", None)  # numpy scalars and arrays
            if callable(tolist) and type(item).__module__ == "numpy":
                pending.append((tolist(), parent, slot))
            else:
                parent[slot] = json.loads(json.dumps(item))  # TypeError as the CLI's
    return root[0]
