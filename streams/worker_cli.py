"""`aurelius worker`: build the settings, state, decider and faust app; run until stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl
from faust.worker import Worker as FaustWorker

from optimizer.wiring import build_policy
from schemas.fleet import default_fleet
from schemas.kafka_client import settings_from_args as kafka_settings_from_args
from schemas.policy import History, PolicyContext
from schemas.topics import Topics, ensure_topics
from sinks.audit_store import ParquetAuditStore
from streams.app import Worker, build_app
from streams.decide import Decider, PolicyDecider
from streams.fieldmap import FieldMap
from streams.ingest import DuckDBIngestor
from streams.metrics import MetricsServer, WorkerMetrics
from streams.pipeline import Limits, Pipeline
from streams.replay.driver import workload_sla
from streams.settings import WorkerSettings
from streams.workload.builder import build_workload
from worldmodel.state import WorldState

log = logging.getLogger("aurelius.worker")


def policy_decider(settings: WorkerSettings, origin: datetime, world: WorldState) -> Decider:
    """The policy `settings.policy` as a Decider for one market, window starting at `origin`, no history,
    reading the worker's state `world`."""


    ctx = PolicyContext(fleet=default_fleet((settings.market,)), markets=(settings.market,), window_start=origin,
                        period_s=settings.period_s, periods=0, seed=settings.seed)
    empty = pl.DataFrame()
    policy = build_policy(settings.policy, seed=settings.seed, period_s=settings.period_s, world_state=world,
                          cost_basis=settings.cost_basis)
    return PolicyDecider(policy, ctx, History(empty, empty, empty))


@dataclass(frozen=True)
class ReplaySetup:
    """What the embedded replay gives its policy, rebuilt for the worker (see `replay_setup`).

    origin : the window start (UTC): period 0 of the worker's clock.
    decider : the policy with the replay's context and 7-day history.
    """

    origin: datetime
    decider: PolicyDecider


def replay_setup(settings: WorkerSettings, start: datetime | None = None,
                 world: WorldState | None = None) -> ReplaySetup:
    """The policy, context and history exactly as `aurelius replay` builds them (one site, `settings.market`).

    Parameters
    ----------
    settings : market, policy, period_s, year, window_rule, window_periods, seed.
    start : window start (UTC, on the hour); None: the window rule over `settings.year`.
    world : the worker's state, which the policy then reads (None: the policy keeps its own, as in the replay).
    """
    wl = build_workload(settings.market, settings.year, rule=settings.window_rule, start=start,  # type: ignore[arg-type]
                        periods=settings.window_periods, period_minutes=settings.period_s / 60.0, seed=settings.seed)
    window_s = (wl.window.end - wl.window.start).total_seconds()
    sla = workload_sla(wl)  # as the embedded replay gives its policies
    ctx = PolicyContext(fleet=default_fleet((settings.market,)), markets=(settings.market,),
                        window_start=wl.window.start, period_s=settings.period_s,
                        periods=int(round(window_s / settings.period_s)), seed=wl.seed, sla=sla)
    policy = build_policy(settings.policy, wl, settings.seed, period_s=settings.period_s,
                          window_periods=settings.window_periods, world_state=world, cost_basis=settings.cost_basis)
    return ReplaySetup(wl.window.start, PolicyDecider(policy, ctx, wl.history))


def serve(settings: WorkerSettings, decider_factory: Callable[[WorkerSettings, datetime, WorldState], Decider],
          origin: datetime | None = None) -> int:
    """Run the worker until SIGINT/SIGTERM.

    Parameters
    ----------
    settings : worker settings.
    decider_factory : builds the decider from the settings, period 0's start (UTC) and the worker's state (the
        one world state the policy reads), at the first decision.
    origin : start of period 0 (UTC); None: the stored one, else the first record's period.

    The metrics endpoint (`/metrics`, `/healthz`, `/readyz` on `settings.metrics_addr:metrics_port`, streams/metrics.py)
    serves from just before the faust worker starts. A port that cannot be bound (another process has it) is one
    ERROR line, and the worker runs without the endpoint: its decisions matter more, and the scrape target and
    readiness probe that find nothing there report it.
    """
    topics = Topics(prefix=settings.topic_prefix)
    # start-up connection: bounded retry (settings.kafka.startup_timeout_s), then KafkaUnavailable (one line)
    asyncio.run(ensure_topics(settings.bootstrap_servers, topics.all(), kafka=settings.kafka))
    field_map = None
    if settings.field_map:

        field_map = FieldMap.load(None if settings.field_map == "default" else settings.field_map)
    ingestor = DuckDBIngestor.open(settings.db)
    if settings.history_from_replay:
        setup = replay_setup(settings, origin, ingestor.world)
        origin = setup.origin
        decider_factory = lambda _s, _o, _w: setup.decider  # noqa: E731
    pipeline = Pipeline(topics, ingestor.load_state(), settings.period_s, settings.allowed_lateness_s, origin,
                        field_map=field_map, limits=Limits.from_settings(settings))

    audit = ParquetAuditStore(settings.audit_dir)
    metrics = WorkerMetrics(topics)
    app = build_app(
        settings, lambda send: Worker(pipeline, ingestor, lambda o: decider_factory(settings, o, ingestor.world), audit,
                                  send, metrics)
    )

    server = None
    if settings.metrics_port:
        try:
            server = MetricsServer(metrics, settings.metrics_addr, settings.metrics_port)
        except OSError as exc:
            log.error("cannot serve /metrics, /healthz, /readyz on %s:%d (%s); running without them "
                      "(AURELIUS_METRICS_PORT chooses another port, 0 disables)", settings.metrics_addr,
                      settings.metrics_port, exc)
    try:
        FaustWorker(app, loglevel=logging.WARNING, quiet=True).execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        if server is not None:
            server.close()
        ingestor.close()
    return 0


#: Flags of `aurelius worker` that map onto `WorkerSettings` fields when given (None: env, then default).
_OPTIONAL = ("period_s", "allowed_lateness_s", "group_id", "field_map", "history_from_replay", "year",
             "window_rule", "seed", "cost_basis")


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    """Command-line flags over env `AURELIUS_*` over defaults (Kafka security: flags over env `KAFKA_*`)."""
    given: dict[str, Any] = {k: getattr(args, k) for k in ("bootstrap_servers", "db", "audit_dir", "market",
                                                            "policy")}
    given["kafka"] = kafka_settings_from_args(args)
    given["topic_prefix"] = args.topic_prefix
    for name in _OPTIONAL:
        if getattr(args, name, None) not in (None, False):
            given[name] = getattr(args, name)
    if getattr(args, "periods", None) is not None:
        given["window_periods"] = args.periods
    return WorkerSettings(**given)


def run(args: argparse.Namespace) -> int:
    start = getattr(args, "start", None)
    origin = datetime.fromisoformat(start.replace("Z", "+00:00")) if start else None
    return serve(settings_from_args(args), policy_decider, origin=origin)
