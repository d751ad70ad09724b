"""Typed records against the schema files (never the other way round), wire and frame round trips."""

from __future__ import annotations

import json
import types
from dataclasses import MISSING, fields, replace
from datetime import UTC, datetime, timedelta
from typing import get_type_hints
from zoneinfo import ZoneInfo

import polars as pl
import pytest

from schemas import SchemaError, load, validate
from schemas.fleet import KvCacheDtype, Precision
from schemas.protocol import RequestClass
from schemas.records import (
    RECORD_TYPES,
    DeadLetterRecord,
    FinishReason,
    FleetEvent,
    FleetEventKind,
    GpuTelemetry,
    Market,
    MarketRun,
    Price,
    RequestArrival,
    RequestCompletion,
    frame_schema,
    frame_to_wire,
    ts_to_wire,
    wire_to_frame,
)

T0 = datetime(2023, 7, 1, 13, tzinfo=UTC)
MS = timedelta(milliseconds=1)

RECORDS = {
    "request_arrival": RequestArrival(
        "req-1",
        T0,
        T0 + 3 * MS,
        RequestClass.BATCH,
        "llama-3.1-70b",
        4096,
        (7, 8, 9),
        "ercot-1",
        "acme",
        ("us-central", "us-east"),
        None,
        None,
        T0 + timedelta(minutes=95),
    ),
    "request_completion": RequestCompletion(
        "req-2",
        T0 + timedelta(seconds=9),
        T0 + timedelta(seconds=9.01),
        RequestClass.CODE,
        "llama-3.1-8b",
        "pjm-1",
        "r-8b-3",
        "A100",
        812,
        150,
        512,
        T0,
        T0 + 400 * MS,
        0.4,
        0.0577,
        9.0,
        False,
        FinishReason.LENGTH,
    ),
    "gpu_telemetry": GpuTelemetry(
        T0,
        T0 + 250 * MS,
        "pjm-1",
        "node-01",
        3,
        "GPU-5f1c",
        "NVIDIA H100 80GB HBM3",
        None,
        None,
        71.5,
        1.25e9,
        1980.0,
        0.0,
        1024.0,
        41.0,
        None,
        None,
        None,
    ),
    "price": Price(
        Market.PJM,
        "51217",
        MarketRun.REAL_TIME_HOURLY,
        T0,
        T0 + timedelta(hours=1),
        -12.75,
        T0 + timedelta(hours=1),
        T0,
        T0 + timedelta(hours=1, seconds=2),
    ),
    "fleet_event": FleetEvent(
        T0,
        T0,
        "caiso-1",
        "r-70b-1",
        "llama-3.1-70b",
        "H100",
        FleetEventKind.REPLICA_RECONFIGURED,
        4,
        "fp8",
        1410,
        128,
        ("node-02",),
    ),
    "dead_letter": DeadLetterRecord(
        "invalid JSON: Expecting value", "/w==", "aurelius.prices", 2, 99, T0, "SchemaError"
    ),
}


def _nullable(hint) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in hint.__args__


@pytest.mark.parametrize("kind", list(RECORD_TYPES))
def test_record_type_matches_schema(kind):
    cls, sch = RECORD_TYPES[kind], load(kind)
    names = [f.name for f in fields(cls)]
    assert ["schema_version", *names] == list(sch["properties"]), "same fields, schema order"
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    assert required | {"schema_version"} == set(sch["required"])
    hints = get_type_hints(cls)
    for name in names:
        types_ = sch["properties"][name]["type"]
        assert _nullable(hints[name]) == ("null" in types_ if isinstance(types_, list) else False), name


def test_enums_match_schema():
    props = {k: load(k)["properties"] for k in RECORD_TYPES}
    assert [str(c) for c in RequestClass] == props["request_arrival"]["request_class"]["enum"]
    assert [str(c) for c in RequestClass] == props["request_completion"]["request_class"]["enum"]
    assert [str(r) for r in FinishReason] == props["request_completion"]["finish_reason"]["enum"]
    assert [str(m) for m in Market] == props["price"]["market"]["enum"]
    assert [str(r) for r in MarketRun] == props["price"]["market_run"]["enum"]
    assert [str(k) for k in FleetEventKind] == props["fleet_event"]["kind"]["enum"]
    assert {str(p) for p in Precision} <= set(props["fleet_event"]["precision"]["enum"])
    assert [*(str(k) for k in KvCacheDtype), None] == props["fleet_event"]["kv_cache_dtype"]["enum"]


@pytest.mark.parametrize("kind", list(RECORDS))
def test_round_trip(kind):
    record = RECORDS[kind]
    wire = record.to_wire()
    assert validate(kind, wire) is wire
    back = type(record).from_wire(json.loads(json.dumps(wire)))
    assert back == record and type(back) is type(record)


def test_wire_timestamps_are_rfc3339_utc():
    local = datetime(2023, 7, 1, 9, tzinfo=ZoneInfo("America/New_York"))
    assert ts_to_wire(local) == "2023-07-01T13:00:00.000000Z"
    with pytest.raises(ValueError, match="naive"):
        ts_to_wire(datetime(2023, 7, 1, 13))


def test_arrival_has_no_output_length():
    assert "output_tokens" not in {f.name for f in fields(RequestArrival)}
    wire = RECORDS["request_arrival"].to_wire() | {"output_tokens": 10}
    with pytest.raises(SchemaError, match="output_tokens"):
        RequestArrival.from_wire(wire)


def test_from_wire_coerces_json_ints_to_float():
    wire = RECORDS["gpu_telemetry"].to_wire() | {"DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_GPU_UTIL": 0}
    rec = GpuTelemetry.from_wire(wire)
    assert isinstance(rec.DCGM_FI_DEV_SM_CLOCK, float) and rec == RECORDS["gpu_telemetry"]


def test_from_wire_rejects_with_reason():
    wire = RECORDS["price"].to_wire()
    del wire["published_at"]
    with pytest.raises(SchemaError) as info:
        Price.from_wire(wire)
    assert info.value.field == "published_at"


@pytest.mark.parametrize("kind", list(RECORDS))
def test_frame_round_trip(kind):
    rows = [RECORDS[kind].to_wire(), RECORDS[kind].to_wire()]
    df = wire_to_frame(kind, rows)
    assert dict(df.schema) == frame_schema(kind)
    assert all(df.schema[c] == pl.Datetime("us", "UTC") for c in df.columns if c.endswith("_at"))
    assert frame_to_wire(kind, df) == rows


def test_frame_from_simulator_shape():
    """A frame as a producer keeps it: local-zone datetimes are written as UTC; extra columns are refused."""
    df = wire_to_frame("fleet_event", [RECORDS["fleet_event"].to_wire()]).with_columns(
        pl.col("event_at").dt.convert_time_zone("Europe/Berlin")
    )
    assert frame_to_wire("fleet_event", df)[0]["event_at"] == "2023-07-01T13:00:00.000000Z"
    with pytest.raises(SchemaError, match="unexpected"):
        frame_to_wire("fleet_event", df.with_columns(pl.lit(1).alias("output_tokens")))
    with pytest.raises(SchemaError, match="missing") as info:
        frame_to_wire("fleet_event", df.drop("tp"))
    assert info.value.field == "tp"
    with pytest.raises(SchemaError, match="naive"):
        frame_to_wire("fleet_event", df.with_columns(pl.col("event_at").dt.replace_time_zone(None)))


def test_frame_rows_are_validated():
    bad = RECORDS["request_completion"].to_wire() | {"output_tokens": -3}
    with pytest.raises(SchemaError) as info:
        wire_to_frame("request_completion", [RECORDS["request_completion"].to_wire(), bad])
    assert info.value.reason.startswith("row 1: ") and info.value.field == "output_tokens"


def test_fleet_event_kv_cache_dtype_round_trips_and_may_be_absent():
    """The KV-cache dtype rides the wire when reported; a record without it (recorded before the field) decodes
    to None, i.e. "auto", and one with None goes out without it, as v1 was."""
    fp8 = replace(RECORDS["fleet_event"], kv_cache_dtype=KvCacheDtype.FP8.value)
    wire = fp8.to_wire()
    assert wire["kv_cache_dtype"] == "fp8"
    assert FleetEvent.from_wire(json.loads(json.dumps(wire))) == fp8
    old = RECORDS["fleet_event"].to_wire()
    assert "kv_cache_dtype" not in old and FleetEvent.from_wire(old).kv_cache_dtype is None
    assert FleetEvent.from_wire(old | {"kv_cache_dtype": None}) == RECORDS["fleet_event"]
    df = wire_to_frame("fleet_event", [wire, old])
    assert df["kv_cache_dtype"].to_list() == ["fp8", None]
    assert frame_to_wire("fleet_event", df) == [wire, old]
    assert frame_to_wire("fleet_event", df.drop("kv_cache_dtype")) == [old, old]  # a frame from before the field


def test_fleet_event_rejects_an_unknown_kv_cache_dtype():
    wire = RECORDS["fleet_event"].to_wire() | {"kv_cache_dtype": "fp4"}
    with pytest.raises(SchemaError) as info:
        FleetEvent.from_wire(wire)
    assert info.value.field == "kv_cache_dtype" and "one of" in info.value.reason, info.value.reason
