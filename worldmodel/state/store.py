"""The world model's persistent state: one DuckDB file, updated in idempotent micro-batches.

Raw observations keep their record keys as primary keys, so a duplicated or replayed record changes
nothing (``INSERT ... ON CONFLICT DO NOTHING`` over an Arrow view of the polars frame). The consumer
positions that produced the state are written in the same transaction and never move backward, so a
restart resumes from exactly the state it has (at-least-once delivery, idempotent keys; BROKER.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from schemas.forecast import DisturbanceForecast, Interval
from worldmodel.state.migrations import RAW_KINDS, migrate, schema_version

#: Decimal places the decision's reads round a float average to (requests, MHz, W, tokens): DuckDB's parallel
#: sums of doubles differ in the last bit from run to run, and what a decision reads must not.
FLOAT_DIGITS = 6
#: Replica state from the last fleet event of each replica that arrived by $as_of; a reconfiguration that
#: changes the weights' precision or the KV-cache dtype restarts the engine (loading). An event that does not report
#: the KV dtype (null) keeps the one the replica's last earlier event reported; null where none ever did ("not
#: reported": the engine's default "auto" to the calibration, the running plan's to the forward model;
#: `schemas.records.reported_kv_cache_dtype` is the same rule on frames, "auto" for never).
REPLICA_STATE_SQL = """
WITH ev AS (
  SELECT * REPLACE (coalesce(kv_cache_dtype,
                             last_value(kv_cache_dtype IGNORE NULLS) OVER (
                               PARTITION BY replica_id ORDER BY event_at, kind
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS kv_cache_dtype)
  FROM fleet_event WHERE arrived_at <= $as_of::TIMESTAMPTZ
), ev1 AS (
  SELECT *, lag(precision) OVER (PARTITION BY replica_id ORDER BY event_at, kind) AS prev_precision,
         lag(kv_cache_dtype) OVER (PARTITION BY replica_id ORDER BY event_at, kind) AS prev_kv,
         row_number() OVER (PARTITION BY replica_id ORDER BY event_at DESC, kind DESC) AS rn
  FROM ev
)
SELECT replica_id,
       CASE kind WHEN 'replica_started' THEN 'loading' WHEN 'replica_stopped' THEN 'cold'
                 WHEN 'replica_reconfigured' THEN
                   CASE WHEN prev_precision IS DISTINCT FROM precision OR prev_kv <> kv_cache_dtype THEN 'loading'
                        ELSE 'warm' END
                 ELSE 'warm' END AS state,
       site, model, gpu_type, tp, precision, kv_cache_dtype, sm_clock_mhz, max_batch, hostnames,
       event_at AS since_at
FROM ev1 WHERE rn = 1
"""


#: WAL size at which DuckDB checkpoints on its own (its default is 16 MB). A checkpoint recompresses the tables
#: inside whichever ingest crosses the threshold, in-memory states included, at a cost that grows with the
#: table: at 14k arrivals per 5-min period the ingest took ~50 ms, and 170-760 ms every ~5 periods (3 h window),
#: which the period's decision waited on. At 1 GB one window crosses it at most once; the file keeps every
#: committed batch either way (the WAL replays on open).
CHECKPOINT_THRESHOLD = "1GB"


@dataclass(frozen=True)
class IngestResult:
    """One micro-batch's new rows and rows already present (duplicates), summed over kinds (count)."""

    inserted: int
    duplicates: int


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list:
    """Run one statement and consume its result (duckdb 2.x refuses new work while a result is pending)."""
    return con.execute(sql, params).fetchall()


class WorldState:
    """The world model's DuckDB state. Open with :meth:`open`; one read-write process per file.

    Parameters
    ----------
    con : an open connection whose schema is already at the current version (use :meth:`open`).
    """

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    @classmethod
    def open(cls, path: str | Path = "aurelius_state.duckdb") -> WorldState:
        """Open (or create) a state file, migrating its schema to the current version.

        Parameters
        ----------
        path : DuckDB file; ``":memory:"`` for a throwaway in-memory state (tests, benchmarks).
        """
        con = duckdb.connect(str(path))
        _rows(con, f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
        migrate(con)
        return cls(con)

    @property
    def version(self) -> int:
        """Schema version of the open file."""
        return schema_version(self.con)

    def close(self) -> None:
        """Close the connection (the file keeps every committed batch)."""
        self.con.close()

    def update(
        self,
        batch: Mapping[str, pl.DataFrame],
        positions: Mapping[tuple[str, int], int] | None = None,
        ingested_at: datetime | None = None,
        extra: Callable[[duckdb.DuckDBPyConnection, IngestResult], None] | None = None,
    ) -> IngestResult:
        """Insert one micro-batch of records and the consumer positions behind it in one transaction.

        Parameters
        ----------
        batch : frames by record kind (``request_arrival``, ``request_completion``, ``gpu_telemetry``,
            ``price``, ``fleet_event``); columns follow schemas/README.md, unknown columns are ignored.
        positions : next offset to consume per (topic, partition); stored as the max of old and new.
        ingested_at : wall time of the batch (UTC), kept on each new row; default now().
        extra : called as ``extra(con, result)`` inside the same transaction, after the rows and positions,
            with this batch's counts; whatever it writes commits or rolls back with the batch (a consumer's
            own ledger, e.g. streams/ingest.py). An exception from it rolls the whole batch back.

        Returns
        -------
        IngestResult with rows inserted and rows skipped as duplicates of a key already stored (count).
        """
        unknown = set(batch) - set(RAW_KINDS)
        if unknown:
            raise ValueError(f"unknown record kinds {sorted(unknown)}; known: {sorted(RAW_KINDS)}")
        inserted = offered = 0
        con = self.con
        _rows(con, "BEGIN TRANSACTION")
        try:
            for name, frame in batch.items():
                if frame.height == 0:
                    continue
                kind = RAW_KINDS[name]
                missing = [k for k in kind.key if k not in frame.columns]
                if missing:
                    raise ValueError(f"{name} batch lacks key columns {missing}")
                cols = [c for c in kind.names if c in frame.columns]
                names = ", ".join(f'"{c}"' for c in cols)
                defaults = dict(kind.key_defaults)
                select = ", ".join(
                    f'coalesce("{c}", {defaults[c]})' if c in defaults else f'"{c}"' for c in cols
                )
                con.register("_batch", frame.select(cols).to_arrow())
                try:
                    (n,) = _rows(
                        con,
                        f'INSERT INTO "{kind.table}" ({names}, ingested_at) '
                        f"SELECT {select}, coalesce($at::TIMESTAMPTZ, now()) FROM _batch "
                        "ON CONFLICT DO NOTHING",
                        {"at": ingested_at},
                    )[0]
                finally:
                    con.unregister("_batch")
                inserted += int(n)
                offered += frame.height
                if name == "fleet_event" and n:
                    self._refresh_replicas()
            for (topic, partition), offset in (positions or {}).items():
                _rows(
                    con,
                    'INSERT INTO consumer_positions VALUES (?, ?, ?) ON CONFLICT ("topic", "partition") '
                    'DO UPDATE SET "offset" = greatest(consumer_positions."offset", excluded."offset")',
                    [topic, int(partition), int(offset)],
                )
            result = IngestResult(inserted=inserted, duplicates=offered - inserted)
            if extra is not None:
                extra(con, result)
            _rows(con, "COMMIT")
        except BaseException:
            _rows(con, "ROLLBACK")
            raise
        return result

    def _refresh_replicas(self) -> None:
        _rows(self.con, "DELETE FROM replicas")
        _rows(self.con, f"INSERT INTO replicas BY NAME {REPLICA_STATE_SQL}", {"as_of": "infinity"})

    def positions(self) -> dict[tuple[str, int], int]:
        """Committed consumer positions: next offset per (topic, partition)."""
        rows = _rows(self.con, 'SELECT "topic", "partition", "offset" FROM consumer_positions')
        return {(t, int(p)): int(o) for t, p, o in rows}

    def frame(self, sql: str, params: Mapping[str, Any] | None = None) -> pl.DataFrame:
        """Run a read-only query and return a polars frame."""
        return self.con.sql(sql, params=params).pl() if params else self.con.sql(sql).pl()

    def count(self, table: str) -> int:
        """Rows in a state table (count)."""
        return int(_rows(self.con, f'SELECT count(*) FROM "{table}"')[0][0])

    def tables(self) -> list[str]:
        """Names of the state's tables."""
        return [r[0] for r in _rows(self.con, "SELECT table_name FROM duckdb_tables() ORDER BY 1")]

    def digest(self) -> dict[str, tuple[int, int]]:
        """(row count, order-independent content hash) of every table: equal digests mean unchanged state."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tables():
            n, h = _rows(self.con, f'SELECT count(*), coalesce(sum(hash(x)::HUGEINT), 0) FROM "{t}" x')[0]
            out[t] = (int(n), int(h))
        return out

    def aggregate_period(self, period_start: datetime, period_end: datetime) -> None:
        """(Re)compute the aggregates of [period_start, period_end) from records arrived by its end.

        Parameters
        ----------
        period_start, period_end : the control period (UTC instants).
        """
        p = {"s": period_start, "e": period_end}
        _rows(self.con, "BEGIN TRANSACTION")
        try:
            _rows(self.con, "DELETE FROM period_class WHERE period_start = $s", {"s": period_start})
            _rows(self.con, "DELETE FROM period_power WHERE period_start = $s", {"s": period_start})
            _rows(
                self.con,
                """
                INSERT INTO period_class
                WITH a AS (
                  SELECT request_class, count(*) AS arrivals, quantile_cont(input_tokens, 0.5) AS i50,
                         quantile_cont(input_tokens, 0.9) AS i90, quantile_cont(input_tokens, 0.99) AS i99
                  FROM request_arrival
                  WHERE event_at >= $s AND event_at < $e AND arrived_at <= $e GROUP BY 1),
                c AS (
                  SELECT request_class, count(*) AS completions, quantile_cont(output_tokens, 0.5) AS o50,
                         quantile_cont(output_tokens, 0.9) AS o90, count(*) FILTER (WHERE sla_met) AS met,
                         count(*) FILTER (WHERE NOT sla_met) AS viol,
                         quantile_cont(ttft_s, 0.99) * 1e3 AS ttft99,
                         quantile_cont(tpot_s, 0.99) * 1e3 AS tpot99
                  FROM request_completion
                  WHERE event_at >= $s AND event_at < $e AND arrived_at <= $e GROUP BY 1)
                SELECT $s, coalesce(a.request_class, c.request_class), coalesce(arrivals, 0), i50, i90, i99,
                       coalesce(completions, 0), o50, o90, coalesce(met, 0), coalesce(viol, 0), ttft99, tpot99
                FROM a FULL OUTER JOIN c ON a.request_class = c.request_class""",
                p,
            )
            _rows(
                self.con,
                """
                INSERT INTO period_power
                WITH g AS (
                  SELECT site, modelName AS gpu_type, hostname, gpu, avg(DCGM_FI_DEV_POWER_USAGE) AS w
                  FROM gpu_telemetry WHERE event_at >= $s AND event_at < $e AND arrived_at <= $e GROUP BY ALL)
                SELECT $s, site, gpu_type, sum(w),
                       sum(w) * epoch($e::TIMESTAMPTZ - $s::TIMESTAMPTZ) / 3600.0
                FROM g GROUP BY ALL""",
                p,
            )
            _rows(self.con, "COMMIT")
        except Exception:
            _rows(self.con, "ROLLBACK")
            raise

    def record_forecast(self, made_at: datetime, forecast: DisturbanceForecast) -> None:
        """Store a forecast's points and intervals (arrivals per class, price) keyed by when it was made."""
        items: list[tuple[str, Interval]] = [
            (f"arrivals_per_s:{d.request_class}", d.arrivals_per_s) for d in forecast.demand
        ]
        items.append(("price_usd_mwh", forecast.price_usd_mwh))
        rows = [
            (
                made_at,
                forecast.period_start,
                target,
                iv.point,
                iv.lo80,
                iv.hi80,
                iv.lo95,
                iv.hi95,
                forecast.confidence,
            )
            for target, iv in items
        ]
        _rows(self.con, "BEGIN TRANSACTION")
        for row in rows:
            _rows(self.con, "INSERT OR REPLACE INTO forecasts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        _rows(self.con, "COMMIT")

    def replace_rows(self, table: str, rows: pl.DataFrame, key_filter: str | None = None) -> None:
        """Upsert rows into a derived table (calibration state, residuals) by primary key, in one transaction.

        Parameters
        ----------
        table : a derived table (not a raw observation table; those are insert-only).
        rows : frame whose columns are a subset of the table's.
        key_filter : optional SQL predicate of rows to delete first (e.g. a stale band).
        """
        if table in {k.table for k in RAW_KINDS.values()}:
            raise ValueError(f"{table} holds raw observations; use update()")
        _rows(self.con, "BEGIN TRANSACTION")
        try:
            if key_filter:
                _rows(self.con, f'DELETE FROM "{table}" WHERE {key_filter}')
            if rows.height:
                cols = ", ".join(f'"{c}"' for c in rows.columns)
                self.con.register("_rows", rows.to_arrow())
                try:
                    _rows(self.con, f'INSERT OR REPLACE INTO "{table}" ({cols}) SELECT {cols} FROM _rows')
                finally:
                    self.con.unregister("_rows")
            _rows(self.con, "COMMIT")
        except Exception:
            _rows(self.con, "ROLLBACK")
            raise
