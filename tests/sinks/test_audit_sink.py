"""The audit sink's consume loop (sinks/audit_sink.py) without a broker: dead letters and backpressure.

aiokafka's consumer and producer are replaced by scripted fakes (consume imports them when it runs), so the
loop's own logic is what runs: decode each audit record, dead-letter what fails with its reason and keep
going, add the rest to the store (flushing and waiting on backpressure), flush, then commit.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from types import SimpleNamespace

import aiokafka
import pyarrow.parquet as pq

import sinks.audit_sink as audit_sink
from schemas.topics import Topics
from sinks.audit_store import FILE_GLOB, ParquetAuditStore
from sinks.base import SinkBackpressureError
from sinks.memory import MemorySink

T0 = "2023-07-01T12:00:00Z"


def _audit(decision_id: str, period: int = 0) -> dict:
    return {
        "schema_version": "1", "decision_id": decision_id, "policy": "aurelius", "markets": ["PJM"],
        "period_index": period, "period_start": T0, "as_of": T0, "inputs": {}, "forecasts": {},
        "candidates_evaluated": 1, "top_candidates": [], "gates": [{"name": "sla", "passed": True, "reason": "ok"}],
        "chosen_plan": {"label": "a"}, "fallback": False, "fallback_reason": None,
        "reference_plan": {"label": "prod"}, "predicted_delta": {}, "regret": 0.0, "realized": None,
    }


def _enc(record: dict) -> bytes:
    return json.dumps(record).encode()


class Broker:
    """Scripted stand-ins for AIOKafkaConsumer / AIOKafkaProducer; `log` records what the loop did, in order."""

    def __init__(self, batches: list[list[bytes | None]], topic: str, stop: asyncio.Event, store=None) -> None:
        self.batches = list(batches)
        self.topic = topic
        self.stop = stop
        self.store = store
        self.sent: list[SimpleNamespace] = []
        self.log: list[tuple] = []
        self.offset = 0
        broker = self

        class Consumer:
            def __init__(self, *topics, **kw):
                broker.log.append(("subscribe", topics, kw.get("enable_auto_commit")))

            async def start(self):
                pass

            async def stop(self):
                broker.log.append(("consumer-stop",))

            async def getmany(self, timeout_ms=0, max_records=None):
                if not broker.batches:
                    broker.stop.set()
                    return {}
                msgs = []
                for v in broker.batches.pop(0):
                    msgs.append(SimpleNamespace(topic=broker.topic, partition=0, offset=broker.offset, value=v))
                    broker.offset += 1
                return {("tp", 0): msgs}

            async def commit(self):
                held = None if broker.store is None else len(broker.store)
                broker.log.append(("commit", broker.offset, held))

        class Producer:
            def __init__(self, **kw):
                pass

            async def start(self):
                pass

            async def stop(self):
                broker.log.append(("producer-stop",))

            async def send_and_wait(self, topic, value, headers=None, **kw):
                broker.sent.append(SimpleNamespace(topic=topic, value=value, headers=list(headers or [])))
                broker.log.append(("dead-letter", json.loads(value)["source_offset"]))

        self.Consumer, self.Producer = Consumer, Producer


def _run(monkeypatch, topics: Topics, store, batches, timeout_s: float = 10.0) -> tuple[int, Broker]:
    async def no_topics(*a, **kw):
        return None

    async def go() -> tuple[int, Broker]:
        stop = asyncio.Event()
        broker = Broker(batches, topics.recommendations.name, stop, store if isinstance(store, MemorySink) else None)
        monkeypatch.setattr(aiokafka, "AIOKafkaConsumer", broker.Consumer)
        monkeypatch.setattr(aiokafka, "AIOKafkaProducer", broker.Producer)
        monkeypatch.setattr(audit_sink, "ensure_topics", no_topics)
        n = await asyncio.wait_for(audit_sink.consume("fake:9092", topics, store, stop=stop, poll_ms=1), timeout_s)
        return n, broker

    return asyncio.run(go())


# --- dead letters --------------------------------------------------------------------------------------------


def test_malformed_audit_records_are_dead_lettered_with_their_reason_and_the_sink_keeps_going(monkeypatch, tmp_path):
    topics = Topics(prefix="as.")
    no_gate_reason = dict(_audit("d-bad"), gates=[{"name": "sla", "passed": True}])
    no_id = {k: v for k, v in _audit("d-none").items() if k != "decision_id"}
    bad = [b"{not json", _enc(no_gate_reason), _enc(no_id)]
    batch1 = [_enc(_audit("d0", 0)), bad[0], _enc(_audit("d1", 1)), bad[1]]
    batch2 = [bad[2], _enc(_audit("d2", 2))]
    store = ParquetAuditStore(tmp_path)
    added, broker = _run(monkeypatch, topics, store, [batch1, batch2])

    assert added == 3  # every valid record after a bad one is still stored
    rows = [r for f in sorted(tmp_path.glob(FILE_GLOB)) for r in pq.read_table(f).to_pylist()]
    assert sorted((r["decision_id"], r["kafka_offset"]) for r in rows) == [("d0", 0), ("d1", 2), ("d2", 5)]
    assert all(not d.startswith("d-") for d in (r["decision_id"] for r in rows))

    assert [m.topic for m in broker.sent] == [topics.dead_letters.name] * 3
    bodies = [json.loads(m.value) for m in broker.sent]
    assert [b["source_offset"] for b in bodies] == [1, 3, 4]
    assert [base64.b64decode(b["original_value_b64"]) for b in bodies] == bad  # byte-exact
    assert all(b["source_topic"] == topics.recommendations.name for b in bodies)
    assert "invalid JSON" in bodies[0]["reason"]
    assert "gates[0].reason" in bodies[1]["reason"]
    assert "decision_id" in bodies[2]["reason"]
    headers = dict(broker.sent[1].headers)
    assert headers["kafka_dlt-original-topic"] == topics.recommendations.name.encode()
    assert struct.unpack(">q", headers["kafka_dlt-original-offset"])[0] == 3
    assert headers["__connect.errors.exception.message"].decode() == bodies[1]["reason"]

    # dead letters are sent before the batch is committed, and every batch is committed
    log = [e for e in broker.log if e[0] in ("dead-letter", "commit")]
    assert log == [("dead-letter", 1), ("dead-letter", 3), ("commit", 4, None), ("dead-letter", 4), ("commit", 6, None)]
    assert broker.log[0] == ("subscribe", (topics.recommendations.name,), False)


def test_a_redelivered_batch_adds_no_duplicate_rows(monkeypatch, tmp_path):
    """At-least-once delivery: the same records again (a crash before the commit) add nothing new."""
    topics = Topics(prefix="as.")
    batch = [_enc(_audit("d0")), _enc(_audit("d1", 1))]
    store = ParquetAuditStore(tmp_path)
    _, broker = _run(monkeypatch, topics, store, [batch, batch])
    ids = [i for f in tmp_path.glob(FILE_GLOB) for i in pq.read_table(f).column("decision_id").to_pylist()]
    assert sorted(ids) == ["d0", "d1"]  # stored once
    assert [e for e in broker.log if e[0] == "commit"] == [("commit", 2, None), ("commit", 4, None)]


def test_a_tombstone_on_the_audit_topic_is_dead_lettered(monkeypatch, tmp_path):
    topics = Topics(prefix="as.")
    store = ParquetAuditStore(tmp_path)
    added, broker = _run(monkeypatch, topics, store, [[None, _enc(_audit("d0"))]])
    assert added == 1 and [json.loads(m.value)["source_offset"] for m in broker.sent] == [0]


# --- backpressure --------------------------------------------------------------------------------------------


class SmallBuffer(MemorySink):
    """A MemorySink that holds at most `cap` pending records, like ParquetAuditStore(max_pending=cap)."""

    def __init__(self, cap: int, retry_after_s: float) -> None:
        super().__init__()
        self.cap = cap
        self.retry_after_s = retry_after_s
        self.events: list[tuple] = []

    def add(self, record, offset=None) -> bool:
        if len(self._pending) >= self.cap:
            self.events.append(("full", str(record["decision_id"])))
            raise SinkBackpressureError(self.retry_after_s, len(self._pending))
        self.events.append(("add", str(record["decision_id"])))
        return super().add(record, offset)

    def flush(self) -> int:
        n = super().flush()
        self.events.append(("flush", n))
        return n


def test_backpressure_flushes_waits_and_retries_without_dropping(monkeypatch):
    topics = Topics(prefix="as.")
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay, *a, **kw):
        waits.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    store = SmallBuffer(cap=2, retry_after_s=0.125)
    added, broker = _run(monkeypatch, topics, store, [[_enc(_audit(f"d{i}", i)) for i in range(5)]])

    assert added == 5
    assert [r["decision_id"] for r in store] == [f"d{i}" for i in range(5)]  # in order, none lost or doubled
    assert store.offsets == [0, 1, 2, 3, 4]
    assert store.events == [
        ("add", "d0"), ("add", "d1"), ("full", "d2"), ("flush", 2), ("add", "d2"), ("add", "d3"),
        ("full", "d4"), ("flush", 2), ("add", "d4"), ("flush", 1),
    ]
    assert waits == [0.125, 0.125]  # the wait the sink asked for, once per full buffer
    assert [e for e in broker.log if e[0] == "commit"] == [("commit", 5, 5)]  # committed after all is durable
    assert broker.sent == []


def test_backpressure_from_the_parquet_store_keeps_every_row(monkeypatch, tmp_path):
    topics = Topics(prefix="as.")
    store = ParquetAuditStore(tmp_path, max_pending=3, retry_after_s=0.0)
    added, _ = _run(monkeypatch, topics, store, [[_enc(_audit(f"d{i}", i)) for i in range(8)]])
    assert added == 8
    files = sorted(tmp_path.glob(FILE_GLOB))
    sizes = sorted(pq.read_metadata(f).num_rows for f in files)
    assert sizes == [2, 3, 3]  # two flushes forced by the full buffer, then the batch's own
    offsets = sorted(o for f in files for o in pq.read_table(f).column("kafka_offset").to_pylist())
    assert offsets == list(range(8))
