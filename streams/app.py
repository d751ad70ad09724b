"""The faust-streaming app: input topics -> validate -> world model -> period decisions -> audit topic.

One agent consumes the five input topics in micro-batches (`take_events`; faust acks a batch only after
the loop body has handled it, so Kafka offsets never run ahead of the DuckDB state). Per batch, in order:
dead letters are published and their delivery awaited; rows, offsets, clock and counts are committed in
one DuckDB transaction; every decision now due is made and its audit record published (delivery
awaited) before the period is marked decided. Nothing is kept in faust tables (BROKER.md: Tansu's
end_offsets bug can lose table state on restore); at-least-once, no transactions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import faust

from sinks.base import AuditSink
from streams.decide import Decider, DecisionInput
from streams.ingest import Ingestor
from streams.pipeline import Inbound, Outbound, Pipeline
from streams.settings import WorkerSettings
from streams.topics import Topics

log = logging.getLogger("aurelius.worker")


class Worker:
    """The per-batch driver around `Pipeline`, independent of faust's types (see module doc).

    Parameters
    ----------
    pipeline : validation and clock.
    ingestor : durable state.
    decider_factory : builds the decider from period 0's start (UTC) at the first decision.
    audit : the local audit log the worker also writes (idempotent on decision id), or None.
    send : coroutine that produces one `Outbound` and returns once the broker has it.
    """

    def __init__(self, pipeline: Pipeline, ingestor: Ingestor, decider_factory: Callable[[datetime], Decider],
                 audit: AuditSink | None, send: Callable[[Outbound], Awaitable[None]]) -> None:
        self.pipeline = pipeline
        self.ingestor = ingestor
        self.decider_factory = decider_factory
        self.decider: Decider | None = None
        self.audit = audit
        self.send = send
        self.decision_latency_s: list[float] = []

    async def handle(self, records: Sequence[Inbound]) -> None:
        """Process one micro-batch end to end (publish dead letters, commit, decide)."""
        received = time.monotonic()
        res = self.pipeline.step(records)
        await asyncio.gather(*(self.send(o) for o in res.dead_letters))
        await asyncio.to_thread(self.ingestor.commit, res.batch)
        await self.decide(res.due)
        self.decision_latency_s.extend([time.monotonic() - received] * len(res.due))

    async def decide(self, periods: Sequence[int]) -> None:
        """Decide for each period; publish the audit records, write them locally, then mark them decided."""
        for period in periods:
            await self._decide_one(period)
        if periods:
            if self.audit is not None:
                await asyncio.to_thread(self.audit.flush)
            await asyncio.to_thread(self.ingestor.mark_decided, periods[-1])
            self.pipeline.state.decided_through = periods[-1]

    async def _decide_one(self, period: int) -> None:
        clock = self.pipeline.clock
        if self.decider is None:
            assert clock.origin is not None
            self.decider = self.decider_factory(clock.origin)
        observations, late = await asyncio.to_thread(self.ingestor.observations, period)
        inp = DecisionInput(period, clock.start_of(period), observations, late)
        record = await asyncio.to_thread(self.decider.decide, inp)
        ts_ms = int(inp.period_start.timestamp() * 1000)
        topic = self.pipeline.topics.recommendations.name
        await self.send(Outbound(topic, record["decision_id"].encode(), json.dumps(record).encode(),
                                 timestamp_ms=ts_ms))
        if self.audit is not None:
            self.audit.add(record)
        log.info("decision period=%d id=%s late=%d", period, record["decision_id"], late)

    def stats(self) -> dict[str, Any]:
        """Counters and clock position, as logged every `stats_interval_s`."""
        st = self.pipeline.state
        lat = sorted(self.decision_latency_s)
        return {
            "counts": dict(st.counts), "closed_through": st.closed_through,
            "decided_through": st.decided_through,
            "watermark": str(self.pipeline.clock.watermark()), "decisions": len(lat),
            "decision_latency_p95_s": lat[int(0.95 * (len(lat) - 1))] if lat else None,
        }


def build_app(settings: WorkerSettings, worker_factory: Any) -> faust.App:
    """The faust app; `worker_factory(send) -> Worker` is called once the producer exists.

    Parameters
    ----------
    settings : worker settings (broker, topics, timers, batch sizes).
    worker_factory : builds the `Worker` given the `send` coroutine.
    """
    topics = Topics(prefix=settings.topic_prefix)
    app = faust.App(
        settings.group_id,
        broker=[f"kafka://{b}" for b in settings.bootstrap_servers.split(",")],
        processing_guarantee="at_least_once",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_allow_declare=False,
        datadir=str(Path(settings.db).resolve().parent / f".{settings.group_id}.faust"),
    )
    source = app.topic(*(t.name for t in topics.inputs()), key_type=bytes, value_type=bytes)
    out = {t.name: app.topic(t.name, key_type=bytes, value_type=bytes)
           for t in (topics.dead_letters, topics.recommendations)}

    async def send(o: Outbound) -> None:
        fut = await out[o.topic].send(
            key=o.key, value=o.value, headers=list(o.headers),
            timestamp=None if o.timestamp_ms is None else o.timestamp_ms / 1000, force=True,
        )
        await fut

    state: dict[str, Worker] = {}

    @app.agent(source, name=f"{settings.group_id}-ingest")
    async def ingest(stream: faust.StreamT) -> None:
        worker = state.setdefault("w", worker_factory(send))
        await worker.decide(worker.pipeline.due_decisions())
        async for events in stream.take_events(settings.batch_max_records, within=settings.batch_max_s):
            await worker.handle([Inbound(e.message.topic, e.message.partition, e.message.offset,
                                         e.message.value) for e in events])

    @app.timer(settings.stats_interval_s)
    async def report() -> None:
        if "w" in state:
            print("aurelius.stats " + json.dumps(state["w"].stats()), flush=True)

    return app
