"""The faust-streaming app: input topics -> validate -> world model -> period decisions -> audit topic.

One app task consumes the five input topics in micro-batches through an aiokafka consumer (`getmany`)
and seeks to the positions stored in DuckDB on every assignment, so consumption never runs ahead of the
durable state. Per batch, in order: dead letters are published and their delivery awaited; records,
positions, clock, counts and the worker's ledger are committed in one DuckDB transaction; every decision
now due is made and stored with its decided mark in the outbox (streams/ingest.py), in one transaction, then
copied to the audit topic (delivery awaited) and the local audit log before the outbox row is marked published.
Nothing is kept in faust tables (BROKER.md: Tansu's end_offsets bug can lose table state on restore);
at-least-once, no transactions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import faust
from aiokafka import TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from aiokafka.structs import OffsetAndMetadata

from schemas.timestamps import ts_from_wire
from schemas.topics import Topics
from sinks.base import AuditSink
from streams.clock import Gap
from streams.decide import Decider, DecisionInput
from streams.ingest import IngestBatch, Ingestor
from streams.kafka_link import (
    BrokerLink,
    InputConsumer,
    connect_with_backoff,
    faust_credentials,
    install_repeat_filter,
    publish_with_retry,
    short_reason,
)
from streams.metrics import WorkerMetrics
from streams.pipeline import Inbound, Outbound, Pipeline
from streams.settings import WorkerSettings

log = logging.getLogger("aurelius.worker")


class Worker:
    """The per-batch driver around `Pipeline`, independent of the transport's types (see module doc).

    Batches are pipelined: batch N + 1 is validated while batch N commits and its decisions are made (in
    a thread; DuckDB and polars release the GIL), and batch N + 1 commits only after. Decisions are
    scheduled once (`scheduled_through`), so overlapping batches never decide a period twice.

    Parameters
    ----------
    pipeline : validation and clock.
    ingestor : durable state.
    decider_factory : builds the decider from period 0's start (UTC) at the first decision.
    audit : the local audit log, a copy of the outbox like the audit topic (idempotent on decision id), or None.
    send : coroutine that produces one `Outbound` and returns once the broker has it.
    metrics : the Prometheus metrics to update per batch and per decision (streams/metrics.py), or None.
    """

    def __init__(self, pipeline: Pipeline, ingestor: Ingestor, decider_factory: Callable[[datetime], Decider],
                 audit: AuditSink | None, send: Callable[[Outbound], Awaitable[None]],
                 metrics: WorkerMetrics | None = None) -> None:
        self.pipeline = pipeline
        self.ingestor = ingestor
        self.decider_factory = decider_factory
        self.decider: Decider | None = None
        self.audit = audit
        self.send = send
        self.scheduled_through = pipeline.state.decided_through
        self.committed: dict[tuple[str, int], int] = dict(pipeline.state.positions)
        self.decision_latency_s: list[float] = []
        self._inflight: asyncio.Task[None] | None = None
        self._recovered = False
        self._gap_of: dict[int, Gap] = {}
        self.metrics = metrics
        if metrics is not None:
            metrics.attach(self)

    async def handle(self, records: Sequence[Inbound]) -> None:
        """Process one micro-batch end to end (publish dead letters, commit, decide) and wait for it."""
        await self.submit(records)
        await self.drain()

    async def submit(self, records: Sequence[Inbound], received: float | None = None,
                     active: Collection[tuple[str, int]] | None = None) -> None:
        """Validate a batch and publish its dead letters; commit and decide it once the previous one is done.

        Parameters
        ----------
        records : the consumed records, in order.
        received : monotonic time (s) the batch was polled; the close latency is measured from it.
        active : partitions with records still to deliver (the watermark waits for them); None: none.
        """
        received = time.monotonic() if received is None else received
        if not self._recovered:  # decisions a crashed run stored but had not published
            self._recovered = True
            await self.publish_outbox()
        before = dict(self.pipeline.state.positions) if self.metrics is not None else None
        res = self.pipeline.step(records, active)
        # a gap in the stream (periods closed without a record) gets one 'no data' decision, its last
        skip: set[int] = set()
        for gap in res.gaps:
            *quiet, last = gap.decisions
            skip.update(quiet)
            self._gap_of[last] = gap
        due = [p for p in res.due if p > self.scheduled_through and p not in skip]
        if due:
            self.scheduled_through = due[-1]
        await asyncio.gather(*(self.send(o) for o in res.dead_letters))
        accepted = None if self.metrics is None else self.metrics.consumed(records, res.dead_letters, before, active)
        await self.drain()
        self._inflight = asyncio.create_task(self._commit_and_decide(res.batch, due, received, accepted))

    async def drain(self) -> None:
        """Wait until the batch in flight is committed and its decisions published."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def _commit_and_decide(self, batch: IngestBatch, due: list[int], received: float,
                                 accepted: Mapping[str, int] | None = None) -> None:
        if batch.size or due or batch.state.positions != self.committed:
            await asyncio.to_thread(self.ingestor.commit, batch)
            # the commit counts the batch's duplicates; a batch not committed holds the count as it stood when
            # it was validated, before the batch ahead of it committed
            self.pipeline.state.counts["duplicates"] = batch.state.counts["duplicates"]
        self.committed = batch.state.positions
        await self.decide(due)
        latency = time.monotonic() - received
        self.decision_latency_s.extend([latency] * len(due))
        if self.metrics is not None:
            await self.metrics.committed(accepted, latency, len(due))

    async def decide(self, periods: Sequence[int]) -> None:
        """Decide for each period into the outbox (record and decided mark in one transaction), then publish."""
        for period in periods:
            await self._decide_one(period)
            self.pipeline.state.decided_through = period
            self.scheduled_through = max(self.scheduled_through, period)
        await self.publish_outbox()

    async def publish_outbox(self) -> None:
        """Copy every unpublished outbox record to the audit topic and the local audit log, then mark them
        published (after a crash: the records the previous run decided but had not published)."""
        pending = await asyncio.to_thread(self.ingestor.unpublished)
        if not pending:
            return
        topic = self.pipeline.topics.recommendations.name
        for record in pending:
            ts_ms = int(ts_from_wire(record["period_start"]).timestamp() * 1000)
            await self.send(Outbound(topic, record["decision_id"].encode(), json.dumps(record).encode(),
                                     timestamp_ms=ts_ms))
            if self.audit is not None:
                self.audit.add(record)
        if self.audit is not None:
            await asyncio.to_thread(self.audit.flush)
        await asyncio.to_thread(self.ingestor.mark_published, [r["decision_id"] for r in pending])

    async def _decide_one(self, period: int) -> None:
        clock = self.pipeline.clock
        if self.decider is None:
            assert clock.origin is not None
            self.decider = await asyncio.to_thread(self.decider_factory, clock.origin)
            await asyncio.to_thread(self._catch_up, self.decider)
        observations, late = await asyncio.to_thread(self.ingestor.observations, period)
        inp = DecisionInput(period, clock.start_of(period), observations, late)
        t0 = time.perf_counter()
        record = await asyncio.to_thread(self.decider.decide, inp)
        decide_s = time.perf_counter() - t0
        gap = self._gap_of.pop(period, None)
        if gap is not None:  # the decisions it stands for are not made (the decided mark passes them)
            record["gap"] = {"first_period": gap.first, "last_period": gap.last, "decisions_skipped": gap.periods - 1}
        record = await asyncio.to_thread(self.ingestor.record_decision, period, record)
        if self.metrics is not None:
            self.metrics.decided(record, decide_s)
        log.info("decision period=%d id=%s late=%d", period, record["decision_id"], late)

    def _catch_up(self, decider: Decider) -> None:
        """Rebuild a new decider's state after a restart: give it, in order, the inputs of every decision the
        outbox holds (the world state's records, as each decision saw them) and discard what it decides; the
        stored decisions stand. A deterministic policy then decides the next period as an uninterrupted run
        would. Costs one decision's time per decided period (s each for aurelius)."""
        clock = self.pipeline.clock
        for period in self.ingestor.decided_periods():
            observations, late = self.ingestor.observations(period)
            decider.decide(DecisionInput(period, clock.start_of(period), observations, late))

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

    The input topics are consumed by one app task that owns an aiokafka consumer (`getmany` batches of up
    to `batch_max_records`), not by a faust agent: faust's per-event machinery cost ~300 us a record,
    the batch loop ~3. The consumer joins group `group_id`; on every assignment it seeks each partition to
    the position stored in DuckDB, so the durable state, not the broker's committed offsets, says where
    to resume (those are committed too, after each DuckDB commit, for lag monitoring). Audit records and
    dead letters go out through faust's producer (credentials from `settings.kafka`, as every other client);
    stats are a faust timer, with the broker link's state under `kafka` (streams/kafka_link.py).

    Parameters
    ----------
    settings : worker settings (broker, security, topics, timers, batch sizes).
    worker_factory : builds the `Worker` given the `send` coroutine.
    """
    topics = Topics(prefix=settings.topic_prefix)
    app = faust.App(
        f"{settings.group_id}.app",
        broker=[f"kafka://{b}" for b in settings.bootstrap_servers.split(",")],
        broker_credentials=faust_credentials(settings.kafka),
        processing_guarantee="at_least_once",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_interval_s,
        broker_rebalance_timeout=settings.rebalance_timeout_s,
        producer_acks=-1,
        producer_linger=0.0,
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_allow_declare=False,
        datadir=str(Path(settings.db).resolve().parent / f".{settings.group_id}.faust"),
    )

    async def send_once(o: Outbound) -> None:  # faust's producer, awaited directly: a failure is one exception
        await app.producer.send_and_wait(o.topic, o.key, o.value, partition=None, headers=list(o.headers),
                                         timestamp=None if o.timestamp_ms is None else o.timestamp_ms / 1000)

    async def send(o: Outbound) -> None:  # through an outage: retried with backoff (keyed, idempotent sinks)
        await publish_with_retry(lambda: send_once(o), f"publish to {o.topic}", settings.reconnect_backoff_max_s)

    state: dict[str, Worker] = {}
    link = BrokerLink(settings.bootstrap_servers)

    @app.task
    async def consume() -> None:
        worker = state.setdefault("w", worker_factory(send))
        await worker.decide(worker.pipeline.due_decisions())
        await consume_loop(settings, topics, worker, link=link)

    @app.timer(settings.stats_interval_s)
    async def report() -> None:
        if "w" in state:
            print("aurelius.stats " + json.dumps({**state["w"].stats(), "kafka": link.snapshot()}), flush=True)

    return app


async def consume_loop(settings: WorkerSettings, topics: Topics, worker: Worker,
                       stop: asyncio.Event | None = None, link: BrokerLink | None = None) -> None:
    """Poll the input topics in batches into `worker` until cancelled (or `stop` is set).

    Each connection is a `streams.kafka_link.InputConsumer`: on every assignment it places each partition
    at its stored position after checking it against the broker (a position the partition no longer has is
    a reported gap, resumed from the earliest available offset); a lost broker closes it, and it is reopened
    with exponential backoff (docs/streaming.md, "Broker faults").

    Parameters
    ----------
    settings : bootstrap servers, Kafka security, group, timers, batch sizes, probe interval and backoff.
    topics : the deployment's topics.
    worker : the per-batch driver.
    stop : set it to return after the current batch; None runs until cancelled.
    link : the connection state the stats line reports; None: a new one.
    """

    stop = stop or asyncio.Event()
    link = link if link is not None else BrokerLink(settings.bootstrap_servers)
    if worker.metrics is not None:  # its state is loaded: readiness follows the link from now on
        worker.metrics.started(link)
    install_repeat_filter()
    worker.pipeline.state.counts.setdefault("offset_gaps", 0)
    try:
        while not stop.is_set():
            session = await connect_with_backoff(lambda: InputConsumer(settings, topics, worker, link).open(),
                                                 link, stop, settings.reconnect_backoff_max_s)
            if session is None:
                break
            consumer = session.consumer
            last_commit, commit_warned = time.monotonic(), -60.0
            try:
                while not stop.is_set() and session.lost is None:
                    await session.settle()  # check the positions the last assignment placed
                    try:
                        batches = await consumer.getmany(timeout_ms=int(settings.batch_max_s * 1000),
                                                         max_records=settings.batch_max_records)
                    except OffsetOutOfRangeError as exc:  # Apache Kafka: a position left the log
                        await session.out_of_range(exc.args[0])
                        continue
                    except NoOffsetForPartitionError as exc:  # no stored and no committed offset
                        await consumer.seek_to_beginning(exc.args[0])
                        continue
                    received = time.monotonic()
                    records = [Inbound(m.topic, m.partition, m.offset, m.value, tuple(m.headers or ()))
                               for msgs in batches.values() for m in msgs]
                    positions, seen = worker.pipeline.state.positions, session.seen
                    for m in records:
                        seen[(m.topic, m.partition)] = m.offset
                    active, highwater = set(), {}
                    for tp in consumer.assignment():
                        hw = consumer.highwater(tp)
                        key = (tp.topic, tp.partition)
                        highwater[key] = hw
                        if hw is None or max(positions.get(key, -1), seen.get(key, -1)) + 1 < hw:
                            active.add(key)
                    if worker.metrics is not None:
                        worker.metrics.lag(highwater, positions, seen)
                    await worker.submit(records, received, active)  # an empty batch may still close periods
                    if not records:
                        await session.idle_check()
                    if time.monotonic() - last_commit > 1.0 and worker.committed and session.lost is None:
                        last_commit = time.monotonic()
                        offsets = {TopicPartition(t, p): OffsetAndMetadata(o + 1, "")
                                   for (t, p), o in worker.committed.items()
                                   if TopicPartition(t, p) in consumer.assignment()}
                        if offsets:
                            try:
                                await asyncio.wait_for(consumer.commit(offsets), 5.0)  # never stall the loop
                            except Exception as exc:  # advisory only: DuckDB holds the positions that count
                                if last_commit - commit_warned > 60.0:  # once a minute, not every second
                                    commit_warned = last_commit
                                    log.warning("offset commit failed (DuckDB positions stand): %s",
                                                short_reason(exc))
            finally:  # after `session.lost` (the watcher has reported it): reconnect with backoff
                await session.close()
    finally:
        await asyncio.shield(worker.drain())
