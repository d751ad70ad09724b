"""Process settings of the streaming commands (pydantic-settings: flags override env `AURELIUS_*`)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.dead_letter import DEFAULT_MAX_BYTES
from schemas.kafka_client import KafkaClientSettings, load_settings


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
    policy : registered policy name (schemas.policy).
    cost_basis : the operator's cost basis, "rented" or "owned" (schemas/cost.py): what the aurelius policy
        optimizes (AURELIUS_COST_BASIS).
    group_id : consumer group / faust app id.
    period_s : control period length (s).
    allowed_lateness_s : watermark = max event time - allowed lateness (s).
    batch_max_records : micro-batch size cap (records).
    batch_max_s : micro-batch time cap (s).
    session_timeout_s, heartbeat_interval_s, rebalance_timeout_s : consumer-group timers (s); the defaults
        make a group join take ~5 s on Tansu (BROKER.md).
    stats_interval_s : how often a JSON stats line is logged (s).
    field_map : TOML field map for foreign producers (streams/fieldmaps/default.toml format); None: none.
    history_from_replay : build the policy, its context and the 7-day history exactly as the embedded replay
        does (`streams.workload.builder.build_workload` over the window below), so the worker's decisions
        match `aurelius replay` for the same data and seed; period 0 starts at the window start.
    year, window_rule, window_periods, seed : the replay window of `history_from_replay` (`aurelius replay`
        --year, --window-rule, --periods (count), --seed); `start` of the worker (--start) overrides the rule.
    max_record_bytes : a record value longer than this is dead-lettered unread (bytes; 256 KiB, a quarter
        of Kafka's default 1 MiB message limit; the records of the contract are under 10 KiB).
    dead_letter_max_bytes : bound on a dead letter's value plus headers (bytes; 512 KiB, under the producer's
        1 MB request limit); a larger one keeps the first bytes of the original with its length and SHA-256.
        The default is above what a `max_record_bytes` record's dead letter needs, so only a record that was
        refused for its size is ever truncated.
    history_span_s : a record whose clock time is earlier than the stream's origin minus this is dead-lettered
        (s; 8 days: the 7-day history before a replay window, plus the day-ahead prices published the day
        before). Never compared with the wall clock, so replays of old data work.
    max_ahead_s : a record whose clock time is more than this ahead of the stream's clock (the largest clock
        time accepted over all input partitions, or the origin if later) is dead-lettered (s; 1 day).
    max_close_periods : at most this many periods close per micro-batch (2016: 7 days of 5-minute periods);
        the rest close in the following batches (an idle poll is a batch).
    kafka : transport security and start-up retry of every Kafka client (schemas.kafka_client; env `KAFKA_*`
        or the Kafka flags, not `AURELIUS_*`).
    broker_probe_interval_s : how often the running worker asks the broker for metadata (s); two failures in a
        row are an outage (streams/kafka_link.py).
    reconnect_backoff_max_s : longest wait between two reconnect attempts during an outage (s).
    offset_recheck_s : while idle, a partition whose stored position is past the end the broker reports is
        checked again (confirming fetch included) at most this often (s).
    metrics_port : port of the worker's HTTP endpoint, `/metrics` (Prometheus), `/healthz` and `/readyz`
        (streams/metrics.py); 0 disables it. 9464 is the OpenTelemetry Prometheus exporter's port.
    metrics_addr : address that endpoint binds (default loopback only; "0.0.0.0" for a scraper elsewhere).
    """

    model_config = SettingsConfigDict(env_prefix="AURELIUS_", extra="ignore")

    bootstrap_servers: str = "localhost:9092"
    topic_prefix: str = "aurelius."
    db: str = "aurelius_state.duckdb"
    audit_dir: str = "audit"
    market: str = "PJM"
    policy: str = "aurelius"
    cost_basis: Literal["rented", "owned"] = "rented"
    group_id: str = "aurelius-worker"
    period_s: float = 300.0
    allowed_lateness_s: float = 30.0
    batch_max_records: int = 20000
    batch_max_s: float = 0.2
    session_timeout_s: float = 6.0
    heartbeat_interval_s: float = 1.0
    rebalance_timeout_s: float = 6.0
    stats_interval_s: float = 5.0
    field_map: str | None = None
    history_from_replay: bool = False
    year: int = 2023
    window_rule: str = "max"
    window_periods: int | None = None
    seed: int = 0
    max_record_bytes: int = Field(262_144, ge=1024)
    dead_letter_max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=16_384)
    history_span_s: float = Field(8 * 86_400.0, gt=0)
    max_ahead_s: float = Field(86_400.0, gt=0)
    max_close_periods: int = Field(2016, ge=1)
    kafka: KafkaClientSettings = Field(default_factory=load_settings)
    broker_probe_interval_s: float = Field(default=5.0, gt=0)
    reconnect_backoff_max_s: float = Field(default=30.0, gt=0)
    offset_recheck_s: float = Field(default=30.0, gt=0)
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    metrics_addr: str = "127.0.0.1"
