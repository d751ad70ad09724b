"""`aurelius worker`: build the settings, state, decider and faust app; run until stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from sinks.audit_store import ParquetAuditStore
from streams.app import Worker, build_app
from streams.decide import Decider, PolicyDecider
from streams.ingest import DuckDBIngestor
from streams.pipeline import Pipeline
from streams.settings import WorkerSettings
from streams.topics import Topics, ensure_topics


def policy_decider(settings: WorkerSettings, origin: datetime) -> Decider:
    """The registered policy `settings.policy` as a Decider for one market, window starting at `origin`."""
    import polars as pl

    from optimizer.policy import History, PolicyContext, create
    from worldmodel.fleet import default_fleet

    ctx = PolicyContext(fleet=default_fleet(), markets=(settings.market,), window_start=origin,
                        period_s=settings.period_s, periods=0, seed=0)
    empty = pl.DataFrame()
    return PolicyDecider(create(settings.policy), ctx, History(empty, empty, empty))


def serve(settings: WorkerSettings, decider_factory: Callable[[WorkerSettings, datetime], Decider],
          origin: datetime | None = None) -> int:
    """Run the worker until SIGINT/SIGTERM.

    Parameters
    ----------
    settings : worker settings.
    decider_factory : builds the decider from the settings and period 0's start (UTC), at the first decision.
    origin : start of period 0 (UTC); None: the stored one, else the first record's period.
    """
    topics = Topics(prefix=settings.topic_prefix)
    asyncio.run(ensure_topics(settings.bootstrap_servers, topics.all()))
    ingestor = DuckDBIngestor.open(settings.db)
    pipeline = Pipeline(topics, ingestor.load_state(), settings.period_s, settings.allowed_lateness_s, origin)

    audit = ParquetAuditStore(settings.audit_dir)
    app = build_app(
        settings, lambda send: Worker(pipeline, ingestor, lambda o: decider_factory(settings, o), audit, send)
    )
    from faust.worker import Worker as FaustWorker

    try:
        FaustWorker(app, loglevel=logging.WARNING, quiet=True).execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        ingestor.close()
    return 0


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    """Command-line flags over env `AURELIUS_*` over defaults."""
    given = {k: getattr(args, k) for k in ("bootstrap_servers", "db", "audit_dir", "market", "policy")}
    given["topic_prefix"] = args.topic_prefix
    for name in ("period_s", "allowed_lateness_s", "group_id"):
        if getattr(args, name, None) is not None:
            given[name] = getattr(args, name)
    return WorkerSettings(**given)


def run(args: argparse.Namespace) -> int:
    start = getattr(args, "start", None)
    origin = datetime.fromisoformat(start.replace("Z", "+00:00")) if start else None
    return serve(settings_from_args(args), policy_decider, origin=origin)
