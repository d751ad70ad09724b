"""The worker's processing, free of any transport: map, validate, dead-letter, clock, micro-batch rows.

`Pipeline.step` turns one micro-batch of consumed records into (a) dead letters to publish, (b) the
validated values and the new state to commit in one transaction, (c) the decisions now due and (d) the gaps
among the periods it closed (`StepResult.gaps`). The driver (streams/app.py) publishes the dead letters, then
commits, then makes and publishes the decisions: a crash anywhere replays records whose effects are idempotent.
Counts reconcile: records_in = processed + dead_letters (skipped re-deliveries are counted apart).

What is dead-lettered, so that nothing that passes can fail the commit or blow up later (`Limits`, from
streams/settings.py; docs/streaming.md lists the reasons): a value over `max_record_bytes` (unread); what
`schemas.decode` refuses (invalid JSON, NaN/Infinity and numbers beyond a double, duplicate keys, schema
violations, integers outside the stored Int32/Int64, non-finite floats); a clock time the period clock
bounds refuse (`PeriodClock.bound_error`: before the origin minus `history_span_s`, or more than
`max_ahead_s` ahead of the stream's clock; error class `EventTimeError`). A dead letter stays within
`dead_letter_max_bytes` (the original truncated, with its length and SHA-256).

Validation has a fast path. The JSON Schema files stay the contract; from each one a pydantic-core
validator is derived (`fast_validator`) that accepts a subset of what the schema accepts (strict types,
same enums, bounds, lengths, date-time pattern, no unknown fields; integers within their stored type, floats
finite) and parses JSON in Rust. A record it accepts is schema-valid (tests/streams/test_equivalence.py checks
this on good and mutated records) once a cheap count shows it has no duplicate key (Rust's parser keeps the
last value of a repeated key, silently); a record it rejects goes through `schemas.decode` (fastjsonschema),
which decides and words the reason.

Foreign records (no `schema_version`) are mapped with the `--field-map` TOML (`streams.fieldmap`) before
validation: the source is the `aurelius.source` header if present, else the one configured source of the
topic's kind whose shape matches (a Prometheus sample by metric name); an ambiguous or unmappable record
is dead-lettered with the reason. Mapped one-metric GPU samples of the same (instant, host, GPU) are
folded into one record within a micro-batch (`streams.fieldmap.fold_telemetry`'s rule); a sample of a key
already stored by an earlier batch is a duplicate (counted), so a deployment that forwards DCGM metrics
one by one should keep a scrape's samples together (one Prometheus remote-write request is one batch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from schemas import TOMBSTONE, SchemaError, decode, load, parse
from schemas.dead_letter import DeadLetter
from schemas.records import RECORD_TYPES, int_range, stored_schema
from schemas.timestamps import to_us, ts_from_wire
from schemas.topics import Topics
from streams.clock import Gap, PeriodClock, wire_us
from streams.fieldmap import FieldMapError
from streams.ingest import IngestBatch, KindRows, WorkerState, readable
from streams.settings import WorkerSettings

SOURCE_HEADER = "aurelius.source"

def _default(name: str) -> Any:
    return WorkerSettings.model_fields[name].default


@dataclass(frozen=True)
class Limits:
    """What the pipeline refuses and how much it does per batch (defaults: streams/settings.py).

    max_record_bytes : a longer record value is dead-lettered unread (bytes).
    dead_letter_max_bytes : bound on a dead letter's value plus headers (bytes); the original is truncated.
    history_span_s : clock times before the origin minus this are dead-lettered (s); None: no bound.
    max_ahead_s : clock times more than this ahead of the stream's clock are dead-lettered (s); None: no bound.
    max_close_periods : most periods closed per micro-batch; None: no bound.
    """

    max_record_bytes: int = _default("max_record_bytes")
    dead_letter_max_bytes: int = _default("dead_letter_max_bytes")
    history_span_s: float | None = _default("history_span_s")
    max_ahead_s: float | None = _default("max_ahead_s")
    max_close_periods: int | None = _default("max_close_periods")

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> Limits:
        """The limits a worker's settings (flags, env `AURELIUS_*`) set."""
        return cls(settings.max_record_bytes, settings.dead_letter_max_bytes, settings.history_span_s,
                   settings.max_ahead_s, settings.max_close_periods)


class EventTimeError(SchemaError):
    """A record whose clock time is implausibly far from its stream (`PeriodClock.bound_error`)."""


@dataclass(frozen=True)
class Inbound:
    """One consumed record: where it came from, its raw value (bytes, None for a tombstone), headers."""

    topic: str
    partition: int
    offset: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


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
    """What one micro-batch produced (see module doc).

    dead_letters : to publish before the commit.
    batch : records and state to commit.
    due : decision periods now owed, in order.
    gaps : runs of the periods this batch closed that got no record (`streams.clock.Gap`), in order; the
        due decisions in `gap.decisions` see no record at all, so the worker may make one 'no data' decision
        for each gap (say its last, `gap.last + 1`) and mark the others decided, instead of one per period.
    """

    dead_letters: list[Outbound]
    batch: IngestBatch
    due: list[int] = field(default_factory=list)
    gaps: tuple[Gap, ...] = ()


def dead_letter(msg: Inbound, exc: SchemaError, dlq_topic: str, max_bytes: int | None = None) -> Outbound:
    """The dead-letter record of a failed input (original bytes, source coordinates, reason, DLQ headers).

    max_bytes : bound on the dead letter's value plus headers; the original is truncated to fit (None: none).
    """
    dl = DeadLetter.build(msg.value, msg.topic, msg.partition, msg.offset, exc, max_bytes=max_bytes)
    key = f"{msg.topic}/{msg.partition}/{msg.offset}".encode()
    return Outbound(dlq_topic, key, dl.value(), tuple(dl.headers))


def clock_field(kind: str) -> str:
    """The field a record drives the period clock with: when it became observable.

    A price is observable at `published_at` (a day-ahead price for tomorrow must not close today's
    periods); every other kind at `event_at`.
    """
    return "published_at" if kind == "price" else "event_at"


def clock_time(kind: str, record: dict[str, object]) -> datetime:
    """The instant (UTC) a validated record drives the period clock with (see `clock_field`)."""
    return ts_from_wire(str(record[clock_field(kind)]))


# --- fast path: a pydantic-core validator derived from each JSON Schema file ---

_SUPPORTED = {"type", "enum", "const", "minimum", "maximum", "minLength", "maxLength", "format", "items",
              "minItems", "maxItems", "description", "title", "examples", "$comment", "default"}


def _date_time_pattern() -> str:
    """fastjsonschema's own date-time pattern, in Rust regex syntax (Python's end-of-text `\\Z` is `\\z`)."""
    from fastjsonschema.draft04 import CodeGeneratorDraft04  # lazy: only when a fast validator is first built

    return CodeGeneratorDraft04.FORMAT_REGEXS["date-time"].replace("\\Z", "\\z")


def _tighter(bound: Any, limit: int | None, pick: Callable[[Any, Any], Any]) -> Any:
    return limit if bound is None else bound if limit is None else pick(bound, limit)


def _core(prop: dict[str, Any], stored: Any = None) -> Any:
    """The pydantic-core schema of one JSON Schema property, or None where it is not a sound subset.

    stored : the polars type the field is stored as (`schemas.records.stored_schema`); an integer must fit it.
    """
    from pydantic_core import core_schema as cs  # lazy: only when a fast validator is first built

    if set(prop) - _SUPPORTED:
        return None
    types = prop.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    nullable = "null" in types
    types = [t for t in types if t != "null"]
    if len(types) != 1:
        return None
    t, fmt = types[0], prop.get("format")
    if "enum" in prop or "const" in prop:
        values = [v for v in prop.get("enum", [prop.get("const")]) if v is not None]
        if t != "string" or not all(isinstance(v, str) for v in values) or fmt:
            return None
        schema: Any = cs.literal_schema(values)
    elif t == "string":
        if fmt not in (None, "date-time"):
            return None
        schema = cs.str_schema(strict=True, min_length=prop.get("minLength"), max_length=prop.get("maxLength"),
                               pattern=_date_time_pattern() if fmt else None, regex_engine="rust-regex")
    elif t == "number":
        schema = cs.float_schema(strict=True, ge=prop.get("minimum"), le=prop.get("maximum"), allow_inf_nan=False)
    elif t == "integer":  # JSON Schema's integer includes integral floats (1980.0)
        lo, hi = int_range(stored) or (None, None)
        bounds = {"ge": _tighter(prop.get("minimum"), lo, max), "le": _tighter(prop.get("maximum"), hi, min)}
        schema = cs.union_schema([cs.int_schema(strict=True, **bounds),
                                  cs.float_schema(strict=True, multiple_of=1.0, allow_inf_nan=False, **bounds)])
    elif t == "boolean":
        schema = cs.bool_schema(strict=True)
    elif t == "array" and isinstance(prop.get("items"), dict):
        item = _core(prop["items"], getattr(stored, "inner", None))
        if item is None:
            return None
        schema = cs.list_schema(item, strict=True, min_length=prop.get("minItems"), max_length=prop.get("maxItems"))
    else:
        return None
    return cs.nullable_schema(schema) if nullable else schema


@cache
def fast_validator(kind: str) -> Callable[[bytes], dict[str, Any]] | None:
    """A JSON-bytes validator of `kind` that accepts only schema-valid records, or None if none derives.

    It raises `pydantic_core.ValidationError` for anything it does not accept (the caller then asks the
    schema validator, which may still accept, e.g. `1.0` for an integer). Its integers must also fit their
    stored type and its floats be finite; it does NOT see duplicate keys (`maybe_duplicate_keys` does).
    """
    from pydantic_core import SchemaValidator  # lazy: only when a fast validator is first built
    from pydantic_core import core_schema as cs  # lazy: only when a fast validator is first built

    spec = load(kind)
    if spec.get("type") != "object" or spec.get("additionalProperties") is not False:
        return None
    if set(spec) - {"$schema", "$id", "title", "description", "type", "required", "additionalProperties",
                    "properties"}:
        return None
    required = set(spec.get("required", []))
    stored = stored_schema(kind) if kind in RECORD_TYPES else {}
    fields = {}
    for name, prop in spec["properties"].items():
        core = _core(prop, stored.get(name))
        if core is None:
            return None
        fields[name] = cs.typed_dict_field(core, required=name in required)
    validator = SchemaValidator(cs.typed_dict_schema(fields, extra_behavior="forbid", strict=True))
    return validator.validate_json


_WHITESPACE = b" \t\n\r"


def maybe_duplicate_keys(value: bytes, record: dict[str, Any]) -> bool:
    """False when a flat JSON object `value` that parsed to `record` certainly has no repeated key.

    Every key ends with a quote followed by optional whitespace and a colon, so once whitespace is removed
    the count of `":` is at least the number of keys in the text (string contents can only add to it); equal
    to the number of distinct keys, there is no repeat. Records the fast path accepts are flat (no nested
    object). True means 'maybe': the caller asks `schemas.parse`, which knows.
    """
    return value.translate(None, _WHITESPACE).count(b'":') != len(record)


def validate_value(kind: str, value: bytes) -> dict[str, Any]:
    """Decode and validate one wire value: the fast path, else `schemas.decode` (which words the reason)."""
    fast = fast_validator(kind)
    if fast is not None:
        try:
            record = fast(value)
        except ValueError:  # pydantic_core.ValidationError is a ValueError
            pass
        else:
            if not maybe_duplicate_keys(value, record):
                return record
    return decode(kind, value)


class Pipeline:
    """Maps, validates and clocks micro-batches; holds no I/O.

    Parameters
    ----------
    topics : the deployment's topics (input topic -> record kind, dead-letter topic).
    state : durable state loaded at start (positions, clock, counts).
    period_s : control period length (s).
    allowed_lateness_s : watermark lag behind the largest clock time (s).
    origin : start of period 0 (UTC); None takes the first accepted record's period (or the stored origin).
        Without one, the first batch's records are bounded against its median clock time.
    field_map : a `streams.fieldmap.FieldMap` for foreign producers, or None (foreign records dead-letter).
    limits : record size, dead-letter size and event-time bounds, closes per batch; None: the defaults
        (a worker passes `Limits.from_settings(settings)`).
    """

    def __init__(self, topics: Topics, state: WorkerState, period_s: float, allowed_lateness_s: float,
                 origin: datetime | None = None, field_map: Any = None, limits: Limits | None = None) -> None:
        self.topics = topics
        self.state = state
        self.limits = lim = limits or Limits()
        self.clock = PeriodClock(period_s, allowed_lateness_s, origin=state.origin or origin,
                                 max_event_at=state.max_event_at, closed_through=state.closed_through,
                                 partition_max_us=dict(state.partition_max_us), history_span_s=lim.history_span_s,
                                 max_ahead_s=lim.max_ahead_s, max_close_periods=lim.max_close_periods)
        self.field_map = field_map
        self._kinds = {t.name: topics.kind_of(t.name) for t in topics.inputs()}
        self._fast = {k: fast_validator(k) for k in set(self._kinds.values())}

    def due_decisions(self) -> list[int]:
        """Periods whose decision is owed: period 0 once the origin is known, k + 1 once k has closed."""
        if self.clock.origin is None:
            return []
        return list(range(self.state.decided_through + 1, self.clock.closed_through + 2))

    def _validate(self, kind: str, msg: Inbound) -> tuple[dict[str, Any], bytes]:
        """(record, value to store): the value itself, or the mapped record's JSON for a foreign one."""
        if msg.value is None:
            raise SchemaError(kind, TOMBSTONE)
        if len(msg.value) > self.limits.max_record_bytes:
            raise SchemaError(kind, f"record of {len(msg.value)} bytes is over max_record_bytes "
                              f"({self.limits.max_record_bytes}); not read")
        fast = self._fast[kind]
        if fast is not None:
            try:
                record = fast(msg.value)
            except ValueError:
                pass
            else:
                if not maybe_duplicate_keys(msg.value, record):
                    return record, msg.value
        if self.field_map is not None:
            try:
                raw = parse(kind, msg.value)
            except SchemaError:
                raw = None  # decode below words the reason
            if isinstance(raw, dict) and "schema_version" not in raw:
                record = self._map(kind, msg, raw)
                return record, json.dumps(record).encode()
        return decode(kind, msg.value), msg.value

    def _map(self, kind: str, msg: Inbound, raw: dict[str, Any]) -> dict[str, Any]:

        fm = self.field_map
        named = dict(msg.headers).get(SOURCE_HEADER)
        if named is not None:
            source = named.decode()
        else:
            fits = [n for n, s in fm.sources.items() if s.kind == kind and _shape_fits(s, raw)]
            if len(fits) != 1:
                why = "no configured source fits" if not fits else f"sources {fits} all fit"
                raise FieldMapError(kind, "field-map", f"foreign record on {msg.topic}: {why}; "
                                    f"name one in header {SOURCE_HEADER!r}")
            source = fits[0]
        mapped_kind, record = fm.apply(source, raw, arrived_at=None)
        if mapped_kind != kind:
            raise FieldMapError(kind, source, f"maps to {mapped_kind}, but {msg.topic} carries {kind}")
        return record

    def _median_clock_time(self, records: Sequence[Inbound]) -> int | None:
        """Median clock time (us) of the records of a batch that validate (a first batch's reference)."""
        times = []
        for msg in records:
            if msg.offset > self.state.positions.get((msg.topic, msg.partition), -1):
                kind = self._kinds[msg.topic]
                try:
                    times.append(to_us(clock_time(kind, self._validate(kind, msg)[0])))
                except ValueError:  # SchemaError is one
                    continue
        return sorted(times)[len(times) // 2] if times else None

    def step(self, records: Sequence[Inbound], active: Collection[tuple[str, int]] | None = None) -> StepResult:
        """Validate and clock one micro-batch, then advance the clock.

        Parameters
        ----------
        records : consumed records, in order per partition.
        active : partitions with records still to deliver after these (see `PeriodClock.advance`); None:
            all caught up (an in-process feed in clock order).
        """
        st, counts, clock = self.state, self.state.counts, self.clock
        dlq, max_dl = self.topics.dead_letters.name, self.limits.dead_letter_max_bytes
        dead: list[Outbound] = []
        rows: dict[str, KindRows] = {}
        sources: dict[str, list[Inbound]] = {}  # the record behind each row, for a dead letter the store asks for
        folded: dict[tuple[Any, ...], tuple[int, dict[str, Any]]] = {}
        positions = st.positions
        # a stream without origin or clock yet is bounded against this batch's median clock time
        reference = None if clock.anchored else self._median_clock_time(records)
        for msg in records:
            pos = (msg.topic, msg.partition)
            if msg.offset <= positions.get(pos, -1):
                counts["skipped_redelivered"] += 1
                continue
            positions[pos] = msg.offset
            counts["records_in"] += 1
            kind = self._kinds[msg.topic]
            try:
                record, value = self._validate(kind, msg)
                us = to_us(clock_time(kind, record))
            except SchemaError as exc:
                dead.append(dead_letter(msg, exc, dlq, max_dl))
                counts["dead_letters"] += 1
                continue
            except ValueError as exc:  # a pattern-valid time that does not exist (e.g. second 60)
                dead.append(dead_letter(msg, SchemaError(kind, f"unreadable time: {exc}", clock_field(kind)), dlq,
                                        max_dl))
                counts["dead_letters"] += 1
                continue
            if reference is not None or not clock.low_us <= us <= clock.high_us:
                why = clock.bound_error(us, reference)
                if why is not None:
                    name = clock_field(kind)
                    exc = EventTimeError(kind, f"field {name!r} = {wire_us(us)} {why}; not ingested", name)
                    dead.append(dead_letter(msg, exc, dlq, max_dl))
                    counts["dead_letters"] += 1
                    continue
            index, late = clock.assign(us, pos)
            counts["processed"] += 1
            if late:
                counts["late"] += 1
            # late: seen by the next decision still to be made; else by the one at its period's close
            kr = rows.get(kind)
            if kr is None:
                kr = rows[kind] = KindRows()
                sources[kind] = []
            if value is not msg.value and kind == "gpu_telemetry" and record["gpu"] is not None:
                # a mapped Prometheus sample carries one metric: fold the samples of one GPU and instant
                key = (us, record["hostname"], record["gpu"])
                if key in folded:
                    i, merged = folded[key]
                    merged.update((k, v) for k, v in record.items() if v is not None)
                    kr.values[i] = json.dumps(merged).encode()
                    continue
                folded[key] = (len(kr.values), dict(record))
            kr.values.append(value)
            kr.decision_period.append(clock.closed_through + 2 if late else max(index + 1, 1))
            kr.late.append(late)
            sources[kind].append(msg)
        for kind, kr in rows.items():  # what the store's reader refuses is dead-lettered, never a failed commit
            kr.frame, refused = readable(kind, kr.values)
            for i, exc in refused.items():
                why = SchemaError(kind, f"the store cannot read this record: {str(exc)[:300]}")
                dead.append(dead_letter(sources[kind][i], why, dlq, max_dl))
                counts["processed"] -= 1
                counts["dead_letters"] += 1
                counts["late"] -= kr.late[i]
            if refused:
                kr.drop(set(refused))
                kr.frame, _ = readable(kind, kr.values)
        clock.advance(active)
        clock.sync()
        st.origin, st.max_event_at, st.closed_through = clock.origin, clock.max_event_at, clock.closed_through
        st.partition_max_us = dict(clock.partition_max_us)
        return StepResult(dead, IngestBatch(rows, st), self.due_decisions(), clock.gaps)


def _shape_fits(source: Any, raw: dict[str, Any]) -> bool:
    """Whether a foreign record has the shape of a configured source (see streams/fieldmaps/default.toml)."""
    if source.shape == "prometheus":
        return "labels" in raw and raw.get("name") in source.metrics
    if source.shape == "otel_span":
        return "startTimeUnixNano" in raw and "endTimeUnixNano" in raw
    names = [n for spec in source.fields.values() for n in spec.names]
    return all(any(n in raw for n in source.fields[f].names) for f in ("location", "interval_start")
               if f in source.fields) and bool(names)
