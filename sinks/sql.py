"""`aurelius audit sql`: read-only SQL over the Parquet audit log (view `audit`).

The connection is DuckDB in memory. Only SELECT statements pass (checked with DuckDB's own parser,
`duckdb.extract_statements`); then file access is confined to the audit directory, external access is
disabled and the configuration locked, so neither a write nor a read elsewhere gets through. The view
dedupes by decision_id (first written wins), a second guard behind the idempotent sink. It reads the
immutable files present when the query starts, so it answers while a worker and sink keep writing.

Resource limits (a cross join once ran at 100% CPU until killed; DuckDB's own memory limit is 80% of RAM): the
query runs on `threads` threads under DuckDB's `memory_limit`, with spilling to disk off (nothing is written and
the limit is a ceiling), and a timer thread interrupts it (`con.interrupt()`) after `timeout_s`. Either stop
raises `QueryLimitError` naming the limit and its flag.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa

from sinks.audit_store import FILE_GLOB, SCHEMA

#: Defaults of `aurelius audit sql` (--timeout-s s, --memory-limit DuckDB size, --threads count).
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MEMORY_LIMIT = "1 GB"
DEFAULT_THREADS = 2


class ReadOnlyError(ValueError):
    """The statement is not a read-only query."""


class QueryLimitError(RuntimeError):
    """The query was stopped at its time or memory limit; the message names the limit and its flag."""


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


def connect(audit_dir: str | Path, memory_limit: str = DEFAULT_MEMORY_LIMIT,
            threads: int = DEFAULT_THREADS) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the read-only, deduplicated view `audit` over `audit_dir`, at most
    `memory_limit` of memory (a DuckDB size, e.g. "1 GB"; no spilling to disk) and `threads` threads."""
    directory = Path(audit_dir).resolve()
    con = duckdb.connect(":memory:")
    con.execute("SET memory_limit = $m", {"m": memory_limit})
    con.execute("SET threads = $n", {"n": threads})
    con.execute("SET temp_directory = ''")
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


def query(sql: str, audit_dir: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S,
          memory_limit: str = DEFAULT_MEMORY_LIMIT, threads: int = DEFAULT_THREADS) -> pl.DataFrame:
    """Run one read-only SELECT over the audit log and return its result.

    Parameters
    ----------
    timeout_s : wall-clock limit (s); the query is interrupted when it is reached.
    memory_limit : DuckDB's memory limit (a size such as "1 GB" or "512MB").
    threads : DuckDB worker threads (count).

    Raises
    ------
    ReadOnlyError : the statement is anything but a SELECT.
    QueryLimitError : the query hit the time or memory limit.
    """
    check_read_only(sql)
    con = connect(audit_dir, memory_limit, threads)
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        try:
            con.interrupt()
        except duckdb.Error:  # the query ended (and the connection closed) meanwhile
            pass

    timer = threading.Timer(timeout_s, stop)
    timer.daemon = True
    timer.start()
    try:
        return con.sql(sql).pl()
    except duckdb.InterruptException as exc:
        if fired.is_set():
            raise QueryLimitError(f"query stopped: time limit of {timeout_s:g} s reached (--timeout-s)") from exc
        raise
    except duckdb.OutOfMemoryException as exc:
        raise QueryLimitError(f"query stopped: memory limit of {memory_limit} reached (--memory-limit)") from exc
    finally:
        timer.cancel()
        con.close()


def run(args: argparse.Namespace) -> int:
    if not args.timeout_s > 0 or args.threads < 1:
        print("aurelius audit sql: --timeout-s must be > 0 and --threads >= 1", file=sys.stderr)
        return 2
    try:
        df = query(args.query, args.audit_dir, args.timeout_s, args.memory_limit, args.threads)
    except ReadOnlyError as exc:
        print(f"aurelius audit sql: {exc}", file=sys.stderr)
        return 2
    except QueryLimitError as exc:
        print(f"aurelius audit sql: {exc}", file=sys.stderr)
        return 3
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
