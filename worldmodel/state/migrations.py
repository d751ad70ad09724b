"""Versioned DuckDB schema of the world-model state: ordered migrations and the raw record kinds.

Every migration is a function taking a connection; ``MIGRATIONS[i]`` moves a database from version ``i`` to
``i + 1`` and runs inside the caller's transaction, so a failed migration leaves the file unchanged.
Version 1 holds the raw observations and consumer positions; version 2 adds fleet state, per-period
aggregates and forecasts; version 3 adds self-calibration (residuals, factors, CUSUM state) and an
``ingested_at`` column on the raw tables; version 4 adds the replicas' KV-cache dtype (``kv_cache_dtype``) to
fleet events and fleet state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import duckdb


@dataclass(frozen=True)
class RawKind:
    """One raw record kind: its table, primary-key columns and column DDL (order = insert order).

    key_defaults : SQL value stored for a nullable key field that arrives null (e.g. node-level telemetry).
    added_in : (column, schema version) of each column a later migration adds (`_add_columns`); version 1
        creates the others.
    """

    table: str
    key: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    key_defaults: tuple[tuple[str, str], ...] = ()
    added_in: tuple[tuple[str, int], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)


_TS = "TIMESTAMPTZ"
RAW_KINDS: dict[str, RawKind] = {
    "request_arrival": RawKind(
        "request_arrival",
        ("request_id",),
        (
            ("request_id", "VARCHAR NOT NULL"),
            ("event_at", _TS),
            ("arrived_at", _TS),
            ("request_class", "VARCHAR"),
            ("model", "VARCHAR"),
            ("input_tokens", "INTEGER"),
            ("prefix_block_ids", "BIGINT[]"),
            ("site", "VARCHAR"),
            ("tenant", "VARCHAR"),
            ("allowed_regions", "VARCHAR[]"),
            ("sla_ttft_ms", "DOUBLE"),
            ("sla_tpot_ms", "DOUBLE"),
            ("deadline_at", _TS),
        ),
    ),
    "request_completion": RawKind(
        "request_completion",
        ("request_id",),
        (
            ("request_id", "VARCHAR NOT NULL"),
            ("event_at", _TS),
            ("arrived_at", _TS),
            ("request_class", "VARCHAR"),
            ("model", "VARCHAR"),
            ("site", "VARCHAR"),
            ("replica_id", "VARCHAR"),
            ("gpu_type", "VARCHAR"),
            ("input_tokens", "INTEGER"),
            ("output_tokens", "INTEGER"),
            ("cached_input_tokens", "INTEGER"),
            ("queued_at", _TS),
            ("first_token_at", _TS),
            ("ttft_s", "DOUBLE"),
            ("tpot_s", "DOUBLE"),
            ("e2e_s", "DOUBLE"),
            ("sla_met", "BOOLEAN"),
            ("finish_reason", "VARCHAR"),
        ),
    ),
    "gpu_telemetry": RawKind(
        "gpu_telemetry",
        ("hostname", "gpu", "event_at"),
        (
            ("hostname", "VARCHAR NOT NULL"),
            ("gpu", "INTEGER NOT NULL"),
            ("event_at", f"{_TS} NOT NULL"),
            ("arrived_at", _TS),
            ("site", "VARCHAR"),
            ("uuid", "VARCHAR"),
            ("modelName", "VARCHAR"),
            ("replica_id", "VARCHAR"),
            ("model_name", "VARCHAR"),
            ("DCGM_FI_DEV_POWER_USAGE", "DOUBLE"),
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DOUBLE"),
            ("DCGM_FI_DEV_SM_CLOCK", "DOUBLE"),
            ("DCGM_FI_DEV_GPU_UTIL", "DOUBLE"),
            ("DCGM_FI_DEV_FB_USED", "DOUBLE"),
            ("DCGM_FI_DEV_GPU_TEMP", "DOUBLE"),
            ("num_requests_running", "INTEGER"),
            ("num_requests_waiting", "INTEGER"),
            ("kv_cache_usage_perc", "DOUBLE"),
        ),
        (("gpu", "-1"),),
    ),
    "price": RawKind(
        "price",
        ("market", "location", "market_run", "interval_start"),
        (
            ("market", "VARCHAR NOT NULL"),
            ("location", "VARCHAR NOT NULL"),
            ("market_run", "VARCHAR NOT NULL"),
            ("interval_start", f"{_TS} NOT NULL"),
            ("interval_end", _TS),
            ("lmp_usd_mwh", "DOUBLE"),
            ("published_at", _TS),
            ("event_at", _TS),
            ("arrived_at", _TS),
        ),
    ),
    "fleet_event": RawKind(
        "fleet_event",
        ("replica_id", "kind", "event_at"),
        (
            ("replica_id", "VARCHAR NOT NULL"),
            ("kind", "VARCHAR NOT NULL"),
            ("event_at", f"{_TS} NOT NULL"),
            ("arrived_at", _TS),
            ("site", "VARCHAR"),
            ("model", "VARCHAR"),
            ("gpu_type", "VARCHAR"),
            ("tp", "INTEGER"),
            ("precision", "VARCHAR"),
            ("kv_cache_dtype", "VARCHAR"),
            ("sm_clock_mhz", "DOUBLE"),
            ("max_batch", "INTEGER"),
            ("hostnames", "VARCHAR[]"),
        ),
        added_in=(("kv_cache_dtype", 4),),
    ),
}


def _create(con: duckdb.DuckDBPyConnection, table: str, columns: str, key: tuple[str, ...]) -> None:
    pk = ", ".join(f'"{k}"' for k in key)
    con.execute(f'CREATE TABLE "{table}" ({columns}, PRIMARY KEY ({pk}))').fetchall()


def _add_columns(con: duckdb.DuckDBPyConnection, version: int) -> None:
    """Add the raw tables' columns that `version` introduces (`RawKind.added_in`)."""
    for kind in RAW_KINDS.values():
        ddl = dict(kind.columns)
        for c, v in kind.added_in:
            if v == version:
                con.execute(f'ALTER TABLE "{kind.table}" ADD COLUMN "{c}" {ddl[c]}').fetchall()


def _v1(con: duckdb.DuckDBPyConnection) -> None:
    for kind in RAW_KINDS.values():
        later = dict(kind.added_in)
        _create(con, kind.table, ", ".join(f'"{c}" {t}' for c, t in kind.columns if c not in later), kind.key)
    _create(
        con,
        "consumer_positions",
        '"topic" VARCHAR, "partition" INTEGER, "offset" BIGINT NOT NULL',
        ("topic", "partition"),
    )


def _v2(con: duckdb.DuckDBPyConnection) -> None:
    _create(
        con,
        "replicas",
        "replica_id VARCHAR, state VARCHAR, site VARCHAR, model VARCHAR, gpu_type VARCHAR, tp INTEGER, "
        "precision VARCHAR, sm_clock_mhz DOUBLE, max_batch INTEGER, hostnames VARCHAR[], "
        "since_at TIMESTAMPTZ",
        ("replica_id",),
    )
    _create(
        con,
        "period_class",
        "period_start TIMESTAMPTZ, request_class VARCHAR, arrivals BIGINT, input_tokens_p50 DOUBLE, "
        "input_tokens_p90 DOUBLE, input_tokens_p99 DOUBLE, completions BIGINT, output_tokens_p50 DOUBLE, "
        "output_tokens_p90 DOUBLE, sla_met BIGINT, violations BIGINT, ttft_p99_ms DOUBLE, tpot_p99_ms DOUBLE",
        ("period_start", "request_class"),
    )
    _create(
        con,
        "period_power",
        "period_start TIMESTAMPTZ, site VARCHAR, gpu_type VARCHAR, power_mean_w DOUBLE, energy_wh DOUBLE",
        ("period_start", "site", "gpu_type"),
    )
    _create(
        con,
        "forecasts",
        "made_at TIMESTAMPTZ, period_start TIMESTAMPTZ, target VARCHAR, point DOUBLE, lo80 DOUBLE, "
        "hi80 DOUBLE, lo95 DOUBLE, hi95 DOUBLE, confidence DOUBLE",
        ("made_at", "period_start", "target"),
    )


def _v3(con: duckdb.DuckDBPyConnection) -> None:
    for kind in RAW_KINDS.values():
        con.execute(f'ALTER TABLE "{kind.table}" ADD COLUMN ingested_at TIMESTAMPTZ').fetchall()
    _create(
        con,
        "calibration_residuals",
        "recorded_at TIMESTAMPTZ, quantity VARCHAR, gpu_type VARCHAR, node VARCHAR, model VARCHAR, "
        "predicted DOUBLE, "
        "observed DOUBLE, z DOUBLE",
        ("recorded_at", "quantity", "gpu_type", "node", "model"),
    )
    _create(
        con,
        "calibration_state",
        "quantity VARCHAR, gpu_type VARCHAR, node VARCHAR, model VARCHAR, factor DOUBLE, n DOUBLE, "
        "resid_mean DOUBLE, resid_var DOUBLE, base_mean DOUBLE, base_var DOUBLE, base_n DOUBLE, "
        "cusum_pos DOUBLE, cusum_neg DOUBLE, alarms INTEGER, last_alarm_at TIMESTAMPTZ, "
        "updated_at TIMESTAMPTZ",
        ("quantity", "gpu_type", "node", "model"),
    )
    _create(con, "risk_band", "recorded_at TIMESTAMPTZ, band DOUBLE, reason VARCHAR", ("recorded_at",))


def _v4(con: duckdb.DuckDBPyConnection) -> None:
    _add_columns(con, 4)
    con.execute("ALTER TABLE replicas ADD COLUMN kv_cache_dtype VARCHAR").fetchall()


MIGRATIONS: tuple[Callable[[duckdb.DuckDBPyConnection], None], ...] = (_v1, _v2, _v3, _v4)
CURRENT_VERSION = len(MIGRATIONS)


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The schema version of a database (0 for an empty one)."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, applied_at TIMESTAMPTZ)"
    ).fetchall()
    rows = con.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchall()
    return int(rows[0][0])


def migrate(con: duckdb.DuckDBPyConnection, target: int = CURRENT_VERSION) -> int:
    """Apply the migrations from the database's version up to `target` in one transaction; return the version.

    Parameters
    ----------
    con : an open read-write connection.
    target : schema version to reach (1..CURRENT_VERSION).
    """
    if not 1 <= target <= CURRENT_VERSION:
        raise ValueError(f"schema version {target} is not in 1..{CURRENT_VERSION}")
    con.execute("BEGIN TRANSACTION").fetchall()
    try:
        have = schema_version(con)
        if have > CURRENT_VERSION:
            raise ValueError(f"database schema v{have} is newer than this code (v{CURRENT_VERSION})")
        for version in range(have, target):
            MIGRATIONS[version](con)
            con.execute("INSERT INTO schema_version VALUES (?, now())", [version + 1]).fetchall()
        con.execute("COMMIT").fetchall()
    except Exception:
        con.execute("ROLLBACK").fetchall()
        raise
    return max(have, target)
