"""The hook for issue 7 item 8: the worker's decisions made in-process from an observation directory.

`replay_decisions` feeds a replay's `--emit-observations` directory through the same `Pipeline` and
`Worker` the faust app drives (validation, clock, ledger, world model, decider), with an in-memory
state and no broker, and returns the audit records in order. The equivalence test compares them
with (a) the records the Kafka worker publishes for the same directory and (b) the embedded replay's
decisions for the same data and seed, once the replay simulator exposes its per-period audit records.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from optimizer.wiring import build_policy
from schemas.fleet import default_fleet
from schemas.topics import Topics
from sinks.memory import MemorySink
from streams.app import Worker
from streams.decide import Decider
from streams.ingest import DuckDBIngestor
from streams.pipeline import Inbound, Outbound, Pipeline
from streams.publish import load_directory, ordered
from streams.replay.cli import emit_observations
from streams.replay.driver import run_replay
from streams.workload.builder import build_workload
from worldmodel.state import WorldState


def replay_decisions(directory: str | Path, decider_factory: Callable[[datetime, WorldState], Decider], period_s: float,
                     allowed_lateness_s: float, origin: datetime | None = None, batch_records: int = 5000,
                     restart_after_batches: int | None = None, db: str | Path = ":memory:") -> list[dict[str, Any]]:
    """Audit records of every decision the worker makes over `directory`, in period order.

    Parameters
    ----------
    directory : `OUT/observations/<kind>.parquet` (or `.jsonl`) as `aurelius publish --from-dir` reads.
    decider_factory : builds the decider from period 0's start and the worker's state (which the policy reads).
    period_s, allowed_lateness_s : the worker's clock (s).
    origin : start of period 0 (UTC); None: the first record's period.
    batch_records : micro-batch size (records); the decisions do not depend on it.
    restart_after_batches : stop the worker after this many batches and start a new one (a new decider) on
        the same DuckDB file `db`, as after a crash between two transactions; None: one worker throughout.
    db : the worker's state file (":memory:" unless restarting).
    """
    topics = Topics(prefix="embedded.")
    sink = MemorySink()  # the audit topic: it outlives a worker
    inbound = [Inbound(topics.for_kind(kind).name, 0, i, json.dumps(rec).encode())
               for i, (_, _, kind, rec) in enumerate(ordered(load_directory(directory)))]
    batches = [inbound[i:i + batch_records] for i in range(0, len(inbound), batch_records)]
    cut = len(batches) if restart_after_batches is None else restart_after_batches

    async def send(o: Outbound) -> None:
        return None

    async def run(part: list[list[Inbound]]) -> None:
        ingestor = DuckDBIngestor.open(db)
        pipeline = Pipeline(topics, ingestor.load_state(), period_s, allowed_lateness_s, origin)
        worker = Worker(pipeline, ingestor, lambda origin: decider_factory(origin, ingestor.world), sink, send)
        try:
            await worker.decide(pipeline.due_decisions())
            for batch in part:
                await worker.handle(batch)
        finally:
            ingestor.close()

    asyncio.run(run(batches[:cut]))
    if cut < len(batches):
        asyncio.run(run(batches[cut:]))
    return list(sink)


class _Recording:
    """A policy wrapper that keeps every plan it returns as a dict (the embedded replay keeps labels only)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = policy.name
        self.plans: list[dict[str, Any]] = []

    def start(self, ctx: Any, history: Any) -> Any:
        plan = self.policy.start(ctx, history)
        self.plans.append(plan.as_dict())
        return plan

    def plan(self, obs: Any) -> Any:
        plan = self.policy.plan(obs)
        self.plans.append(plan.as_dict())
        return plan

    def last_decision(self) -> dict[str, Any] | None:
        return self.policy.last_decision()


def embedded_replay(market: str, start: datetime, periods: int, policy: str, out: str | Path, seed: int = 0,
                    period_s: float = 300.0) -> list[dict[str, Any]]:
    """Run the embedded replay as `aurelius replay --emit-observations` does; return its plans per period.

    Writes the observation stream to `out/observations/<market>/<policy>/seed<seed>/` (the layout of
    `aurelius replay --emit-observations --out OUT`).

    Parameters
    ----------
    market : one market (one site).
    start : window start (UTC, on the hour).
    periods : control periods with arrivals (`--periods`, count).
    policy : policy name (`optimizer.wiring.build_policy`).
    out : output directory.
    seed : workload seed.
    period_s : control period (s).
    """

    wl = build_workload(market, start.year, start=start, periods=periods, period_minutes=period_s / 60.0, seed=seed)
    rec = _Recording(build_policy(policy, wl, seed, period_s=period_s, window_periods=periods))
    res = run_replay(wl, rec, default_fleet((market,)), period_s=period_s, keep_observations=True)  # type: ignore[arg-type]
    emit_observations(Path(out) / "observations" / market / policy / f"seed{seed}", res)
    return rec.plans
