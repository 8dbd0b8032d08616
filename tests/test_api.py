# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace's Python API: ``madtrace.open(DIR)`` (madtrace/api.py, docs/api.md).

Contract exercised:
  t = madtrace.open(DIR); t.events / records / calls / accesses / allocations /
  sites (DuckDB relations), t.view(NAME), t.views(), t.sql(SQL), t.meta,
  t.kinds(), t.report(KIND, **options), t.close() and ``with``

Oracles: the command line on the same trace directories: ``madtrace query DIR
SQL --json`` for every view, ``madtrace report DIR --kind K --json [--top N
--depth D]`` for every kind with a JSON form (parsed with json.loads), the
error classes the commands exit with (their exit codes), and ``sys.modules`` of
a fresh interpreter for what the API imports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import madtrace
from madtrace import api
from madtrace.errors import CorruptTraceError, NoDataError, QueryError, UsageError
from madtrace.kinds import KINDS
from madtrace.report.json_out import write_json

from .util import ROOT, madtrace as madtrace_cli, prog, report_json

# the tracer's side: none of it may be imported by reading a trace
TRACER_MODULES = (
    "ptrace",
    "capstone",
    "lief",
    "madtrace.process",
    "madtrace.calls",
    "madtrace.data",
    "madtrace.recording",
    "madtrace.live",
    "madtrace.daemon",
    "madtrace.target",
    "madtrace.rings",
    "madtrace.arch",
    "madtrace.cli",
)
# every report kind with a JSON form, those added later included (data_calls has their input)
JSON_KINDS = [k.name for k in KINDS.values() if k.json is not None and not k.text_only]


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Three trace directories recorded once: ``both`` (data_calls with --data: calls,
    accesses, heap blocks), ``calls`` (calls_recursion, no --data) and ``data``
    (data_globals with --data --no-functions)."""
    base = tmp_path_factory.mktemp("api")
    runs = {
        "both": ("--data", "--", prog("data_calls", "O0-pie"), "300"),
        "calls": ("--", prog("calls_recursion", "O0-pie")),
        "data": ("--data", "--no-functions", "--", prog("data_globals", "O0-pie")),
    }
    found = {}
    for name, argv in runs.items():
        out = str(base / name)
        result = madtrace_cli("record", "-q", "-o", out, *argv)
        assert result.returncode == 0, result.stderr.decode()
        found[name] = out
    return found


@pytest.fixture(scope="module")
def both(traces):
    with madtrace.open(traces["both"], progress=False) as t:
        yield t


def cli_query(directory: str, sql: str) -> list[dict]:
    result = madtrace_cli("query", directory, sql, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


@contextlib.contextmanager
def deep_values():
    """Comparing call trees thousands of levels deep needs a higher recursion limit."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def as_cli_rows(relation) -> list[dict]:
    """Rows of a relation as ``query --json`` prints them (json.dumps of each value)."""
    columns = relation.columns
    return [json.loads(json.dumps(dict(zip(columns, row)))) for row in relation.fetchall()]


# ------------------------------------------------------------------ views
def test_view_names_are_those_of_the_query_command():
    from madtrace.cli.cmd_query import VIEW_NAMES

    assert tuple(api.VIEWS) == VIEW_NAMES


@pytest.mark.parametrize("view", list(api.VIEWS))
def test_each_view_holds_what_query_prints(both, traces, view):
    sql = f"SELECT * FROM {view} ORDER BY ALL"
    expected = cli_query(traces["both"], sql)
    assert expected, f"the {view} view of data_calls is empty"
    relation = getattr(both, view)
    assert as_cli_rows(relation.query("v", "SELECT * FROM v ORDER BY ALL")) == expected
    assert as_cli_rows(both.sql(sql)) == expected
    assert both.view(view).columns == relation.columns == list(expected[0])


def test_sql_results_in_every_form_duckdb_gives(both, traces):
    sql = "SELECT function, count(*) AS n, sum(size) AS bytes FROM accesses GROUP BY ALL ORDER BY n DESC, function"
    expected = cli_query(traces["both"], sql)
    assert as_cli_rows(both.sql(sql)) == expected
    count = both.sql("SELECT count(*) FROM accesses").fetchall()[0][0]
    assert count == cli_query(traces["both"], "SELECT count(*) AS n FROM accesses")[0]["n"] > 0
    assert both.accesses.to_arrow_table().num_rows == count
    assert both.sql("SELECT * FROM accesses").to_arrow_table().num_rows == count
    params = both.sql("SELECT count(*) FROM accesses WHERE kind = $1", params=["S"]).fetchall()[0][0]
    assert params == both.accesses.filter("kind = 'S'").count("*").fetchall()[0][0] > 0


def test_df_and_pl_rows(both):
    count = both.sql("SELECT count(*) FROM accesses").fetchall()[0][0]
    pytest.importorskip("pandas")
    assert len(both.accesses.df()) == count
    assert len(both.sql("SELECT * FROM events").df()) == both.events.count("*").fetchall()[0][0]
    pytest.importorskip("polars")
    assert len(both.accesses.pl()) == count


def test_views_present_and_a_view_the_trace_lacks(traces):
    with madtrace.open(traces["both"], progress=False) as t:
        assert t.views() == list(api.VIEWS)
    with madtrace.open(traces["calls"], progress=False) as t:
        assert t.views() == ["events", "records", "calls", "sites"]
        for view in ("accesses", "allocations"):
            with pytest.raises(NoDataError, match=f"no data accesses: the {view} view needs .*--data"):
                getattr(t, view)
        assert t.events.count("*").fetchall()[0][0] > 0
        # SQL sees every view: the lacking ones empty, as with madtrace query
        assert t.sql("SELECT count(*) FROM accesses").fetchall()[0][0] == 0
    with madtrace.open(traces["data"], progress=False) as t:
        assert t.views() == ["events", "accesses", "allocations"]
        for view in ("calls", "records", "sites"):
            with pytest.raises(NoDataError, match=f"no call records: the {view} view"):
                t.view(view)
        assert t.accesses.count("*").fetchall()[0][0] > 0


def test_the_store_is_built_on_first_use_with_its_messages(traces, tmp_path, capfd):
    import shutil

    directory = str(tmp_path / "copy")
    shutil.copytree(traces["calls"], directory, ignore=shutil.ignore_patterns("store"))
    capfd.readouterr()
    t = madtrace.open(directory)
    assert not os.path.exists(os.path.join(directory, "store"))  # not before a view is asked for
    assert t.sites.count("*").fetchall()[0][0] > 0
    assert "building the store" in capfd.readouterr().err
    t.close()


def test_meta_close_and_with(traces):
    with madtrace.open(traces["both"], progress=False) as t:
        assert t.meta["command"] == [prog("data_calls", "O0-pie"), "300"]
        assert t.meta["calls"]["bump"] == 300
        relation = t.calls
        assert not t.closed
    assert t.closed
    with pytest.raises(ValueError, match="closed"):
        _ = t.accesses
    with pytest.raises(ValueError, match="closed"):
        t.report("heatmap")
    with pytest.raises(Exception):  # noqa: B017  DuckDB's own: its connection is closed
        relation.fetchall()
    t.close()  # twice: nothing


def test_errors_are_those_of_the_commands(traces, both, tmp_path):
    missing = str(tmp_path / "missing")
    assert madtrace_cli("query", missing, "SELECT 1").returncode == CorruptTraceError.exit_code
    with pytest.raises(CorruptTraceError, match="no such trace directory"):
        madtrace.open(missing)
    with pytest.raises(CorruptTraceError, match="not a madtrace trace directory"):
        madtrace.open(str(tmp_path))
    assert madtrace_cli("query", traces["both"], "SELEC 1").returncode == QueryError.exit_code
    with pytest.raises(QueryError, match="query failed: Parser Error"):
        both.sql("SELEC 1")
    with pytest.raises(QueryError, match="nosuchcolumn"):
        both.sql("SELECT nosuchcolumn FROM calls")
    with pytest.raises(UsageError, match="no view 'nope'"):
        both.view("nope")


# ---------------------------------------------------------------- reports
def test_kinds_are_the_json_kinds_of_the_registry(traces, both):
    assert both.kinds() == JSON_KINDS
    assert {"calls", "heatmap", "alloc", "source"} <= set(both.kinds(available=True))
    with madtrace.open(traces["calls"], progress=False) as t:
        assert t.kinds(available=True) == [k for k in JSON_KINDS if "accesses" not in KINDS[k].needs]


@pytest.mark.parametrize("kind", JSON_KINDS)
def test_report_is_what_report_json_prints(traces, both, kind):
    value = both.report(kind)
    with deep_values():
        assert value == report_json(traces["both"], "--kind", kind)


def test_report_options_are_the_commands(traces, both):
    assert both.report("calls", top=2, depth=1) == report_json(
        traces["both"], "--kind", "calls", "--top", "2", "--depth", "1"
    )
    assert both.report("footprint", top=3) == report_json(traces["both"], "--kind", "footprint", "--top", "3")
    if "cache" in KINDS:
        assert both.report("cache", cache="L1=4K:4:64") == report_json(
            traces["both"], "--kind", "cache", "--cache", "L1=4K:4:64"
        )
    if "sharing" in KINDS:
        assert both.report("sharing", line=128) == report_json(
            traces["both"], "--kind", "sharing", "--line", "128"
        )


def test_report_all(traces):
    with madtrace.open(traces["calls"], progress=False) as t:
        value = t.report("all")
    assert list(value["reports"]) == ["calls"]
    with deep_values():
        assert value == report_json(traces["calls"], "--kind", "all")


def test_report_options_follow_the_report_command():
    """Every option of ``madtrace report`` is one a report takes (or one --json fixes)."""
    from madtrace.cli import cmd_report

    parser = argparse.ArgumentParser()
    cmd_report.add_arguments(parser)
    defaults = vars(parser.parse_args(["DIR"]))
    for option in set(defaults) - {"directory", "kind"}:
        assert option in api.REPORT_OPTIONS or option in ("json", "png", "html", "force"), option
        if option in api.REPORT_OPTIONS:
            assert api.REPORT_OPTIONS[option] == defaults[option], option


def test_report_errors(traces, both):
    with pytest.raises(UsageError, match="no report kind 'nope': the kinds are calls, .*all"):
        both.report("nope")
    result = madtrace_cli("report", traces["both"], "--kind", "segments", "--json")
    assert result.returncode == UsageError.exit_code
    with pytest.raises(UsageError, match="segments is a text listing"):
        both.report("segments")
    with pytest.raises(TypeError, match="unknown option.* bogus: the options are top, depth, topology"):
        both.report("calls", bogus=1)
    with pytest.raises(UsageError, match="top must be >= 1"):
        both.report("calls", top=0)
    with pytest.raises(TypeError, match="top must be an int"):
        both.report("calls", top="3")
    with pytest.raises(UsageError, match="topology is for the report kind numa"):
        both.report("heatmap", topology="x.json")
    assert (
        madtrace_cli("report", traces["calls"], "--kind", "heatmap", "--json").returncode
        == NoDataError.exit_code
    )
    with madtrace.open(traces["calls"], progress=False) as t:
        with pytest.raises(NoDataError, match="no data accesses"):
            t.report("heatmap")


def test_plain_json_is_what_write_json_gives_back():
    value = {
        "n": np.int64(3),
        "x": np.float64(0.5),
        7: (1, [np.uint8(2), None]),
        "b": np.bool_(True),
        "a": np.arange(3),
        "s": "é",
        "f": float("inf"),
        "t": True,
    }
    parts: list[str] = []
    write_json(api._plain_json(value), parts.append)
    plain = api._plain_json(value)
    assert plain == json.loads("".join(parts))
    assert plain == {
        "n": 3,
        "x": 0.5,
        "7": [1, [2, None]],
        "b": True,
        "a": [0, 1, 2],
        "s": "é",
        "f": float("inf"),
        "t": True,
    }
    assert type(plain["n"]) is int and type(plain["x"]) is float and type(plain["b"]) is bool
    deep: dict = {}
    node = deep
    for _ in range(20000):  # a call tree this deep: no recursion
        node["children"] = [{}]
        node = node["children"][0]
    assert api._plain_json(deep) is not deep
    with pytest.raises(TypeError):
        api._plain_json({"x": object()})


# ------------------------------------------------------------- what it imports
def test_import_madtrace_is_light_and_reading_imports_nothing_of_the_tracer(traces):
    code = f"""
import sys
import madtrace
assert madtrace.__version__
light = [m for m in ("madtrace.api", "madtrace.kinds", "duckdb", "numpy") if m in sys.modules]
assert not light, light
assert "open" in dir(madtrace)
with madtrace.open({traces["both"]!r}, progress=False) as t:
    assert t.accesses.count("*").fetchall()[0][0] > 0
    t.sql("SELECT function, count(*) FROM calls GROUP BY ALL").fetchall()
    for kind in ("heatmap", "alloc", "source", "calls"):
        t.report(kind)
tracer = {TRACER_MODULES!r}
print(sorted(m for m in sys.modules if m.startswith(tracer)))
"""
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
