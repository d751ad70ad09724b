"""Typed records of the six fixed-shape wire kinds, and their JSON and polars forms.

The JSON Schemas in ``schemas/`` are the contract; these frozen dataclasses mirror them (tests check the
field sets, required-ness and that every ``to_wire()`` validates). On the wire timestamps are RFC 3339 UTC
strings with microseconds (``2023-07-01T13:00:00.000000Z``); in Python they are tz-aware ``datetime``; in
frames polars ``Datetime("us", "UTC")``. ``schema_version`` is implied by the class and written by
``to_wire``.

Storage: the frames are what the world model stores (`frame_schema`); a record class names the integer
fields its DuckDB table keeps as 32-bit ``INTEGER`` (``STORED_INT32``), and `stored_schema` gives the
narrowest type each field must fit, which `schemas.validator` enforces (integers within the type's range,
floats finite), so a record that validates can always be stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from types import NoneType, UnionType
from typing import Any, ClassVar, Self, get_args, get_origin, get_type_hints

import polars as pl

from schemas import SCHEMA_VERSION, SchemaError, validator
from schemas.fleet import KvCacheDtype
from schemas.protocol import RequestClass
from schemas.timestamps import ts_from_wire, ts_to_wire

_FRAME_TS = "%Y-%m-%dT%H:%M:%S%.6fZ"
_PARSE_TS = "%Y-%m-%dT%H:%M:%S%.f%#z"


class Market(StrEnum):
    PJM = "PJM"
    ERCOT = "ERCOT"
    CAISO = "CAISO"


class MarketRun(StrEnum):
    DAY_AHEAD_HOURLY = "DAY_AHEAD_HOURLY"
    REAL_TIME_HOURLY = "REAL_TIME_HOURLY"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class FleetEventKind(StrEnum):
    REPLICA_STARTED = "replica_started"
    REPLICA_READY = "replica_ready"
    REPLICA_STOPPED = "replica_stopped"
    REPLICA_RECONFIGURED = "replica_reconfigured"


def _codec(hint: Any) -> tuple[Callable[[Any], Any], Callable[[Any], Any], pl.DataType]:
    """(to_wire, from_wire, polars dtype) for one annotated field type."""
    if isinstance(hint, UnionType) and NoneType in get_args(hint):
        (inner,) = (a for a in get_args(hint) if a is not NoneType)
        out, inn, dtype = _codec(inner)
        return (lambda v: None if v is None else out(v)), (lambda v: None if v is None else inn(v)), dtype
    if hint is datetime:
        return ts_to_wire, ts_from_wire, pl.Datetime("us", "UTC")
    if get_origin(hint) is tuple:
        item = get_args(hint)[0]
        return list, tuple, pl.List(pl.Int64 if item is int else pl.String)
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return str, hint, pl.String
    simple = {float: pl.Float64, int: pl.Int64, str: pl.String, bool: pl.Boolean}
    return (lambda v: v), (float if hint is float else lambda v: v), simple[hint]


class WireRecord:
    """Base of the typed records: ``KIND`` names the schema; codecs are derived from the annotations."""

    __slots__ = ()
    KIND: ClassVar[str]
    #: integer fields the world model's DuckDB table stores as 32-bit INTEGER (worldmodel/state/migrations.py)
    STORED_INT32: ClassVar[frozenset[str]] = frozenset()
    _codecs: ClassVar[tuple[tuple[str, Callable[[Any], Any], Callable[[Any], Any], pl.DataType], ...]]
    _optional: ClassVar[frozenset[str]]

    def __init_subclass__(cls, kind: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind:
            cls.KIND = kind

    @classmethod
    def codecs(cls) -> tuple[tuple[str, Callable[[Any], Any], Callable[[Any], Any], pl.DataType], ...]:
        """Per field: (name, to_wire, from_wire, polars dtype), in schema order."""
        if "_codecs" not in cls.__dict__:
            hints = get_type_hints(cls)
            cls._codecs = tuple((f.name, *_codec(hints[f.name])) for f in fields(cls))  # type: ignore[arg-type]
        return cls._codecs

    @classmethod
    def optional(cls) -> frozenset[str]:
        """The fields with a default (not required on the wire): left out of a wire dict when None."""
        if "_optional" not in cls.__dict__:
            cls._optional = frozenset(f.name for f in fields(cls) if f.default is not MISSING)  # type: ignore[arg-type]
        return cls._optional

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready wire dict (timestamps as RFC 3339 ``Z`` strings, tuples as lists); an optional field
        that is None is left out (a record without it is v1 as it was)."""
        wire: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        optional = self.optional()
        for name, out, _, _ in self.codecs():
            value = getattr(self, name)
            if value is not None or name not in optional:
                wire[name] = out(value)
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], *, validate: bool = True) -> Self:
        """Build the record from its wire dict; ``validate`` checks the schema first (SchemaError if not).

        An optional field absent from the wire dict takes its default.
        """
        if validate:
            validator(cls.KIND)(dict(wire))
        return cls(**{name: inn(wire[name]) for name, _, inn, _ in cls.codecs() if name in wire})


@dataclass(frozen=True, slots=True)
class RequestArrival(WireRecord, kind="request_arrival"):
    """A request at arrival; no output length (known only at completion). SLAs in ms, None if deferrable."""

    STORED_INT32 = frozenset({"input_tokens"})

    request_id: str
    event_at: datetime
    arrived_at: datetime
    request_class: RequestClass
    model: str
    input_tokens: int
    prefix_block_ids: tuple[int, ...]
    site: str
    tenant: str
    allowed_regions: tuple[str, ...]
    sla_ttft_ms: float | None
    sla_tpot_ms: float | None
    deadline_at: datetime | None


@dataclass(frozen=True, slots=True)
class RequestCompletion(WireRecord, kind="request_completion"):
    """A finished request: tokens, instants, latencies (s) and its SLA outcome."""

    STORED_INT32 = frozenset({"input_tokens", "output_tokens", "cached_input_tokens"})

    request_id: str
    event_at: datetime
    arrived_at: datetime
    request_class: RequestClass
    model: str
    site: str
    replica_id: str
    gpu_type: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    queued_at: datetime
    first_token_at: datetime | None
    ttft_s: float | None
    tpot_s: float
    e2e_s: float
    sla_met: bool
    finish_reason: FinishReason


@dataclass(frozen=True, slots=True)
class GpuTelemetry(WireRecord, kind="gpu_telemetry"):
    """One GPU sample, DCGM names and units (W, mJ, MHz, %, MiB, C); None = not reported in this sample."""

    STORED_INT32 = frozenset({"gpu", "num_requests_running", "num_requests_waiting"})

    event_at: datetime
    arrived_at: datetime
    site: str
    hostname: str
    gpu: int | None
    uuid: str | None
    modelName: str | None  # noqa: N815 - DCGM label, kept verbatim
    replica_id: str | None
    model_name: str | None
    DCGM_FI_DEV_POWER_USAGE: float | None  # noqa: N815
    DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: float | None  # noqa: N815
    DCGM_FI_DEV_SM_CLOCK: float | None  # noqa: N815
    DCGM_FI_DEV_GPU_UTIL: float | None  # noqa: N815
    DCGM_FI_DEV_FB_USED: float | None  # noqa: N815
    DCGM_FI_DEV_GPU_TEMP: float | None  # noqa: N815
    num_requests_running: int | None
    num_requests_waiting: int | None
    kv_cache_usage_perc: float | None


@dataclass(frozen=True, slots=True)
class Price(WireRecord, kind="price"):
    """One LMP interval ($/MWh) with the instant it was published; event_at = interval_start."""

    market: Market
    location: str
    market_run: MarketRun
    interval_start: datetime
    interval_end: datetime
    lmp_usd_mwh: float
    published_at: datetime
    event_at: datetime
    arrived_at: datetime


@dataclass(frozen=True, slots=True)
class FleetEvent(WireRecord, kind="fleet_event"):
    """A replica lifecycle or configuration change (clock in MHz, batch cap in sequences).

    kv_cache_dtype : the engine's KV-cache dtype (vLLM `--kv-cache-dtype`, a `schemas.fleet.KvCacheDtype`
        value); None when not reported: the replica keeps the dtype its last event reported, "auto" (the
        activation dtype) when none did (`reported_kv_cache_dtype`). Keyword-only.
    """

    STORED_INT32 = frozenset({"tp", "max_batch"})

    event_at: datetime
    arrived_at: datetime
    site: str
    replica_id: str
    model: str
    gpu_type: str
    kind: FleetEventKind
    tp: int
    precision: str
    kv_cache_dtype: str | None = field(default=None, kw_only=True)
    sm_clock_mhz: int
    max_batch: int
    hostnames: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeadLetterRecord(WireRecord, kind="dead_letter"):
    """A failed record: the original value byte-exact (base64 on the wire), where it came from, and why.

    When the whole original would make the dead letter too large to publish, `original_value_b64` holds
    its first bytes only and `original_length` (bytes) and `original_sha256` (hex) describe the whole;
    both are None (and left out of the wire dict) when the original is complete.
    """

    reason: str
    original_value_b64: str
    source_topic: str
    source_partition: int
    source_offset: int
    failed_at: datetime
    error_class: str
    original_length: int | None = None
    original_sha256: str | None = None

    @property
    def truncated(self) -> bool:
        """Whether `original_value_b64` holds only a prefix of the original."""
        return self.original_length is not None


#: The typed record class of each fixed-shape kind.
RECORD_TYPES: dict[str, type[WireRecord]] = {
    cls.KIND: cls
    for cls in (RequestArrival, RequestCompletion, GpuTelemetry, Price, FleetEvent, DeadLetterRecord)
}


def _record_type(kind: str) -> type[WireRecord]:
    try:
        return RECORD_TYPES[kind]
    except KeyError:
        raise KeyError(
            f"no typed record for kind {kind!r}; fixed-shape kinds: {', '.join(RECORD_TYPES)}"
        ) from None


def frame_schema(kind: str) -> dict[str, pl.DataType]:
    """The polars schema of a ``kind`` frame (timestamps ``Datetime("us", "UTC")``), in wire field order."""
    return {name: dtype for name, _, _, dtype in _record_type(kind).codecs()}


def stored_schema(kind: str) -> dict[str, pl.DataType]:
    """The type each field of `kind` is stored as: `frame_schema`, with the ``STORED_INT32`` fields as Int32.

    A value must fit it to be stored: Int32/Int64 within the type's range (list items too), Float64 finite.
    """
    cls = _record_type(kind)
    return {name: pl.Int32 if name in cls.STORED_INT32 else dtype for name, dtype in frame_schema(kind).items()}


def reported_kv_cache_dtype(events: pl.DataFrame) -> pl.DataFrame:
    """Fleet events with each one's KV-cache dtype as the replica runs it: where an event does not report it (null,
    or a frame from before the field), the dtype the replica's last earlier event reported, else "auto". An engine
    keeps its dtype until it restarts, so a reconfiguration that reports only the clock is no KV change. The world
    state's replica state reads fleet events by the same rule (worldmodel/state/store.py, in SQL).

    >>> from datetime import UTC, datetime, timedelta
    >>> t = [datetime(2023, 7, 1, tzinfo=UTC) + timedelta(minutes=m) for m in (2, 0, 1, 0)]
    >>> ev = pl.DataFrame({"replica_id": ["a", "a", "a", "b"], "event_at": t,
    ...                    "kv_cache_dtype": [None, "fp8", None, None]})
    >>> reported_kv_cache_dtype(ev)["kv_cache_dtype"].to_list()
    ['fp8', 'fp8', 'fp8', 'auto']
    """
    auto = KvCacheDtype.AUTO.value
    if "kv_cache_dtype" not in events.columns:
        return events.with_columns(pl.lit(auto).alias("kv_cache_dtype"))
    kv = pl.col("kv_cache_dtype").forward_fill().over("replica_id").fill_null(auto)
    return (events.with_row_index("_row").sort("event_at", "_row").with_columns(kv)
            .sort("_row").drop("_row"))  # fmt: skip


def int_range(dtype: pl.DataType) -> tuple[int, int] | None:
    """(min, max) of an integer storage type (Int32, Int64), else None.

    >>> int_range(pl.Int32)
    (-2147483648, 2147483647)
    """
    if dtype == pl.Int32:
        return -(2**31), 2**31 - 1
    if dtype == pl.Int64:
        return -(2**63), 2**63 - 1
    return None


def frame_to_wire(kind: str, df: pl.DataFrame, *, validate: bool = True) -> list[dict[str, Any]]:
    """Turn a frame of ``kind`` records into JSON-ready wire dicts.

    Parameters
    ----------
    kind : a fixed-shape record kind.
    df : one row per record, one column per field (a ``schema_version`` column is optional; an optional field's
        column too: a frame without it, e.g. recorded before the field, leaves it out of every row); tz-aware
        Datetime columns (any zone, converted to UTC).
    validate : check every row against the schema (SchemaError naming the row and field).
    """
    schema = frame_schema(kind)
    optional = _record_type(kind).optional()  # left out when null, as `to_wire` does
    cols = [c for c in df.columns if c != "schema_version"]
    missing = [c for c in schema if c not in cols and c not in optional]
    extra = sorted(set(cols) - set(schema))
    if missing or extra:
        field = (missing or extra)[0]
        raise SchemaError(
            kind, f"frame columns differ from the schema: missing {missing}, unexpected {extra}", field
        )
    exprs = []
    for name in (c for c in schema if c in cols):
        dtype = df.schema[name]
        if isinstance(dtype, pl.Datetime):
            if dtype.time_zone is None:
                raise SchemaError(
                    kind, f"column {name!r} is a naive Datetime; use a tz-aware (UTC) one", name
                )
            exprs.append(pl.col(name).dt.convert_time_zone("UTC").dt.strftime(_FRAME_TS))
        else:
            exprs.append(pl.col(name))
    rows = df.select(pl.lit(SCHEMA_VERSION).alias("schema_version"), *exprs).to_dicts()
    if optional:
        rows = [{k: v for k, v in row.items() if v is not None or k not in optional} for row in rows]
    if validate:
        _validate_rows(kind, rows)
    return rows


def wire_to_frame(kind: str, rows: Iterable[Mapping[str, Any]], *, validate: bool = True) -> pl.DataFrame:
    """Build a polars frame of ``kind`` from wire dicts (timestamps -> ``Datetime("us", "UTC")``).

    Parameters
    ----------
    kind : a fixed-shape record kind.
    rows : wire dicts, e.g. decoded Kafka values.
    validate : check every row against the schema first (SchemaError naming the row and field).
    """
    rows = list(rows)
    if validate:
        _validate_rows(kind, rows)
    schema = frame_schema(kind)
    raw = {n: pl.String if isinstance(d, pl.Datetime) else d for n, d in schema.items()}
    df = pl.DataFrame([{n: r.get(n) for n in schema} for r in rows], schema=raw, orient="row")
    return df.with_columns(
        pl.col(n).str.to_datetime(_PARSE_TS, time_unit="us", time_zone="UTC")
        for n, d in schema.items()
        if isinstance(d, pl.Datetime)
    )


def _validate_rows(kind: str, rows: list[Mapping[str, Any]]) -> None:
    check = validator(kind)
    for i, row in enumerate(rows):
        try:
            check(row)  # type: ignore[arg-type]
        except SchemaError as exc:
            raise SchemaError(kind, f"row {i}: {exc.reason}", exc.field) from None
