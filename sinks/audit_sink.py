"""`aurelius audit-sink`: the audit topic -> the Parquet audit log, idempotent on decision id.

Checkpoint order as in quixstreams: add a polled batch to the store, flush it (one immutable file),
then commit the consumer offsets. A crash before the commit re-delivers the batch; the store skips the
decision ids it already holds, so no row is lost and none duplicated. A record that is not a valid audit
record is dead-lettered (never silently dropped); a full store buffer (backpressure) is flushed and the
add retried after the wait it asks for.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from schemas import SchemaError, decode
from schemas.dead_letter import DeadLetter
from schemas.kafka_client import KafkaClientSettings, client_kwargs, close_client, settings_from_args, start_client
from schemas.topics import Topics, ensure_topics
from sinks.audit_store import ParquetAuditStore
from sinks.base import AuditSink, SinkBackpressureError


async def _add(store: AuditSink, record: dict[str, Any], offset: int) -> None:
    while True:
        try:
            store.add(record, offset)
            return
        except SinkBackpressureError as exc:
            await asyncio.to_thread(store.flush)
            await asyncio.sleep(exc.retry_after_s)


async def consume(bootstrap_servers: str, topics: Topics, store: AuditSink, group_id: str | None = None,
                  stop: asyncio.Event | None = None, poll_ms: int = 500,
                  kafka: KafkaClientSettings | None = None) -> int:
    """Consume the audit topic into `store` until `stop` is set; return audit records added.

    Parameters
    ----------
    bootstrap_servers : Kafka bootstrap servers.
    topics : the deployment's topics (audit and dead-letter topic names).
    store : the sink (Parquet store, or MemorySink in tests).
    group_id : consumer group, default `<topic prefix>audit-sink`; its committed offsets say what the
        store already holds.
    stop : set it to stop after the current batch; None runs until cancelled.
    poll_ms : longest wait for a batch (ms).
    kafka : security and start-up retry of the clients (schemas.kafka_client); None: env `KAFKA_*`. No broker
        within its `startup_timeout_s` raises `KafkaUnavailable`.
    """
    from aiokafka import (  # lazy: the Kafka client loads only where a command talks to a broker
        AIOKafkaConsumer,
        AIOKafkaProducer,
    )

    await ensure_topics(bootstrap_servers, topics.all(), kafka=kafka)
    consumer = await start_client(lambda: AIOKafkaConsumer(
        topics.recommendations.name, **client_kwargs(kafka, bootstrap_servers),
        group_id=group_id or f"{topics.prefix}audit-sink",
        enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
        heartbeat_interval_ms=1000, rebalance_timeout_ms=6000,
    ), kafka, bootstrap_servers, "audit-sink consumer")
    try:
        producer = await start_client(
            lambda: AIOKafkaProducer(**client_kwargs(kafka, bootstrap_servers), enable_idempotence=False, acks="all"),
            kafka, bootstrap_servers, "dead-letter producer")
    except BaseException:
        await close_client(consumer)
        raise
    stop = stop or asyncio.Event()
    added = 0
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=poll_ms, max_records=1000)
            if not batches:
                continue
            for msgs in batches.values():
                for m in msgs:
                    try:
                        record = decode("audit_record", m.value)
                    except SchemaError as exc:
                        dl = DeadLetter.build(m.value, m.topic, m.partition, m.offset, exc)
                        await producer.send_and_wait(topics.dead_letters.name, dl.value(), headers=dl.headers)
                        continue
                    await _add(store, record, m.offset)
                    added += 1
            await asyncio.to_thread(store.flush)
            await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()
    return added


def run(args: argparse.Namespace) -> int:
    kafka = settings_from_args(args)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        store = ParquetAuditStore(args.audit_dir)
        n = await consume(args.bootstrap_servers, Topics(prefix=args.topic_prefix), store, stop=stop, kafka=kafka)
        print(f"audit-sink: stopped after {n} audit records into {args.audit_dir}", flush=True)

    asyncio.run(main())
    return 0
