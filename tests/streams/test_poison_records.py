"""Poison records: what Python's json and the schema accepted but the store could not keep (issue 18, item 1).

Each one used to pass validation and then fail the DuckDB commit, so every restart crashed on the same record
(NaN, Infinity, 1e400, a 31-digit integer, an integer over the stored Int32), or to be stored differently from
how it was validated (a repeated key: validated on the last value, stored with the first), or to make a dead
letter too large to publish (a ~750 KB record). Through the `Pipeline` (no broker), each malformed record
must give exactly one dead letter with its reason, and the valid records around it must be committed, with
`records_in = processed + dead_letters`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import timedelta

import polars as pl
import pytest

from schemas import SchemaError, decode, load, validate
from schemas.dead_letter import MAX_REASON_CHARS, DeadLetter, original_bytes
from schemas.records import RECORD_TYPES, DeadLetterRecord, stored_schema
from schemas.topics import Topics
from streams.ingest import DuckDBIngestor
from streams.pipeline import Inbound, Limits, Pipeline, maybe_duplicate_keys, validate_value
from streams.settings import WorkerSettings
from worldmodel.state.migrations import RAW_KINDS

TOPICS = Topics(prefix="x.")
MARK = '"__RAW__"'


def _text(record: dict, field: str, raw: str) -> bytes:
    """`record` as JSON with `field`'s value written as the raw JSON text `raw` (json.dumps cannot write it)."""
    return json.dumps({**record, field: "__RAW__"}).replace(MARK, raw, 1).encode()


def _repeated(record: dict, field: str, first: str, sep: str = ": ", key: str | None = None) -> bytes:
    """`record` as JSON with `field` written twice: `first` (raw JSON), then its real value."""
    text = json.dumps(record)
    at = text.index(f'"{field}"')
    return (text[:at] + f'"{key or field}"{sep}{first}, ' + text[at:]).encode()


def _cases(r) -> dict[str, tuple[str, bytes, str]]:
    """name -> (kind, value, what the reason must say)."""
    a = r.arrival("bad", r.T0 + timedelta(seconds=20))
    tel = {"schema_version": "1", "event_at": "2023-07-01T12:00:20.000000Z", "arrived_at": "2023-07-01T12:00:20Z",
           "site": "pjm", "hostname": "node-01", "gpu": 0, "uuid": None, "modelName": "H100", "replica_id": None,
           "model_name": None, "DCGM_FI_DEV_POWER_USAGE": 350.0, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e9,
           "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_GPU_UTIL": 80.0, "DCGM_FI_DEV_FB_USED": 4e4,
           "DCGM_FI_DEV_GPU_TEMP": 60.0, "num_requests_running": 3, "num_requests_waiting": 0,
           "kv_cache_usage_perc": 0.5}
    p = r.price(r.T0 + timedelta(seconds=20))
    finite = "must be a finite number"
    return {
        "NaN": ("request_arrival", _text(a, "sla_ttft_ms", "NaN"), f"'sla_ttft_ms' {finite} (got NaN"),
        "Infinity": ("price", _text(p, "lmp_usd_mwh", "Infinity"), f"'lmp_usd_mwh' {finite} (got Infinity"),
        "-Infinity": ("gpu_telemetry", _text(tel, "DCGM_FI_DEV_POWER_USAGE", "-Infinity"),
                      f"'DCGM_FI_DEV_POWER_USAGE' {finite} (got -Infinity"),
        "1e400": ("request_arrival", _text(a, "sla_tpot_ms", "1e400"), f"'sla_tpot_ms' {finite} (got 1e400"),
        "31-digit integer": ("request_arrival", _text(a, "input_tokens", "1234567890123456789012345678901"),
                             "'input_tokens' must fit the stored Int32 (-2147483648..2147483647) "
                             "(got 1234567890123456789012345678901)"),
        "over Int32": ("gpu_telemetry", _text(tel, "num_requests_waiting", "3000000000"),
                       "'num_requests_waiting' must fit the stored Int32"),
        "integral float over Int32": ("request_arrival", _text(a, "input_tokens", "3000000000.0"),
                                      "'input_tokens' must fit the stored Int32"),
        "over Int64 in a list": ("request_arrival", _text(a, "prefix_block_ids", "[1, 99999999999999999999]"),
                                 "'prefix_block_ids[1]' must fit the stored Int64"),
        "repeated key, negative first": ("request_arrival", _repeated(a, "input_tokens", "-5"),
                                         "duplicate key 'input_tokens' (values -5 and 512)"),
        "repeated key, spaced": ("request_arrival", _repeated(a, "input_tokens", "-5", sep=" \t: "),
                                 "duplicate key 'input_tokens'"),
        "repeated key, escaped": ("request_arrival", _repeated(a, "input_tokens", "7", key="\\u0069nput_tokens"),
                                  "duplicate key 'input_tokens' (values 7 and 512)"),
        "over max_record_bytes": ("request_arrival", json.dumps({**a, "tenant": "t" * 750_000}).encode(),
                                  "bytes is over max_record_bytes (262144)"),
    }


#: the keys of `_cases`, in order (its values need the `records` fixture, parametrize needs the names first)
NAMES = ["NaN", "Infinity", "-Infinity", "1e400", "31-digit integer", "over Int32", "integral float over Int32",
         "over Int64 in a list", "repeated key, negative first", "repeated key, spaced", "repeated key, escaped",
         "over max_record_bytes"]


def _good(r, kind: str, i: int) -> bytes:
    at = r.T0 + timedelta(seconds=10 + 20 * i)
    if kind == "price":
        return json.dumps(r.price(at + timedelta(hours=i))).encode()
    if kind == "gpu_telemetry":
        return json.dumps({"schema_version": "1", "event_at": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                           "arrived_at": "2023-07-01T12:00:00Z", "site": "pjm", "hostname": f"node-{i}", "gpu": 0,
                           "uuid": None, "modelName": None, "replica_id": None, "model_name": None,
                           "DCGM_FI_DEV_POWER_USAGE": 300.0, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": None,
                           "DCGM_FI_DEV_SM_CLOCK": None, "DCGM_FI_DEV_GPU_UTIL": None, "DCGM_FI_DEV_FB_USED": None,
                           "DCGM_FI_DEV_GPU_TEMP": None, "num_requests_running": 1, "num_requests_waiting": 2,
                           "kv_cache_usage_perc": None}).encode()
    return json.dumps(r.arrival(f"good-{i}", at)).encode()


@pytest.mark.parametrize("name", NAMES)
def test_each_poison_record_is_one_dead_letter_and_its_neighbours_are_stored(records, name):
    kind, bad, says = _cases(records)[name]
    topic = TOPICS.for_kind(kind).name
    ing = DuckDBIngestor.open(":memory:")
    pipe = Pipeline(TOPICS, ing.load_state(), period_s=60, allowed_lateness_s=5, origin=records.T0)
    batch = [Inbound(topic, 0, 0, _good(records, kind, 0)), Inbound(topic, 0, 1, bad),
             Inbound(topic, 0, 2, _good(records, kind, 1))]
    res = pipe.step(batch)

    assert len(res.dead_letters) == 1, [json.loads(o.value)["reason"] for o in res.dead_letters]
    out = res.dead_letters[0]
    dl = json.loads(out.value)
    assert says in dl["reason"], dl["reason"]
    assert (dl["source_topic"], dl["source_partition"], dl["source_offset"]) == (topic, 0, 1)
    assert dl["error_class"] == "schemas.SchemaError"
    headers = dict(out.headers)
    assert headers["kafka_dlt-exception-message"] == headers["__connect.errors.exception.message"]
    assert headers["kafka_dlt-exception-message"].decode() == dl["reason"]
    assert out.key == f"{topic}/0/1".encode()
    validate("dead_letter", dl)
    assert len(out.value) + sum(len(k) + len(v) for k, v in out.headers) <= Limits().dead_letter_max_bytes

    c = pipe.state.counts
    assert (c["records_in"], c["processed"], c["dead_letters"]) == (3, 2, 1)
    assert c["records_in"] == c["processed"] + c["dead_letters"]
    assert ing.commit(res.batch) == 2  # the commit that used to fail (or to store the first of two values)
    table = RAW_KINDS[kind].table
    assert ing.con.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (2,)
    if kind == "request_arrival":
        stored = ing.con.execute("SELECT request_id, input_tokens FROM request_arrival ORDER BY 1").fetchall()
        assert stored == [("good-0", 512), ("good-1", 512)]


def test_a_repeated_key_never_passes_the_fast_path(records):
    a = records.arrival("r", records.T0)
    good = json.dumps(a).encode()
    assert not maybe_duplicate_keys(good, validate_value("request_arrival", good))
    repeated = [_repeated(a, "input_tokens", "-5"), _repeated(a, "input_tokens", "-5", sep="\n:"),
                _repeated(a, "tenant", '"x"', key="ten\\u0061nt"), _repeated(a, "sla_ttft_ms", "1.0", sep=" :  ")]
    for raw in repeated:
        with pytest.raises(SchemaError, match="duplicate key"):
            validate_value("request_arrival", raw)
    pipe = Pipeline(TOPICS, DuckDBIngestor.open(":memory:").load_state(), 60, 5, origin=records.T0)
    res = pipe.step([Inbound(TOPICS.request_arrivals.name, 0, i, raw) for i, raw in enumerate(repeated)])
    assert ["duplicate key" in json.loads(o.value)["reason"] for o in res.dead_letters] == [True] * 4
    # a string that looks like a key end only sends the record down the slow path, which accepts it
    tricky = json.dumps({**a, "tenant": '":x\\" :'}).encode()
    assert maybe_duplicate_keys(tricky, json.loads(tricky))
    assert validate_value("request_arrival", tricky)["tenant"] == '":x\\" :'


def test_decode_refuses_what_the_store_cannot_keep():
    for raw, says in ((b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested too deeply"),
                      (b'{"a": ' + b"1" * 5000 + b"}", "invalid JSON: Exceeds the limit"),
                      (b"NaN", "got the non-finite number NaN"),
                      (b'{"tenant": "a\\ud800"}', "'tenant' holds a lone UTF-16 surrogate")):
        with pytest.raises(SchemaError) as info:
            decode("request_arrival", raw)
        assert says in info.value.reason, info.value.reason


def test_stored_types_match_the_world_model_tables():
    """The Int32 fields of schemas.records are the INTEGER columns of worldmodel/state/migrations.py."""
    for kind, raw in RAW_KINDS.items():
        stored = stored_schema(kind)
        for column, ddl in raw.columns:
            sql = ddl.replace("NOT NULL", "").strip()
            dtype = stored[column]
            if sql == "INTEGER":
                assert dtype == pl.Int32, (kind, column)
            elif sql in ("BIGINT", "DOUBLE"):
                assert dtype in (pl.Int64, pl.Float64), (kind, column)
            elif sql == "BIGINT[]":
                assert dtype == pl.List(pl.Int64), (kind, column)
            if dtype == pl.Int32:
                assert sql == "INTEGER", (kind, column)
    assert set(RAW_KINDS) <= set(RECORD_TYPES)


# --- dead letters stay publishable -------------------------------------------------------------------------


def _size(dl: DeadLetter) -> int:
    return len(dl.value()) + sum(len(k) + len(v) for k, v in dl.headers)


def test_a_750_kb_record_makes_a_dead_letter_under_the_limit_with_hash_and_length(records):
    raw = json.dumps({**records.arrival("big", records.T0), "tenant": "t" * 750_000}).encode()
    topic = TOPICS.request_arrivals.name
    pipe = Pipeline(TOPICS, DuckDBIngestor.open(":memory:").load_state(), 60, 5, origin=records.T0)
    (out,) = pipe.step([Inbound(topic, 3, 41, raw)]).dead_letters
    limit = WorkerSettings().dead_letter_max_bytes
    assert limit < 1_000_000  # the producer's request limit
    assert len(out.value) + sum(len(k) + len(v) for k, v in out.headers) <= limit
    wire = json.loads(out.value)
    validate("dead_letter", wire)
    rec = DeadLetterRecord.from_wire(wire)
    assert rec.truncated and rec.original_length == len(raw)
    assert rec.original_sha256 == hashlib.sha256(raw).hexdigest()
    kept = original_bytes(rec)
    assert raw.startswith(kept) and len(kept) > limit // 2  # as much of the original as fits
    assert "over max_record_bytes" in rec.reason and dict(out.headers)["__connect.errors.offset"] == b"41"


@pytest.mark.parametrize("max_bytes", [20_000, 65_536, 300_000])
def test_dead_letter_size_is_bounded_and_a_small_one_is_whole(max_bytes):
    big = bytes(range(256)) * 4000  # 1 MB, not UTF-8
    exc = SchemaError("price", "x" * 50_000)
    dl = DeadLetter.build(big, "aurelius.prices", 0, 9, exc, max_bytes=max_bytes)
    assert max_bytes - 4 <= _size(dl) <= max_bytes  # fills the room up to one base64 quantum
    assert len(dl.record.reason) <= MAX_REASON_CHARS + 20 and dl.original is big
    assert dl.record.original_length == len(big) and original_bytes(dl.record) == big[: len(original_bytes(dl.record))]
    assert dl.record.original_sha256 == hashlib.sha256(big).hexdigest()
    validate("dead_letter", json.loads(dl.value()))

    small = DeadLetter.build(b'{"a": 1}', "aurelius.prices", 0, 10, exc, max_bytes=max_bytes)
    wire = json.loads(small.value())
    assert not small.record.truncated and base64.b64decode(wire["original_value_b64"]) == b'{"a": 1}'
    assert set(wire) == set(load("dead_letter")["required"])  # as before: v1 readers see no new field


def test_pipeline_dead_letters_respect_a_configured_bound(records):
    limits = Limits(max_record_bytes=1_000_000, dead_letter_max_bytes=40_000)
    raw = json.dumps({**records.arrival("r", records.T0), "tenant": 7, "site": "s" * 200_000}).encode()
    pipe = Pipeline(TOPICS, DuckDBIngestor.open(":memory:").load_state(), 60, 5, origin=records.T0, limits=limits)
    (out,) = pipe.step([Inbound(TOPICS.request_arrivals.name, 0, 0, raw)]).dead_letters
    assert len(out.value) + sum(len(k) + len(v) for k, v in out.headers) <= 40_000
    rec = DeadLetterRecord.from_wire(json.loads(out.value))
    assert rec.truncated and rec.original_length == len(raw) and "'tenant'" in rec.reason
    assert Limits.from_settings(WorkerSettings()) == Limits()
