"""Kafka topics of the streaming deployment, as frozen dataclasses, and their explicit creation.

Every topic is created explicitly before any client touches it: a Kafka-protocol broker that
auto-creates topics picks its own partition count (Tansu: 4), and the record key -> partition mapping
(murmur2 mod partitions) is only stable while that count is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.kafka_client import KafkaClientSettings, client_kwargs, close_client, start_client

DEFAULT_PREFIX = "aurelius."

#: Record kind (schemas/) -> topic suffix, for the five input kinds the worker validates.
INPUT_KINDS: dict[str, str] = {
    "request_arrival": "request-arrivals",
    "request_completion": "request-completions",
    "gpu_telemetry": "gpu-telemetry",
    "price": "prices",
    "fleet_event": "fleet-events",
}


@dataclass(frozen=True)
class TopicSpec:
    """One topic's settings.

    Parameters
    ----------
    name : full topic name.
    partitions : partition count (count).
    replication_factor : replicas per partition (count); 1 for a single broker.
    retention_ms : log retention (ms); -1 keeps records forever (the audit topic).
    """

    name: str
    partitions: int = 1
    replication_factor: int = 1
    retention_ms: int = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class Topics:
    """The topic set of one deployment; names are `prefix + suffix`.

    Parameters
    ----------
    prefix : prepended to every topic name (default "aurelius.").
    partitions : partitions of each input topic (count).
    replication_factor : replicas per partition (count).

    Examples
    --------
    >>> Topics(prefix="t1.").recommendations.name
    't1.recommendations'
    >>> Topics().for_kind("price").name
    'aurelius.prices'
    """

    prefix: str = DEFAULT_PREFIX
    partitions: int = 1
    replication_factor: int = 1

    def _spec(self, suffix: str, partitions: int | None = None, retention_ms: int | None = None) -> TopicSpec:
        kw = {} if retention_ms is None else {"retention_ms": retention_ms}
        return TopicSpec(self.prefix + suffix, partitions or self.partitions, self.replication_factor, **kw)

    @property
    def request_arrivals(self) -> TopicSpec:
        return self._spec(INPUT_KINDS["request_arrival"])

    @property
    def request_completions(self) -> TopicSpec:
        return self._spec(INPUT_KINDS["request_completion"])

    @property
    def gpu_telemetry(self) -> TopicSpec:
        return self._spec(INPUT_KINDS["gpu_telemetry"])

    @property
    def prices(self) -> TopicSpec:
        return self._spec(INPUT_KINDS["price"])

    @property
    def fleet_events(self) -> TopicSpec:
        return self._spec(INPUT_KINDS["fleet_event"])

    @property
    def recommendations(self) -> TopicSpec:
        """The audit topic: one record per decision, keyed by decision id, kept forever."""
        return self._spec("recommendations", partitions=1, retention_ms=-1)

    @property
    def dead_letters(self) -> TopicSpec:
        return self._spec("dead-letters", partitions=1)

    def for_kind(self, kind: str) -> TopicSpec:
        """The input topic that carries records of `kind` (a schemas/ record kind)."""
        try:
            return self._spec(INPUT_KINDS[kind])
        except KeyError:
            raise ValueError(f"no input topic for kind {kind!r}; known: {sorted(INPUT_KINDS)}") from None

    def kind_of(self, topic: str) -> str:
        """The record kind an input topic carries (inverse of `for_kind`)."""
        for kind, suffix in INPUT_KINDS.items():
            if topic == self.prefix + suffix:
                return kind
        raise ValueError(f"{topic!r} is not an input topic of prefix {self.prefix!r}")

    def inputs(self) -> tuple[TopicSpec, ...]:
        return tuple(self.for_kind(k) for k in INPUT_KINDS)

    def all(self) -> tuple[TopicSpec, ...]:
        return (*self.inputs(), self.recommendations, self.dead_letters)


async def ensure_topics(
    bootstrap_servers: str, specs: tuple[TopicSpec, ...], timeout_s: float = 30.0,
    kafka: KafkaClientSettings | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Parameters
    ----------
    bootstrap_servers : Kafka bootstrap servers, "host:port[,host:port]".
    specs : topics to create.
    timeout_s : longest wait for one admin request (s).
    kafka : security and start-up retry of the admin client (schemas.kafka_client); None: from env `KAFKA_*`.

    Raises
    ------
    KafkaUnavailable : no broker answered within `kafka.startup_timeout_s` (one-line message).
    """
    from aiokafka.admin import (  # lazy: the Kafka client loads only where a command talks to a broker
        AIOKafkaAdminClient,
        NewTopic,
    )

    request_ms = int(timeout_s * 1000)
    admin = await start_client(
        lambda: AIOKafkaAdminClient(**client_kwargs(kafka, bootstrap_servers), request_timeout_ms=request_ms),
        kafka, bootstrap_servers, "topic admin")
    try:
        existing = set(await admin.list_topics())
        todo = [s for s in specs if s.name not in existing]
        if todo:
            await admin.create_topics(
                [
                    NewTopic(s.name, s.partitions, s.replication_factor,
                             topic_configs={"retention.ms": str(s.retention_ms)})
                    for s in todo
                ]
            )
        return [s.name for s in todo]
    finally:
        await close_client(admin)
