# SPDX-License-Identifier: GPL-2.0-or-later
"""SQL over a trace's store with DuckDB (embedded, reads the Parquet files in
place, streams: memory does not grow with the trace).

``connect(directory)`` builds the store if needed (store_writer.ensure_store)
and returns a DuckDB connection with these views (docs/sql.md):

* ``records``     the call records: tid, pos, seq, tsc, code, rsp
* ``sites``       the call sites: site, function, kind, address, caller
* ``calls``       one row per dynamic call (columnar.py), plus duration_ns
* ``accesses``    one row per data access, named (columnar.py), plus
                  ``data`` (variable, else symbol+offset, else region+offset)
* ``allocations`` one row per heap block
* ``block_events`` MadT's Y/W/G events (memcpy, memset, system calls moving
                  traced memory), named like accesses (store_block_events.py);
                  ``pos``: that of the event that follows it in ``events``
* ``events``      records and accesses of each thread merged in exact order:
                  ``ORDER BY tid, pos`` (pos 0, 1, 2...); type 'entry'/'exit'
                  (records, with the site's function) or 'L'/'S' (accesses, with
                  the function of the innermost call)
"""

from __future__ import annotations

import os

from ..errors import CorruptTraceError
from .columnar import PER_THREAD, TABLES
from .record_files import ACCESS_RECORDS, CALL_RECORDS
from .format import read_store_meta, store_path
from .store_writer import ensure_store


def _source(directory: str, table: str) -> str:
    """read_parquet() of a table's files (per-thread tables: tid from the folders)."""
    folder = os.path.abspath(store_path(directory, table)).replace("'", "''")
    if table in PER_THREAD:
        return (f"read_parquet('{folder}/*/*.parquet', hive_partitioning = true, "
                "hive_types = {'tid': INTEGER})")
    return f"read_parquet('{folder}/*.parquet')"


# the accesses view: the access rows with the names of their ids (access_names.py);
# the same text for DuckDB and Spark SQL (``q``: the engine's identifier quote)
ACCESSES_VIEW = """
SELECT r.tid, r.pos, r.seq, r.{q}order{q}, r.call_id, f.function,
       CASE WHEN (r.flags & 1) <> 0 THEN 'S' ELSE 'L' END AS kind, r.addr, i.size, i.rip,
       i.instruction, d.symbol,
       CAST(r.addr AS BIGINT) - CAST(d.base AS BIGINT) AS {q}offset{q}, d.variable, d.region,
       d.block, d.freed, (r.flags & 2) <> 0 AS first,
       (r.flags & 4) <> 0 AS allocator, r.pos - r.seq AS access_index,
       coalesce(d.variable,
                concat(coalesce(d.symbol, d.region), '+',
                       CAST(CAST(r.addr AS BIGINT) - CAST(d.base AS BIGINT) AS STRING))) AS data
FROM access_rows r
JOIN access_instructions i ON i.iid = r.iid
JOIN access_data d ON d.did = r.did
LEFT JOIN functions f ON f.fid = r.fid"""


def connect(directory: str, out=None):
    """A DuckDB connection on the store of ``directory`` (built first if needed).  A
    store file that is not Parquet (overwritten, truncated) is met here: the store
    is rebuilt from the raw trace files once; then CorruptTraceError (exit 18)."""
    import duckdb
    try:
        return _connect(directory, out)
    except duckdb.Error as exc:
        if not (CALL_RECORDS.files(directory) or ACCESS_RECORDS.files(directory)):
            raise CorruptTraceError(f"the store of {directory} is corrupt ({first_line(exc)}) and "
                                    "the trace files to rebuild it from are gone") from None
        if out is not None:
            print(f"madtrace: the store of {directory} is corrupt ({first_line(exc)}): "
                  "rebuilding it from the trace files", file=out, flush=True)
        import shutil
        shutil.rmtree(store_path(directory), ignore_errors=True)
    try:
        return _connect(directory, out)
    except duckdb.Error as exc:
        raise CorruptTraceError(f"{directory}: the store cannot be read even when rebuilt: "
                                f"{first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _connect(directory: str, out=None):
    import duckdb
    ensure_store(directory, out)
    meta = read_store_meta(directory) or {}
    tsc_hz = meta.get("tsc_hz") if meta.get("timestamps") else None
    con = duckdb.connect(":memory:")
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")     # it would go to our stdout
    # per-thread tables: tid first
    raw = {t: f"(SELECT tid, * EXCLUDE (tid) FROM {_source(directory, t)})" if t in PER_THREAD
           else _source(directory, t) for t in TABLES}
    duration = f"(end_tsc - begin_tsc) * 1e9 / {float(tsc_hz)!r}" if tsc_hz else "NULL::DOUBLE"
    con.execute(f"CREATE VIEW records AS SELECT * FROM {raw['records']}")
    con.execute(f"CREATE VIEW sites AS SELECT * FROM {raw['sites']}")
    con.execute(f"CREATE VIEW allocations AS SELECT * FROM {raw['allocations']}")
    con.execute(f"CREATE VIEW block_events AS SELECT * FROM {raw['block_events']}")
    con.execute(f"CREATE VIEW calls AS SELECT *, {duration} AS duration_ns FROM {raw['calls']}")
    for table in ("access_rows", "access_instructions", "access_data", "functions"):
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM {raw[table]}")
    con.execute("CREATE VIEW accesses AS " + ACCESSES_VIEW.format(q='"'))
    con.execute("""
        CREATE VIEW events AS
        SELECT r.tid, r.pos, r.seq,
               CASE WHEN r.code & 1 = 1 THEN 'exit' ELSE 'entry' END AS type,
               s.function, (r.code >> 1)::INTEGER AS site, NULL::BIGINT AS call_id, r.tsc,
               NULL::UBIGINT AS addr, NULL::USMALLINT AS size, NULL::VARCHAR AS instruction,
               NULL::VARCHAR AS data
        FROM records r LEFT JOIN sites s ON s.site = (r.code >> 1)::INTEGER
        UNION ALL
        SELECT a.tid, a.pos, a.seq, a.kind::VARCHAR, a.function::VARCHAR, NULL, a.call_id,
               NULL, a.addr, a.size, a.instruction::VARCHAR, a.data
        FROM accesses a""")
    for table in TABLES:       # every file's footer read: a file that is not Parquet fails here
        con.execute(f"SELECT count(*) FROM {raw[table]}").fetchall()
    return con


# what a Parquet export holds: the views with names (the access rows joined with theirs)
EXPORTED_VIEWS = ("records", "calls", "accesses", "allocations", "block_events", "sites")


def copy_store(directory: str, output: str, out=None) -> dict[str, int]:
    """The store as one Parquet file per view (tid a column again) in the new
    directory ``output`` (replaced if it exists), with DuckDB's streaming COPY;
    plus store_meta.json.  Returns the rows of each table."""
    import json
    import shutil
    con = connect(directory, out)
    if os.path.lexists(output):
        shutil.rmtree(output) if os.path.isdir(output) and not os.path.islink(output) \
            else os.unlink(output)
    os.makedirs(output)
    rows = {}
    for table in EXPORTED_VIEWS:
        path = os.path.join(output, f"{table}.parquet").replace("'", "''")
        con.execute(f"COPY (SELECT * FROM {table}) TO '{path}' "
                    "(FORMAT PARQUET, COMPRESSION ZSTD, ROW_GROUP_SIZE 1048576)")
        rows[table] = con.execute(f"SELECT count(*) FROM read_parquet('{path}')").fetchone()[0]
    with open(os.path.join(output, "store_meta.json"), "w") as f:
        json.dump(dict(read_store_meta(directory) or {}, tables=rows), f, indent=1)
        f.write("\n")
    return rows
