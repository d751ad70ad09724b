"""The worker's processing, free of any transport: validate, dead-letter, clock, micro-batch rows.

`Pipeline.step` turns one micro-batch of consumed records into (a) dead letters to publish, (b) rows and
the new state to commit in one transaction, and (c) the decisions now due. The driver (streams/app.py,
faust) publishes the dead letters, then commits, then makes and publishes the decisions, then lets the
consumer commit its offsets: a crash anywhere replays records whose effects are idempotent.
Counts reconcile: records_in = processed + dead_letters (skipped re-deliveries are counted apart).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from schemas import SchemaError, decode
from streams.clock import PeriodClock
from streams.dead_letter import DeadLetter
from streams.ingest import ROW_SCHEMA, IngestBatch, WorkerState, record_key
from streams.records import ts_from_wire
from streams.topics import Topics


@dataclass(frozen=True)
class Inbound:
    """One consumed record: where it came from and its raw value (bytes, None for a tombstone)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None


@dataclass(frozen=True)
class Outbound:
    """One record to produce. timestamp_ms: record timestamp (ms since epoch) or None for now."""

    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


@dataclass
class StepResult:
    """What one micro-batch produced (see module doc)."""

    dead_letters: list[Outbound]
    batch: IngestBatch
    due: list[int] = field(default_factory=list)


def dead_letter(msg: Inbound, exc: SchemaError, dlq_topic: str) -> Outbound:
    """The dead-letter record of a failed input (original bytes, source coordinates, reason, DLQ headers)."""
    dl = DeadLetter.build(msg.value, msg.topic, msg.partition, msg.offset, exc)
    key = f"{msg.topic}/{msg.partition}/{msg.offset}".encode()
    return Outbound(dlq_topic, key, dl.value(), tuple(dl.headers))


def clock_time(kind: str, record: dict[str, object]) -> datetime:
    """The instant a record drives the period clock with: when it became observable.

    A price is observable at `published_at` (a day-ahead price for tomorrow must not close today's
    periods); every other kind at `event_at`.
    """
    return ts_from_wire(str(record["published_at" if kind == "price" else "event_at"]))


class Pipeline:
    """Validates micro-batches and drives the period clock; holds no I/O.

    Parameters
    ----------
    topics : the deployment's topics (input topic -> record kind, dead-letter topic).
    state : durable state loaded at start (positions, clock, counts).
    period_s : control period length (s).
    allowed_lateness_s : watermark lag behind the largest clock time (s).
    origin : start of period 0 (UTC); None takes the first record's period (or the stored origin).
    """

    def __init__(self, topics: Topics, state: WorkerState, period_s: float, allowed_lateness_s: float,
                 origin: datetime | None = None) -> None:
        self.topics = topics
        self.state = state
        self.clock = PeriodClock(period_s, allowed_lateness_s, origin=state.origin or origin,
                                 max_event_at=state.max_event_at, closed_through=state.closed_through)
        self._kinds = {t.name: topics.kind_of(t.name) for t in topics.inputs()}

    def due_decisions(self) -> list[int]:
        """Periods whose decision is owed: period 0 once the origin is known, k + 1 once k has closed."""
        if self.clock.origin is None:
            return []
        return list(range(self.state.decided_through + 1, self.clock.closed_through + 2))

    def step(self, records: Sequence[Inbound]) -> StepResult:
        st, counts = self.state, self.state.counts
        dlq = self.topics.dead_letters.name
        dead: list[Outbound] = []
        rows: dict[str, list[object]] = {k: [] for k in ROW_SCHEMA}
        records_by_kind: dict[str, list[bytes]] = {}
        for msg in records:
            pos = (msg.topic, msg.partition)
            if msg.offset <= st.positions.get(pos, -1):
                counts["skipped_redelivered"] += 1
                continue
            st.positions[pos] = msg.offset
            counts["records_in"] += 1
            kind = self._kinds[msg.topic]
            try:
                if msg.value is None:
                    raise SchemaError(kind, "null value (tombstone) where a record was expected")
                record = decode(kind, msg.value)
                at = clock_time(kind, record)
            except SchemaError as exc:
                dead.append(dead_letter(msg, exc, dlq))
                counts["dead_letters"] += 1
                continue
            records_by_kind.setdefault(kind, []).append(msg.value)
            tick = self.clock.observe(at)
            counts["processed"] += 1
            if tick.late:
                counts["late"] += 1
            # late: seen by the next decision still to be made; else by the one at its period's close
            decision_period = self.clock.closed_through + 2 if tick.late else max(tick.period_index + 1, 1)
            for name, value in (
                ("kind", kind), ("key", record_key(kind, record)), ("event_at", at),
                ("period_index", tick.period_index),
                ("decision_period", decision_period),
                ("late", tick.late), ("payload", msg.value.decode()), ("topic", msg.topic),
                ("partition", msg.partition), ("offset", msg.offset),
            ):
                rows[name].append(value)
        st.origin, st.max_event_at = self.clock.origin, self.clock.max_event_at
        st.closed_through = self.clock.closed_through
        frame = pl.DataFrame(rows, schema=ROW_SCHEMA)
        return StepResult(dead, IngestBatch(frame, records_by_kind, st), self.due_decisions())
