# SPDX-License-Identifier: GPL-2.0-or-later
"""The store read by Apache Spark, as docs/sql.md shows it (a trace that
outgrows one machine): Spark's own Parquet reader and partition discovery
(the tid column from the tid=<n> folders) give the same rows and the same
aggregates as DuckDB over the same files (madtrace query).

Oracle: DuckDB (trace/query.py) over the store of a recording of a
two-thread program with function and data tracing."""

from __future__ import annotations

import os
import shutil

import pyspark        # the test extra (make setup); Java: openjdk-17-jre-headless (apt)
import pytest

from madtrace.trace.query import ACCESSES_VIEW, connect

from .util import madtrace, prog


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("no Java runtime: make setup installs openjdk-17-jre-headless")
    session = (pyspark.sql.SparkSession.builder.master("local[1]").appName("madtrace-test")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.memory", "512m").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    directory = tmp_path_factory.mktemp("spark") / "t"
    result = madtrace("record", "-q", "--data", "-f", "worker", "-o", str(directory), "--",
                      prog("data_threads", "O0-nopie"), timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    connect(str(directory)).close()        # the store complete, as a user would have it
    return str(directory)


def test_spark_reads_the_store_as_duckdb_does(spark, trace):
    from pyspark.sql import functions
    con = connect(trace)
    store = os.path.join(trace, "store")
    # the lines of docs/sql.md: partition discovery gives the tid column, the view
    # joins the access rows with their names
    for table in ("access_rows", "access_instructions", "access_data", "functions"):
        spark.read.parquet(os.path.join(store, table)).createOrReplaceTempView(table)
    accesses = spark.sql(ACCESSES_VIEW.format(q="`"))
    assert "tid" in accesses.columns
    assert accesses.count() == con.execute("SELECT count(*) FROM accesses").fetchone()[0] > 0
    by_function = {r["function"]: r["count"] for r in
                   accesses.groupBy("function").count().collect()}
    assert by_function == dict(con.execute(
        "SELECT function::VARCHAR, count(*) FROM accesses GROUP BY 1").fetchall())
    per_thread = {(r["tid"], r["kind"]): r["count"] for r in
                  accesses.groupBy("tid", "kind").count().collect()}
    assert per_thread == {(t, k): n for t, k, n in con.execute(
        "SELECT tid, kind::VARCHAR, count(*) FROM accesses GROUP BY 1, 2").fetchall()}
    assert len({t for t, _ in per_thread}) >= 2          # the program's threads
    # the names the view joins in, and the offsets it computes
    by_data = {r["data"]: r["count"] for r in accesses.groupBy("data").count().collect()}
    assert by_data == dict(con.execute("SELECT data, count(*) FROM accesses GROUP BY 1").fetchall())
    assert len(by_data) > 1
    # calls: the same rows, and the same inclusive sums per function
    calls = spark.read.parquet(os.path.join(store, "calls"))
    sums = {r["function"]: (r["n"], r["incl"]) for r in calls.groupBy("function").agg(
        functions.count("*").alias("n"), functions.sum("accesses_incl").alias("incl")).collect()}
    assert sums == {f: (n, int(i)) for f, n, i in con.execute(
        "SELECT function::VARCHAR, count(*), sum(accesses_incl) FROM calls GROUP BY 1").fetchall()}
    assert sums["worker"][0] >= 2
    # global tables: one folder of files each
    blocks = spark.read.parquet(os.path.join(store, "allocations"))
    assert blocks.count() == con.execute("SELECT count(*) FROM allocations").fetchone()[0]
