"""Dead letters: byte-exact originals, the reason, and Spring + Kafka Connect DLQ headers."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime

import pytest

from schemas import SchemaError, decode, validate
from schemas.dead_letter import DeadLetter, exception_fqcn, original_bytes
from schemas.records import DeadLetterRecord

AT = datetime(2023, 7, 1, 13, 0, 5, tzinfo=UTC)
BAD_TELEMETRY = b'{"schema_version": "1", "hostname": "node-01", "gpu": -1}'


def _rejected(raw: bytes) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        decode("gpu_telemetry", raw)
    return info.value


def test_schema_failure_becomes_a_dead_letter():
    exc = _rejected(BAD_TELEMETRY)
    dl = DeadLetter.build(BAD_TELEMETRY, "aurelius.gpu_telemetry", 3, 4_000_000_000, exc, failed_at=AT)
    rec = dl.record
    assert rec.reason == exc.reason and "'event_at'" in rec.reason
    assert (rec.source_topic, rec.source_partition, rec.source_offset) == (
        "aurelius.gpu_telemetry",
        3,
        4_000_000_000,
    )
    assert rec.error_class == "schemas.SchemaError" and rec.failed_at == AT
    assert dl.original is BAD_TELEMETRY and original_bytes(rec) == BAD_TELEMETRY
    value = json.loads(dl.value())
    assert validate("dead_letter", value) == rec.to_wire()
    assert DeadLetterRecord.from_wire(value) == rec


def test_headers_carry_spring_and_connect_conventions():
    exc = _rejected(b"{oops")
    dl = DeadLetter.build(b"{oops", "aurelius.prices", 7, 123456789012, exc, failed_at=AT)
    headers = dict(dl.headers)
    assert len(headers) == len(dl.headers) == 11 and all(isinstance(v, bytes) for v in headers.values())
    # Spring Kafka DeadLetterPublishingRecoverer: partition int32 and offset int64, big-endian
    assert headers["kafka_dlt-original-topic"] == b"aurelius.prices"
    assert struct.unpack(">i", headers["kafka_dlt-original-partition"]) == (7,)
    assert struct.unpack(">q", headers["kafka_dlt-original-offset"]) == (123456789012,)
    assert headers["kafka_dlt-exception-fqcn"] == b"schemas.SchemaError"
    assert headers["kafka_dlt-exception-message"].decode().startswith("invalid JSON: ")
    # Kafka Connect DeadLetterQueueReporter: decimal strings
    assert headers["__connect.errors.topic"] == b"aurelius.prices"
    assert headers["__connect.errors.partition"] == b"7"
    assert headers["__connect.errors.offset"] == b"123456789012"
    assert headers["__connect.errors.exception.class.name"] == b"schemas.SchemaError"
    assert headers["__connect.errors.exception.message"] == headers["kafka_dlt-exception-message"]
    assert headers["__connect.errors.stage"] == b"VALUE_CONVERTER"


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00not utf-8\x00", b"", bytes(range(256))])
def test_original_bytes_kept_exactly(raw):
    dl = DeadLetter.build(raw, "t", 0, 0, ValueError("bad"), failed_at=AT)
    assert dl.record.original_value_b64 == base64.b64encode(raw).decode()
    assert original_bytes(DeadLetterRecord.from_wire(json.loads(dl.value()))) == raw


def test_tombstone_and_plain_exceptions():
    dl = DeadLetter.build(None, "t", 0, 5, KeyError("request_id"), stage="TASK_PUT", failed_at=AT)
    assert dl.original is None and dl.record.original_value_b64 == ""
    assert dl.record.error_class == "KeyError" and dl.record.reason == "'request_id'"
    assert dict(dl.headers)["__connect.errors.stage"] == b"TASK_PUT"
    assert DeadLetter.build(b"x", "t", 0, 0, RuntimeError(), failed_at=AT).record.reason == "RuntimeError"
    assert (
        DeadLetter.build(b"x", "t", 0, 0, ValueError("v"), "own reason", failed_at=AT).record.reason
        == "own reason"
    )


def test_failed_at_defaults_to_now_utc():
    dl = DeadLetter.build(b"x", "t", 0, 0, ValueError("v"))
    assert dl.record.failed_at.tzinfo is not None
    assert abs((datetime.now(UTC) - dl.record.failed_at).total_seconds()) < 60


def test_bad_arguments():
    with pytest.raises(ValueError, match="stage"):
        DeadLetter.build(b"x", "t", 0, 0, ValueError("v"), stage="DESERIALIZE")
    with pytest.raises(ValueError, match="offset"):
        DeadLetter.build(b"x", "t", 0, -1, ValueError("v"))
    assert exception_fqcn(SchemaError("price", "r")) == "schemas.SchemaError"
