"""Process settings of the streaming commands (pydantic-settings: flags override env `AURELIUS_*`)."""

from __future__ import annotations

import os

from pydantic_settings import BaseSettings, SettingsConfigDict


def default_bootstrap() -> str:
    """$KAFKA_BOOTSTRAP_SERVERS, else localhost:9092 (the command contract of issue 7)."""
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")


class WorkerSettings(BaseSettings):
    """Settings of `aurelius worker`; every field can be set from env as `AURELIUS_<NAME>`.

    Parameters
    ----------
    bootstrap_servers : Kafka bootstrap servers.
    topic_prefix : prefix of every topic name.
    db : world-model DuckDB file (state and consumed offsets, one transaction per micro-batch).
    audit_dir : Parquet audit log directory (the worker only publishes; the audit sink writes it).
    market : market the fleet's site serves.
    policy : registered policy name (optimizer.policy).
    group_id : consumer group / faust app id.
    period_s : control period length (s).
    allowed_lateness_s : watermark = max event time - allowed lateness (s).
    batch_max_records : micro-batch size cap (records).
    batch_max_s : micro-batch time cap (s).
    session_timeout_s, heartbeat_interval_s, rebalance_timeout_s : consumer-group timers (s); the defaults
        make a group join take ~5 s on Tansu (BROKER.md).
    stats_interval_s : how often a JSON stats line is logged (s).
    """

    model_config = SettingsConfigDict(env_prefix="AURELIUS_", extra="ignore")

    bootstrap_servers: str = "localhost:9092"
    topic_prefix: str = "aurelius."
    db: str = "aurelius_state.duckdb"
    audit_dir: str = "audit"
    market: str = "PJM"
    policy: str = "aurelius"
    group_id: str = "aurelius-worker"
    period_s: float = 300.0
    allowed_lateness_s: float = 30.0
    batch_max_records: int = 5000
    batch_max_s: float = 0.2
    session_timeout_s: float = 6.0
    heartbeat_interval_s: float = 1.0
    rebalance_timeout_s: float = 6.0
    stats_interval_s: float = 5.0
