"""The worker's Prometheus metrics and its /metrics, /healthz, /readyz endpoint (streams/metrics.py), no broker.

A `Worker` is driven as in test_kafka_worker_logic.py (in-memory DuckDB, a list as `send`); every value is read
back from the metrics' own registry.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest

from schemas.topics import Topics
from sinks.memory import MemorySink
from streams import metrics as metrics_mod
from streams.app import Worker
from streams.decide import DecisionInput
from streams.ingest import DuckDBIngestor
from streams.kafka_link import BrokerLink
from streams.metrics import DEAD_LETTER_REASONS, FALLBACK_REASONS, MetricsServer, WorkerMetrics, fallback_reason
from streams.pipeline import Inbound, Outbound, Pipeline
from streams.settings import WorkerSettings


class Decider:
    """Returns an audit record; `fallbacks` maps a period to the fallback reason its record carries."""

    def __init__(self, fallbacks: dict[int, str] | None = None) -> None:
        self.fallbacks = fallbacks or {}

    def decide(self, inp: DecisionInput) -> dict:
        why = self.fallbacks.get(inp.period_index)
        return {"decision_id": f"d{inp.period_index}", "period_index": inp.period_index,
                "period_start": inp.period_start.isoformat(), "fallback": why is not None, "fallback_reason": why}


def _make(decider=None):
    topics = Topics(prefix="x.")
    ing = DuckDBIngestor.open(":memory:")
    pipe = Pipeline(topics, ing.load_state(), period_s=60, allowed_lateness_s=5)
    sent: list[Outbound] = []

    async def send(o: Outbound) -> None:
        sent.append(o)

    m = WorkerMetrics(topics, rows_interval_s=0)
    worker = Worker(pipe, ing, lambda origin: decider or Decider(), MemorySink(), send, m)
    return topics, ing, worker, sent, m


def _val(m: WorkerMetrics, name: str, **labels) -> float | None:
    return m.registry.get_sample_value(name, labels)


def _msgs(topic: str, values, start=0):
    return [Inbound(topic, 0, start + i, v) for i, v in enumerate(values)]


def _enc(record: dict) -> bytes:
    return json.dumps(record).encode()


def test_counts_per_topic_and_reason_class_decisions_histograms_and_rows(records):
    topics, ing, worker, sent, m = _make()
    arrivals, prices = topics.request_arrivals.name, topics.prices.name
    t0 = records.T0
    good = [_enc(records.arrival(f"r{i}", t0 + timedelta(seconds=30 * i))) for i in range(6)]  # 0 .. 150 s
    bad = [b"{not json", _enc(dict(records.arrival("w", t0), input_tokens="many")),
           _enc(dict(records.arrival("x", t0), gpu_secret=1)), None,
           _enc(records.arrival("ahead", t0 + timedelta(days=30)))]
    price = records.price(t0 + timedelta(seconds=20))
    twice = json.dumps(price)[:-1].encode() + b', "lmp_usd_mwh": 1.0}'  # a repeated key
    asyncio.run(worker.handle(_msgs(arrivals, good + bad) + _msgs(prices, [_enc(price), twice])))

    assert _val(m, "aurelius_records_in_total", topic=arrivals) == 11
    assert _val(m, "aurelius_records_in_total", topic=prices) == 2
    assert _val(m, "aurelius_records_stored_total", topic=arrivals) == 6
    assert _val(m, "aurelius_records_stored_total", topic=prices) == 1
    assert _val(m, "aurelius_records_stored_total", topic=topics.gpu_telemetry.name) == 0  # present from the start
    dead = {(s.labels["topic"], s.labels["reason"]): s.value for f in m.registry.collect()
            if f.name == "aurelius_dead_letters" for s in f.samples if s.name.endswith("_total")}
    assert dead == {(arrivals, "invalid_json"): 1, (arrivals, "schema"): 1, (arrivals, "unknown_field"): 1,
                    (arrivals, "tombstone"): 1, (arrivals, "event_time_ahead"): 1, (prices, "duplicate_key"): 1}
    c = ing.load_state().counts
    assert (c["records_in"], c["processed"], c["dead_letters"]) == (13, 7, 6)  # the same story as the state's

    audit = [o for o in sent if o.topic == topics.recommendations.name]
    assert len(audit) >= 2
    assert _val(m, "aurelius_decisions_total") == len(audit)
    assert _val(m, "aurelius_decision_seconds_count") == len(audit)
    assert _val(m, "aurelius_period_close_to_audit_seconds_count") == len(audit)
    assert _val(m, "aurelius_decided_through_period") == ing.load_state().decided_through >= 1
    assert _val(m, "aurelius_fallbacks_total", reason="other") == 0
    assert _val(m, "aurelius_world_model_rows", table="request_arrival") == 6
    assert _val(m, "aurelius_world_model_rows", table="price") == 1
    assert _val(m, "aurelius_world_model_rows", table="gpu_telemetry") == 0
    ing.close()


def test_redelivered_records_are_not_counted_in_again(records):
    topics, ing, worker, _, m = _make()
    arrivals = topics.request_arrivals.name
    vals = [_enc(records.arrival(f"r{i}", records.T0 + timedelta(seconds=i))) for i in range(6)]
    asyncio.run(worker.handle(_msgs(arrivals, vals[:4])))
    asyncio.run(worker.handle(_msgs(arrivals, vals[2:], start=2)))  # offsets 2, 3 again (a rebalance), then 4, 5
    assert ing.load_state().counts["skipped_redelivered"] == 2
    assert _val(m, "aurelius_records_in_total", topic=arrivals) == 6
    assert _val(m, "aurelius_records_stored_total", topic=arrivals) == 6
    ing.close()


def test_late_records_and_watermark_delay_in_event_time(records):
    topics, ing, worker, _, m = _make()
    arrivals, prices = topics.request_arrivals.name, topics.prices.name
    t0 = records.T0
    price = _enc(records.price(t0 + timedelta(seconds=10)))  # published 10 s in: the prices partition's clock
    vals = [_enc(records.arrival(f"r{i}", t0 + timedelta(seconds=60 * i))) for i in range(6)]  # up to 300 s

    async def go() -> None:
        # the prices partition still has records to deliver: the watermark waits at its 10 s, minus 5 s lateness
        await worker.submit(_msgs(prices, [price]) + _msgs(arrivals, vals), active={(prices, 0)})
        await worker.drain()
        assert _val(m, "aurelius_watermark_delay_seconds") == 300 - 5
        await worker.submit([])  # all caught up: the stream's clock minus the allowed lateness
        await worker.drain()
        assert _val(m, "aurelius_watermark_delay_seconds") == 5
        late = _enc(records.arrival("late", t0 + timedelta(seconds=30)))  # period 0 closed
        await worker.submit(_msgs(arrivals, [late], start=6))
        await worker.drain()

    asyncio.run(go())
    assert ing.load_state().counts["late"] == 1
    assert _val(m, "aurelius_late_records_total") == 1
    ing.close()


def test_fallbacks_counted_by_bounded_reason_class(records):
    from optimizer.aurelius import START_FALLBACK
    from optimizer.fallback import confidence_fallback, missing_inputs_fallback

    fallbacks = {0: missing_inputs_fallback(("no price has arrived for PJM",)), 1: confidence_fallback(0.2, 0.6),
                 2: "no candidate passed the hard gates (best: power: 1.2 MW over the cap)",
                 3: "pareto: gain 0.1% below the 3% margin", 4: START_FALLBACK, 5: "something new"}
    topics, ing, worker, _, m = _make(Decider(fallbacks))
    vals = [_enc(records.arrival(f"r{i}", records.T0 + timedelta(seconds=60 * i))) for i in range(8)]
    asyncio.run(worker.handle(_msgs(topics.request_arrivals.name, vals)))
    assert ing.load_state().decided_through >= 6
    got = {r: _val(m, "aurelius_fallbacks_total", reason=r) for r in FALLBACK_REASONS}
    assert got == {"missing_inputs": 1, "low_confidence": 1, "hard_gates": 1, "pareto": 1, "start": 1, "other": 1}
    assert _val(m, "aurelius_decisions_total") == ing.load_state().decided_through + 1
    assert fallback_reason(None) == "other"
    ing.close()


def test_dead_letter_reasons_stay_a_small_fixed_set(records):
    topics, ing, worker, _, m = _make()
    arrivals = topics.request_arrivals.name
    t0 = records.T0
    bad = [f"{{not json {i}".encode() for i in range(20)]  # 20 different reason texts
    bad += [_enc(dict(records.arrival(f"v{i}", t0), input_tokens=-i - 1)) for i in range(20)]
    bad += [_enc(dict(records.arrival(f"u{i}", t0), **{f"extra_{i}": 1})) for i in range(20)]
    bad += [_enc(records.arrival("early", t0 - timedelta(days=30))), b'{"input_tokens": NaN}']
    good = [_enc(records.arrival(f"r{i}", t0 + timedelta(seconds=i))) for i in range(100)]  # the stream's anchor
    asyncio.run(worker.handle(_msgs(arrivals, good + bad)))
    labels = {s.labels["reason"] for f in m.registry.collect() if f.name == "aurelius_dead_letters"
              for s in f.samples if s.name.endswith("_total")}
    assert labels <= set(DEAD_LETTER_REASONS)
    assert labels == {"invalid_json", "schema", "unknown_field", "event_time_early", "non_finite"}
    assert sum(_val(m, "aurelius_dead_letters_total", topic=arrivals, reason=r) for r in labels) == len(bad)
    ing.close()


def test_consumer_lag_per_assigned_partition():
    m = WorkerMetrics()
    a, b = ("t.a", 0), ("t.b", 1)
    m.lag({a: 120, b: None}, positions={a: 19}, seen={a: 49})  # fetched through offset 49: 70 behind
    assert _val(m, "aurelius_consumer_lag_records", topic="t.a", partition="0") == 70
    assert _val(m, "aurelius_consumer_lag_records", topic="t.b", partition="1") is None  # high-water not known
    m.lag({b: 10}, positions={b: 9}, seen={})  # a revoked: its series goes
    assert _val(m, "aurelius_consumer_lag_records", topic="t.a", partition="0") is None
    assert _val(m, "aurelius_consumer_lag_records", topic="t.b", partition="1") == 0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def loop_thread():
    """An event loop running in a thread (the worker's loop as the HTTP thread sees it)."""
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    yield loop
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    loop.close()


def test_http_metrics_health_and_readiness_follow_the_link(records, loop_thread, monkeypatch):
    topics, ing, worker, _, m = _make()
    asyncio.run(worker.handle(_msgs(topics.request_arrivals.name, [_enc(records.arrival("r", records.T0))])))
    server = MetricsServer(m, "127.0.0.1", 0)
    try:
        status, body = _get(server.port, "/metrics")
        assert status == 200
        assert f'aurelius_records_in_total{{topic="{topics.request_arrivals.name}"}} 1.0' in body
        assert "aurelius_broker_up 0.0" in body and "# TYPE aurelius_decision_seconds histogram" in body
        assert _get(server.port, "/healthz") == (200, "ok: process up (event loop not attached yet)\n")
        status, body = _get(server.port, "/readyz")
        assert status == 503 and body.startswith("not ready: worker starting") and body.count("\n") == 1

        link = BrokerLink("broker:9092")

        async def start() -> None:
            m.started(link)

        asyncio.run_coroutine_threadsafe(start(), loop_thread).result(5)
        status, body = _get(server.port, "/readyz")
        assert status == 503 and body.startswith("not ready: broker connecting")
        link.connected()
        assert _get(server.port, "/readyz") == (200, "ready\n")
        assert "aurelius_broker_up 1.0" in _get(server.port, "/metrics")[1]
        assert _get(server.port, "/healthz") == (200, "ok\n")
        link.unreachable("KafkaConnectionError: connection refused")
        status, body = _get(server.port, "/readyz")
        assert status == 503 and "broker unreachable" in body and "connection refused" in body
        assert body.count("\n") == 1
        link.connected()
        assert _get(server.port, "/readyz")[0] == 200

        monkeypatch.setattr(metrics_mod, "LOOP_PROBE_S", 0.3)
        loop_thread.call_soon_threadsafe(loop_thread.stop)  # the loop no longer runs callbacks
        deadline = time.monotonic() + 5
        while loop_thread.is_running() and time.monotonic() < deadline:  # stopped, not just asked to stop
            time.sleep(0.01)
        status, body = _get(server.port, "/healthz")
        assert status == 503 and "event loop" in body
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.close()
        ing.close()


def test_settings_and_serve_run_the_endpoint_for_the_worker_s_lifetime(monkeypatch, tmp_path):
    assert (WorkerSettings().metrics_port, WorkerSettings().metrics_addr) == (9464, "127.0.0.1")
    monkeypatch.setenv("AURELIUS_METRICS_PORT", "0")
    assert WorkerSettings().metrics_port == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AURELIUS_METRICS_PORT", str(port))
    settings = WorkerSettings(db=str(tmp_path / "s.duckdb"), audit_dir=str(tmp_path / "audit"))
    assert settings.metrics_port == port


    from streams import worker_cli

    async def no_broker(*args, **kwargs) -> None:
        return None

    seen: dict[str, tuple[int, str]] = {}

    class FakeFaust:  # stands for faust's worker: the endpoint answers while it runs
        def __init__(self, app, **kwargs) -> None:
            pass

        def execute_from_commandline(self) -> None:
            seen["metrics"] = _get(port, "/metrics")
            seen["readyz"] = _get(port, "/readyz")
            raise SystemExit(0)

    monkeypatch.setattr(worker_cli, "ensure_topics", no_broker)
    monkeypatch.setattr(worker_cli, "FaustWorker", FakeFaust)
    assert worker_cli.serve(settings, worker_cli.policy_decider) == 0
    assert seen["metrics"][0] == 200 and "aurelius_records_in_total" in seen["metrics"][1]
    assert seen["readyz"][0] == 503
    with socket.socket() as s:  # closed with the worker
        assert s.connect_ex(("127.0.0.1", port)) != 0


def _samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


@pytest.mark.kafka
@pytest.mark.slow
def test_the_worker_through_a_broker_serves_its_metrics_and_turns_ready(kafka_bootstrap, topic_prefix_factory,
                                                                        kafka_tools, records, tmp_path):
    prefix = topic_prefix_factory()
    topics = Topics(prefix=prefix)
    kafka_tools.create_topics(kafka_bootstrap, prefix)
    arrivals = topics.request_arrivals.name
    good = [_enc(records.arrival(f"r{i}", records.T0 + timedelta(seconds=15 * i))) for i in range(10)]
    kafka_tools.produce(kafka_bootstrap, arrivals, good + [b"{not json"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = kafka_tools.Proc(["worker", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix,
                               "--group-id", f"{prefix}worker", "--db", "s.duckdb", "--audit-dir", "audit",
                               "--period-s", "60", "--allowed-lateness-s", "5", "--policy", "production"],
                              cwd=tmp_path, env={"AURELIUS_METRICS_PORT": str(port)})
    try:
        st = worker.wait_for(lambda s: s["counts"]["records_in"] == 11 and s["decided_through"] >= 1)
        assert st["kafka"]["state"] == "connected"
        assert _get(port, "/readyz") == (200, "ready\n") and _get(port, "/healthz") == (200, "ok\n")
        # the stats line can report the batch's decisions before its stored counts are added (after publication)
        stored = ("aurelius_records_stored_total", (("topic", arrivals),))
        deadline = time.monotonic() + 15
        while (got := _samples(_get(port, "/metrics")[1])).get(stored) != 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got[("aurelius_records_in_total", (("topic", arrivals),))] == 11
        assert got[stored] == 10
        assert got[("aurelius_dead_letters_total", (("reason", "invalid_json"), ("topic", arrivals)))] == 1
        assert got[("aurelius_broker_up", ())] == 1
        assert got[("aurelius_consumer_lag_records", (("partition", "0"), ("topic", arrivals)))] == 0
        assert got[("aurelius_decisions_total", ())] == got[("aurelius_decided_through_period", ())] + 1 >= 2
        assert got[("aurelius_decision_seconds_count", ())] == got[("aurelius_decisions_total", ())]
        assert got[("aurelius_watermark_delay_seconds", ())] == 5
    finally:
        worker.stop()
