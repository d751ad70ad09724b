"""`aurelius audit sql`: read-only SQL over the Parquet audit log (view `audit`).

The connection is DuckDB in memory. Only SELECT statements pass (checked with DuckDB's own parser,
`duckdb.extract_statements`); then file access is confined to the audit directory, external access is
disabled and the configuration locked, so neither a write nor a read elsewhere gets through. The view
dedupes by decision_id (first written wins), a second guard behind the idempotent sink. It reads the
immutable files present when the query starts, so it answers while a worker and sink keep writing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from sinks.audit_store import FILE_GLOB, SCHEMA


class ReadOnlyError(ValueError):
    """The statement is not a read-only query."""


def check_read_only(sql: str) -> None:
    """Raise `ReadOnlyError` unless `sql` is exactly one SELECT statement (DuckDB's statement type)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyError(f"cannot parse the query: {exc}") from exc
    if len(statements) != 1:
        raise ReadOnlyError(f"one SELECT statement expected, got {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise ReadOnlyError(
            f"the audit log is read-only: {kind.name} statements are refused; only SELECT queries run"
        )


def connect(audit_dir: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the read-only, deduplicated view `audit` over `audit_dir`."""
    directory = Path(audit_dir).resolve()
    con = duckdb.connect(":memory:")
    if any(directory.glob(FILE_GLOB)):
        glob = str(directory / FILE_GLOB).replace("'", "''")
        source = f"read_parquet('{glob}', union_by_name = true, filename = true)"
        order, exclude = "written_at, filename", "rn, filename"
    else:
        con.register("_audit_empty", pa.Table.from_pylist([], schema=SCHEMA))
        source, order, exclude = "_audit_empty", "written_at", "rn"
    con.execute(
        f"CREATE VIEW audit AS SELECT * EXCLUDE ({exclude}) FROM (SELECT *, row_number() OVER "
        f"(PARTITION BY decision_id ORDER BY {order}) AS rn FROM {source}) WHERE rn = 1"
    )
    con.execute("SET allowed_directories = $dirs", {"dirs": [str(directory) + "/"]})
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def query(sql: str, audit_dir: str | Path) -> pl.DataFrame:
    """Run one read-only SELECT over the audit log and return its result.

    Raises
    ------
    ReadOnlyError : the statement is anything but a SELECT.
    """
    check_read_only(sql)
    return connect(audit_dir).sql(sql).pl()


def run(args: argparse.Namespace) -> int:
    try:
        df = query(args.query, args.audit_dir)
    except ReadOnlyError as exc:
        print(f"aurelius audit sql: {exc}", file=sys.stderr)
        return 2
    except duckdb.Error as exc:
        print(f"aurelius audit sql: {exc}", file=sys.stderr)
        return 1
    out = args.output
    if args.format == "table":
        with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
            text = str(df)
        if out:
            Path(out).write_text(text + "\n")
        else:
            print(text)
    elif args.format == "csv":
        df.write_csv(out) if out else sys.stdout.write(df.write_csv())
    elif args.format == "json":
        df.write_json(out) if out else print(df.write_json())
    else:
        if not out:
            print("aurelius audit sql: --format parquet needs --output FILE", file=sys.stderr)
            return 2
        df.write_parquet(out)
    return 0
