# SPDX-License-Identifier: GPL-2.0-or-later
"""The store's own Parquet writer (madtrace/trace/parquet_file.py, its pages in
parquet_pages.c).

Oracles: pyarrow's reader and DuckDB's (two Parquet implementations of their
own) read back exactly the columns written, with the Arrow schema pyarrow's own
writer gives the same table; the statistics are the columns' true min and max.
(Spark reads the store's files in tests/test_spark.py.)"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madtrace.trace.columnar import SCHEMAS
from madtrace.trace.parquet_file import PAGE_ROWS, ParquetFileWriter, RowGroupEncoder

ACCESS_ROWS = SCHEMAS["access_rows"]
EVERY_DELTA = {f.name: "DELTA_BINARY_PACKED" for f in ACCESS_ROWS}
SIZES = (1, 2, 31, 32, 33, 127, 128, 129, 130, 1000, PAGE_ROWS + 77)


def columns(n: int, mode: str, rng) -> dict:
    out = {}
    for f in ACCESS_ROWS:
        dtype = np.dtype(f.type.to_pandas_dtype())
        info = np.iinfo(dtype)
        if mode == "random":            # every bit pattern: widths up to 64, wrapping deltas
            out[f.name] = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        elif mode == "extremes":        # the largest deltas there are
            out[f.name] = np.where(np.arange(n) % 2, info.max, info.min).astype(dtype)
        elif mode == "sorted":          # runs of one step and jumps
            out[f.name] = (np.cumsum(rng.choice([0, 1, 1, 1, 7], n)) % (info.max // 2)).astype(dtype)
        else:
            out[f.name] = np.full(n, 5, dtype=dtype)
    return out


def one_row(sql: str) -> tuple:
    return duckdb.connect().execute(sql).fetchone()


def written(path, groups: list[dict], encodings: dict, statistics=frozenset()) -> None:
    writer = ParquetFileWriter(str(path), RowGroupEncoder(ACCESS_ROWS, encodings, statistics))
    for group in groups:
        writer.write(group)
    writer.close()


@pytest.mark.parametrize("mode", ["random", "extremes", "sorted", "constant"])
@pytest.mark.parametrize("encodings", [{}, EVERY_DELTA], ids=["plain", "delta"])
def test_columns_read_back_exactly(tmp_path, mode, encodings):
    rng = np.random.default_rng(len(mode))
    for n in SIZES:
        groups = [columns(n, mode, rng), columns(max(1, n // 3), mode, rng)]
        path = tmp_path / f"{n}.parquet"
        written(path, groups, encodings)
        want = {f.name: np.concatenate([g[f.name] for g in groups]) for f in ACCESS_ROWS}
        table = pq.read_table(path)
        assert table.schema.equals(ACCESS_ROWS), (n, table.schema)
        assert pq.read_metadata(path).num_row_groups == 2
        answer = duckdb.sql(f"SELECT * FROM '{path}'").fetchnumpy()
        for f in ACCESS_ROWS:
            assert np.array_equal(table.column(f.name).to_numpy(), want[f.name]), (n, f.name)
            assert np.array_equal(np.asarray(answer[f.name]), want[f.name]), (n, f.name)


def test_the_schema_is_pyarrows(tmp_path):
    """The files of both writers are one table to a reader of the folder."""
    rng = np.random.default_rng(3)
    ours = tmp_path / "ours" / "p0.parquet"
    theirs = tmp_path / "ours" / "p1.parquet"
    ours.parent.mkdir()
    group = columns(500, "sorted", rng)
    written(ours, [group], {"pos": "DELTA_BINARY_PACKED"})
    pq.write_table(pa.table([pa.array(group[f.name], type=f.type) for f in ACCESS_ROWS],
                            schema=ACCESS_ROWS), theirs)
    assert pq.read_schema(ours).remove_metadata().equals(pq.read_schema(theirs).remove_metadata())
    both = one_row(f"SELECT count(*), sum(pos), sum(addr::HUGEINT) FROM '{ours.parent}/*.parquet'")
    assert both == (1000, 2 * int(group["pos"].sum()), 2 * int(group["addr"].astype(object).sum()))


def test_statistics_are_min_and_max(tmp_path):
    rng = np.random.default_rng(4)
    groups = [columns(PAGE_ROWS * 2 + 5, "random", rng), columns(10, "sorted", rng)]
    path = tmp_path / "s.parquet"
    written(path, groups, EVERY_DELTA, {"pos", "seq", "call_id", "fid", "addr"})
    meta = pq.read_metadata(path)
    names = [f.name for f in ACCESS_ROWS]
    for g, group in enumerate(groups):
        row_group = meta.row_group(g)
        for name in ("pos", "seq", "call_id", "fid"):
            stats = row_group.column(names.index(name)).statistics
            assert stats.has_min_max
            assert (stats.min, stats.max) == (group[name].min(), group[name].max()), name
        # unsigned columns get none (min/max compared as signed would be wrong)
        assert not row_group.column(names.index("addr")).is_stats_set
    # DuckDB prunes row groups on them: a filter still finds exactly the rows
    pos = groups[0]["pos"][17]
    got = one_row(f"SELECT count(*) FROM '{path}' WHERE pos = {pos}")[0]
    assert got == sum(int((g["pos"] == pos).sum()) for g in groups)


def test_an_empty_file_has_the_schema(tmp_path):
    path = tmp_path / "e.parquet"
    written(path, [], {})
    assert pq.read_table(path).schema.equals(ACCESS_ROWS)
    assert one_row(f"SELECT count(*) FROM '{path}'") == (0,)


def test_refuses_what_it_cannot_write(tmp_path):
    from madtrace.errors import TracerInternalError
    for schema in (pa.schema([("s", pa.string())]), pa.schema([("x", pa.int16())])):
        with pytest.raises(TracerInternalError):
            RowGroupEncoder(schema)
    writer = ParquetFileWriter(str(tmp_path / "y.parquet"),
                               RowGroupEncoder(pa.schema([("a", pa.int64()), ("b", pa.int64())])))
    with pytest.raises(TracerInternalError):
        writer.write({"a": np.arange(3), "b": np.arange(2)})
    writer.close()


def test_a_row_group_from_pieces_reads_as_one(tmp_path):
    """A row group given as several pieces (the store's batches, gathered without
    copying them) holds their rows one after the other, pages cut at the pieces."""
    rng = np.random.default_rng(5)
    pieces = [columns(n, mode, rng) for n, mode in ((1, "sorted"), (PAGE_ROWS + 3, "random"),
                                                   (0, "sorted"), (129, "constant"))]
    path = tmp_path / "p.parquet"
    writer = ParquetFileWriter(str(path), RowGroupEncoder(ACCESS_ROWS, EVERY_DELTA, {"pos"}))
    writer.write(pieces)
    writer.close()
    meta = pq.read_metadata(path)
    assert meta.num_row_groups == 1 and meta.num_rows == sum(len(p["pos"]) for p in pieces)
    stats = meta.row_group(0).column(0).statistics
    everything = np.concatenate([p["pos"] for p in pieces])
    assert (stats.min, stats.max) == (everything.min(), everything.max())
    table = pq.read_table(path)
    for f in ACCESS_ROWS:
        assert np.array_equal(table.column(f.name).to_numpy(),
                              np.concatenate([p[f.name] for p in pieces])), f.name


def test_a_failed_row_group_is_said_with_its_own_error(tmp_path, monkeypatch):
    """The store's row groups are encoded on two flushers and appended in turn: one
    that fails (a full disk) stops the later ones, and the build ends with that
    error, not with a flusher's complaint about the row group it waited for."""
    import errno

    from madtrace.trace import columnar

    calls = []
    encode = RowGroupEncoder.encode

    def failing(self, columns):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return encode(self, columns)

    monkeypatch.setattr(RowGroupEncoder, "encode", failing)
    monkeypatch.setattr(columnar, "ROW_GROUP_ROWS", 1000)
    flushers = columnar.Flushers(2)
    writer = columnar.PartWriter(str(tmp_path), "access_rows", 1, flushers)
    rng = np.random.default_rng(6)
    with pytest.raises(OSError) as raised:
        try:
            for _ in range(8):
                writer.write(columns(1000, "sorted", rng))
                writer.flush()
            writer.close()
        finally:
            flushers.join()
    assert raised.value.errno == errno.ENOSPC
