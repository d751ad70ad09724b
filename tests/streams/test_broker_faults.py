"""Broker faults (streams/kafka_link.py, docs/streaming.md "Broker faults").

Without a broker: the position check against a scripted probe (Tansu's under-reported end offset, a
confirmed gap, retention), the reconnect backoff, the publish retry and the log de-duplication.

Through a real broker (marked kafka): a topic recreated under a stopped worker (stored offset beyond the new
end: detected, logged, resumed from the earliest offset, counted), a normal restart on Tansu whose end offset
is under-reported (never reset), an outage of the broker under a running worker (reported, retried with
backoff, recovered), and an unreachable broker at start (one line on stderr, non-zero exit, bounded time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from schemas.kafka_client import EXIT_UNAVAILABLE
from schemas.topics import Topics
from streams import kafka_link
from streams.kafka_link import BrokerLink, OffsetGap, PositionGuard, RepeatFilter, connect_with_backoff

REPO = Path(__file__).resolve().parents[2]
PERIOD = ["--period-s", "60", "--allowed-lateness-s", "5", "--policy", "production"]
TP = TopicPartition("t.request-arrivals", 0)


# --- the position check, on a scripted probe --------------------------------------------------------------


class Probe:
    """Stands in for the group-less probe consumer: offsets as a broker reports them, and a log whose
    records are `offsets` (fetch at `o` returns the records >= `o`; none: Tansu's empty answer)."""

    def __init__(self, earliest: int, reported_end: int, offsets: range) -> None:
        self.earliest, self.reported_end, self.offsets = earliest, reported_end, offsets
        self.fetches = 0
        self.pos: dict[Any, int] = {}

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, self.earliest)

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, self.reported_end)

    def assign(self, tps: list[Any]) -> None:
        self.pos = dict.fromkeys(tps, 0)

    def seek(self, tp: Any, offset: int) -> None:
        self.pos[tp] = offset

    async def getmany(self, *tps: Any, timeout_ms: int = 0) -> dict[Any, list[Any]]:
        self.fetches += 1
        await asyncio.sleep(timeout_ms / 1000 / 20)
        return {tp: [SimpleNamespace(offset=o) for o in self.offsets if o >= self.pos[tp]] for tp in tps
                if any(o >= self.pos[tp] for o in self.offsets)}

    def unsubscribe(self) -> None:
        self.pos = {}


def _check(probe: Probe, stored: int) -> dict[Any, OffsetGap]:
    return asyncio.run(PositionGuard(probe).check({TP: stored}))


def test_under_reported_end_is_confirmed_by_fetch_and_never_reset() -> None:
    # Tansu: 16 records (0..15) whose last batch starts at 11 -> end reported as 12
    probe = Probe(earliest=0, reported_end=12, offsets=range(16))
    assert _check(probe, 15) == {} and probe.fetches >= 1
    probe = Probe(earliest=0, reported_end=12, offsets=range(16))
    assert _check(probe, 10) == {} and probe.fetches == 0  # inside the reported end: nothing to confirm


def test_stored_offset_beyond_the_end_is_a_gap_resumed_from_earliest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka_link, "CONFIRM_S", 0.3)
    gaps = _check(Probe(earliest=0, reported_end=1, offsets=range(3)), 19)  # topic recreated: 3 new records
    assert gaps == {TP: OffsetGap(TP.topic, 0, "beyond_end", stored=19, end=1, earliest=0)}
    msg = gaps[TP].message(1)
    assert msg.startswith(f"OFFSET GAP topic={TP.topic} partition=0 stored_offset=19 end_offset=1:")
    assert "resuming from the earliest available offset 0" in msg


def test_stored_offset_before_the_earliest_is_a_retention_gap() -> None:
    gaps = _check(Probe(earliest=50, reported_end=80, offsets=range(50, 80)), 19)
    assert gaps[TP].kind == "before_start" and gaps[TP].earliest == 50
    assert "retention deleted 30 records" in gaps[TP].message(2)


def test_a_failed_check_keeps_the_stored_position(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Probe):
        async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
            raise TimeoutError("no answer")

    session = kafka_link.InputConsumer.__new__(kafka_link.InputConsumer)
    session.guard = PositionGuard(Broken(0, 0, range(0)))
    assert asyncio.run(session._gaps({TP: 19})) == {}
    assert "keeping them" in caplog.text


# --- outage handling without a broker ----------------------------------------------------------------------


def test_reconnect_backs_off_and_reports(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="aurelius.worker")
    link = BrokerLink("b:9092")
    link.connected()
    attempts: list[float] = []

    async def open_() -> str:
        attempts.append(time.monotonic())
        if len(attempts) < 4:
            raise ConnectionRefusedError("refused")
        return "session"

    got = asyncio.run(connect_with_backoff(open_, link, asyncio.Event(), backoff_max_s=0.2, first_delay_s=0.05))
    waits = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert got == "session" and len(attempts) == 4
    assert waits[0] >= 0.05 and waits[1] >= 0.1 and waits[2] >= 0.2  # 0.05, 0.1, 0.2 (capped)
    assert link.state == "connected" and link.outages == 1
    text = caplog.text
    assert "unreachable (ConnectionRefusedError: refused)" in text and "attempt 3" in text
    assert "reachable again after" in text


def test_publish_retries_transient_errors_and_raises_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

    calls = []

    async def flaky() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise KafkaConnectionError("down")

    asyncio.run(kafka_link.publish_with_retry(flaky, "publish to t", backoff_max_s=0.01))
    assert len(calls) == 3

    async def too_big() -> None:
        raise MessageSizeTooLargeError()

    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(kafka_link.publish_with_retry(too_big, "publish to t", backoff_max_s=0.01))


def test_repeat_filter_lets_one_line_per_message_through() -> None:
    f = RepeatFilter(window_s=0.2)

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("aiokafka.conn", logging.ERROR, __file__, 1, msg, ("x",), None)

    assert [f.filter(rec("Unable connect to node %s")) for _ in range(50)].count(True) == 1
    assert f.filter(rec("another message %s"))
    time.sleep(0.25)
    r = rec("Unable connect to node %s")
    assert f.filter(r) and "[49 alike held back in 0 s]" in r.getMessage()


# --- through a real broker ---------------------------------------------------------------------------------


def _arrivals(records: Any, tag: str, n: int, start_s: int = 0) -> list[bytes]:
    return [json.dumps(records.arrival(f"{tag}{i}", records.T0 + timedelta(seconds=start_s + 15 * i))).encode()
            for i in range(n)]


def _worker(kafka_tools: Any, bootstrap: str, prefix: str, tmp_path: Path, env: dict[str, str] | None = None) -> Any:
    return kafka_tools.Proc(["worker", "--bootstrap-servers", bootstrap, "--topic-prefix", prefix, "--group-id",
                             f"{prefix}worker", "--db", "state.duckdb", "--audit-dir", "audit", *PERIOD],
                            cwd=tmp_path, env=env)


def _recreate(bootstrap: str, topic: str, prefix: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from schemas.topics import ensure_topics

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
            for _ in range(50):
                if topic not in await admin.list_topics():
                    break
                await asyncio.sleep(0.1)
        finally:
            await admin.close()
        await ensure_topics(bootstrap, Topics(prefix=prefix).all())

    asyncio.run(go())


def _end_offset(bootstrap: str, topic: str) -> int:
    from aiokafka import AIOKafkaConsumer

    async def go() -> int:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            return int((await c.end_offsets([tp]))[tp])
        finally:
            await c.stop()

    return asyncio.run(go())


@pytest.fixture
def deployment(topic_prefix_factory: Any) -> tuple[str, str]:
    """A fresh topic prefix and its arrivals topic."""
    prefix = topic_prefix_factory()
    return prefix, Topics(prefix=prefix).request_arrivals.name


def _gap_lines(proc: Any) -> list[str]:
    return [line for line in proc.lines if "OFFSET GAP" in line]


def _first_run(kafka_tools: Any, bootstrap: str, prefix: str, tmp_path: Path, values: list[bytes],
               env: dict[str, str] | None = None) -> Any:
    """Create the topics, produce `values` (one batch) to the arrivals topic, and let a worker ingest them all
    and stop: its DuckDB then stores the last offset, len(values) - 1. Returns the stopped worker."""
    kafka_tools.create_topics(bootstrap, prefix)
    kafka_tools.produce(bootstrap, Topics(prefix=prefix).request_arrivals.name, values)
    w = _worker(kafka_tools, bootstrap, prefix, tmp_path, env)
    try:
        w.wait_for(lambda s: s["counts"]["records_in"] == len(values))
    finally:
        w.stop()
    return w


@pytest.mark.kafka
@pytest.mark.slow
def test_topic_recreated_under_a_stopped_worker_resumes_from_earliest_and_counts_the_gap(
        kafka_bootstrap: str, deployment: tuple[str, str], kafka_tools: Any, records: Any, tmp_path: Path) -> None:
    prefix, arrivals = deployment
    _first_run(kafka_tools, kafka_bootstrap, prefix, tmp_path, _arrivals(records, "old", 10))
    _recreate(kafka_bootstrap, arrivals, prefix)  # the stored position (offset 9) is now past the end
    kafka_tools.produce(kafka_bootstrap, arrivals, _arrivals(records, "new", 3, start_s=300))
    w2 = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path)
    try:
        st = w2.wait_for(lambda s: s["counts"].get("offset_gaps") == 1 and s["counts"]["records_in"] == 13)
    finally:
        w2.stop()
    c = st["counts"]
    assert (c["processed"], c["skipped_redelivered"], c["duplicates"]) == (13, 0, 0)  # the 3 new ones ingested
    gap = st["kafka"]["last_offset_gap"]
    assert (gap["topic"], gap["partition"], gap["kind"], gap["stored"], gap["earliest"]) == (
        arrivals, 0, "beyond_end", 9, 0)
    lines = _gap_lines(w2)
    assert len(lines) == 1 and "ERROR" in lines[0]
    assert f"OFFSET GAP topic={arrivals} partition=0 stored_offset=9 end_offset={gap['end']}:" in lines[0]
    assert "resuming from the earliest available offset 0" in lines[0]


@pytest.mark.kafka
@pytest.mark.slow
def test_normal_restart_never_resets_when_the_end_offset_is_under_reported(
        kafka_bootstrap: str, deployment: tuple[str, str], kafka_tools: Any, records: Any, tmp_path: Path) -> None:
    prefix, arrivals = deployment
    env = {"AURELIUS_OFFSET_RECHECK_S": "1"}  # the idle re-check runs too, against the same end offset
    w1 = _first_run(kafka_tools, kafka_bootstrap, prefix, tmp_path, _arrivals(records, "r", 12), env)
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        end = _end_offset(kafka_bootstrap, arrivals)
        assert end < 12, f"Tansu reports the start of the last batch + 1 ({end}): the case under test"
    w2 = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path, env)
    try:
        w2.wait_for(lambda s: s["kafka"]["state"] == "connected")
        seen = len(w2.stats)
        w2.wait_for(lambda s: len(w2.stats) >= seen + 8)  # ~4 s idle at the stored position: several re-checks
        kafka_tools.produce(kafka_bootstrap, arrivals, _arrivals(records, "s", 2, start_s=300))
        st = w2.wait_for(lambda s: s["counts"]["records_in"] == 14)
    finally:
        w2.stop()
    c = st["counts"]
    assert (c["offset_gaps"], c["skipped_redelivered"], c["duplicates"], c["processed"]) == (0, 0, 0, 14)
    assert st["kafka"]["last_offset_gap"] is None and _gap_lines(w1) == _gap_lines(w2) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["worker", "publish", "audit-sink"])
def test_unreachable_broker_at_start_one_line_and_nonzero_exit(command: str, tmp_path: Path) -> None:
    with socket.socket() as sock:  # a local port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "obs").mkdir()
    (tmp_path / "obs" / "price.jsonl").write_text("{}\n")
    extra = {"worker": ["--db", "s.duckdb"], "publish": ["--from-dir", "obs"], "audit-sink": []}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env["PYTHONPATH"] = str(REPO)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "streams.cli", command, "--bootstrap-servers", f"127.0.0.1:{port}",
                        "--kafka-startup-timeout-s", "2", *extra], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    elapsed = time.monotonic() - t0
    lines = r.stderr.strip().splitlines()
    assert r.returncode == EXIT_UNAVAILABLE, r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"aurelius {command}: cannot connect the topic admin to Kafka at 127.0.0.1:{port} "
                               "(PLAINTEXT) after ")
    assert "no bootstrap server answered" in lines[0]
    attempts = int(lines[0].split(" after ")[1].split(" attempt")[0])
    assert attempts >= 3  # it retried (0.25 s, 0.5 s, 1 s, ...) for the start-up timeout
    assert 2.0 <= elapsed < 30.0


@pytest.mark.kafka
@pytest.mark.slow
def test_outage_is_reported_retried_with_backoff_and_recovered(deployment: tuple[str, str], kafka_tools: Any,
                                                                records: Any, tmp_path: Path) -> None:
    """Own Tansu (in memory): stopping it is an outage, restarting it is a broker that lost every topic."""
    from streams import broker

    try:
        port = broker.free_port()
        tansu = broker.start_tansu(port)
    except broker.BrokerUnavailable as exc:
        pytest.skip(str(exc))
    bootstrap = f"127.0.0.1:{port}"
    prefix, arrivals = deployment
    env = {"AURELIUS_BROKER_PROBE_INTERVAL_S": "1", "AURELIUS_RECONNECT_BACKOFF_MAX_S": "2",
           "AURELIUS_OFFSET_RECHECK_S": "2"}
    w = None
    try:
        kafka_tools.create_topics(bootstrap, prefix)
        kafka_tools.produce(bootstrap, arrivals, _arrivals(records, "a", 6))
        w = _worker(kafka_tools, bootstrap, prefix, tmp_path, env)
        w.wait_for(lambda s: s["counts"]["records_in"] == 6 and s["kafka"]["state"] == "connected")
        before = len(w.lines)
        broker.stop(tansu)
        t_down = time.monotonic()
        st = w.wait_for(lambda s: s["kafka"]["state"] == "unreachable", timeout_s=30)
        reported_after = time.monotonic() - t_down
        assert st["kafka"]["outages"] == 1 and st["kafka"]["last_error"]
        time.sleep(5)  # reconnect attempts at 0.5, 1, 2, 2 s
        tansu = broker.start_tansu(port)  # memory storage: every topic is gone
        kafka_tools.create_topics(bootstrap, prefix)  # before producing (Tansu would auto-create 4 partitions)
        kafka_tools.produce(bootstrap, arrivals, _arrivals(records, "b", 3, start_s=300))
        st = w.wait_for(lambda s: s["kafka"]["state"] == "connected" and s["counts"]["records_in"] == 9,
                        timeout_s=60)
        outage_lines = [ln for ln in w.lines[before:] if "aurelius.stats" not in ln]
    finally:
        if w is not None:
            w.stop()
        broker.stop(tansu)
    assert reported_after < 10
    assert st["kafka"]["outages"] == 1 and st["counts"]["offset_gaps"] == 1  # stored offset 5, new log 0..2
    assert st["counts"]["processed"] == 9 and st["counts"]["skipped_redelivered"] == 0
    retries = [ln for ln in outage_lines if "still unreachable after" in ln]
    assert len(retries) >= 2 and "next attempt in 0.5 s" in retries[0] and "next attempt in 1.0 s" in retries[1]
    assert any("reachable again after" in ln for ln in outage_lines)
    assert any("OFFSET GAP" in ln and "stored_offset=5" in ln for ln in outage_lines)
    assert len(outage_lines) < 80, "".join(outage_lines)  # aiokafka's per-retry errors collapsed
