"""Dead letters: a record that failed, kept byte-exact with where it came from, why, and Kafka DLQ headers.

The headers carry both conventions operators already tool for (CONVENTIONS.md section 5):

- Spring Kafka ``DeadLetterPublishingRecoverer``: ``kafka_dlt-original-topic`` (UTF-8),
  ``kafka_dlt-original-partition`` (4-byte big-endian int), ``kafka_dlt-original-offset`` (8-byte big-endian
  long), ``kafka_dlt-exception-fqcn`` and ``kafka_dlt-exception-message`` (UTF-8);
- Kafka Connect ``DeadLetterQueueReporter``: ``__connect.errors.topic``, ``.partition``, ``.offset`` (decimal
  UTF-8 strings), ``.exception.class.name``, ``.exception.message``, ``.stage``.

Publish either ``value()`` (the dead_letter JSON record, original base64 inside) or, Connect style,
``original`` itself as the value; the headers are the same.

Size: a dead letter must fit the producer's request limit (1 MB by default) or its send fails and the
worker stops. The reason is cut to ``MAX_REASON_CHARS``; with ``max_bytes`` set, a dead letter whose value
and headers would exceed it keeps only the first bytes of the original that fit, plus the original's length
and SHA-256 (`DeadLetterRecord.original_length`, `.original_sha256`; absent when the original is whole).
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from schemas import SchemaError
from schemas.records import DeadLetterRecord

#: Default bound on a dead letter's value plus headers (bytes): half the Kafka producer's 1 MB request limit.
DEFAULT_MAX_BYTES = 524_288
#: Kafka Connect error-reporting stages (org.apache.kafka.connect.runtime.errors.Stage).
STAGES = frozenset(
    {
        "KEY_CONVERTER",
        "VALUE_CONVERTER",
        "HEADER_CONVERTER",
        "TRANSFORMATION",
        "TASK_PUT",
        "TASK_POLL",
        "KAFKA_PRODUCE",
        "KAFKA_CONSUME",
    }
)


#: Longest reason kept (characters); it goes into the value and twice into the headers.
MAX_REASON_CHARS = 1000


def _size(value: bytes, headers: list[tuple[str, bytes]]) -> int:
    return len(value) + sum(len(k) + len(v) for k, v in headers)


def exception_fqcn(exc: BaseException) -> str:
    """Fully qualified class name of ``exc``, e.g. ``schemas.SchemaError`` (builtins unqualified)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter ready to publish.

    Attributes
    ----------
    record : the dead_letter wire record (original value base64-encoded; a prefix of it when
        ``record.truncated``).
    original : the original record value, byte-exact and whole (None for a tombstone).
    headers : Kafka headers, Spring and Connect conventions, in that order.
    """

    record: DeadLetterRecord
    original: bytes | None
    headers: list[tuple[str, bytes]]

    @classmethod
    def build(
        cls,
        raw: bytes | None,
        source_topic: str,
        source_partition: int,
        source_offset: int,
        exception: BaseException,
        reason: str | None = None,
        *,
        failed_at: datetime | None = None,
        stage: str = "VALUE_CONVERTER",
        max_bytes: int | None = DEFAULT_MAX_BYTES,
    ) -> DeadLetter:
        """Build the dead letter of one consumed record.

        Parameters
        ----------
        raw : the consumed value, unchanged (bytes; None for a tombstone).
        source_topic, source_partition, source_offset : where it was consumed.
        exception : what failed; a SchemaError's ``reason`` is used when ``reason`` is None.
        reason : human-readable reason naming the field; defaults to the exception's.
        failed_at : when it failed (tz-aware); defaults to now (UTC).
        stage : Kafka Connect stage that failed (``STAGES``); validation is ``VALUE_CONVERTER``.
        max_bytes : bound on ``len(value())`` plus the headers' names and values (bytes); over it, the
            record keeps the first bytes of the original that fit, with its length and SHA-256. None: no bound.
        """
        if stage not in STAGES:
            raise ValueError(f"unknown Connect stage {stage!r}; one of {sorted(STAGES)}")
        if source_partition < 0 or source_offset < 0:
            raise ValueError(f"partition and offset must be >= 0, got {source_partition}, {source_offset}")
        if reason is None:
            reason = exception.reason if isinstance(exception, SchemaError) else str(exception)
        reason = reason or exception_fqcn(exception)
        if len(reason) > MAX_REASON_CHARS:
            reason = f"{reason[:MAX_REASON_CHARS]}... ({len(reason)} chars)"
        fqcn = exception_fqcn(exception)
        record = DeadLetterRecord(
            reason=reason,
            original_value_b64=base64.b64encode(raw or b"").decode("ascii"),
            source_topic=source_topic,
            source_partition=source_partition,
            source_offset=source_offset,
            failed_at=failed_at or datetime.now(UTC),
            error_class=fqcn,
        )
        topic, message, fqcn_b = source_topic.encode(), reason.encode(), fqcn.encode()
        headers = [
            ("kafka_dlt-original-topic", topic),
            ("kafka_dlt-original-partition", struct.pack(">i", source_partition)),
            ("kafka_dlt-original-offset", struct.pack(">q", source_offset)),
            ("kafka_dlt-exception-fqcn", fqcn_b),
            ("kafka_dlt-exception-message", message),
            ("__connect.errors.topic", topic),
            ("__connect.errors.partition", str(source_partition).encode()),
            ("__connect.errors.offset", str(source_offset).encode()),
            ("__connect.errors.exception.class.name", fqcn_b),
            ("__connect.errors.exception.message", message),
            ("__connect.errors.stage", stage.encode()),
        ]
        dl = cls(record=record, original=raw, headers=headers)
        if max_bytes is not None and raw and _size(dl.value(), headers) > max_bytes:
            dl = dl._truncated(max_bytes)
        return dl

    def _truncated(self, max_bytes: int) -> DeadLetter:
        """This dead letter with the original cut to the longest prefix that keeps it within `max_bytes`."""
        raw = self.original or b""
        rec = replace(self.record, original_value_b64="", original_length=len(raw),
                      original_sha256=hashlib.sha256(raw).hexdigest())
        room = max_bytes - _size(DeadLetter(rec, raw, self.headers).value(), self.headers)
        keep = max(0, room // 4 * 3)  # base64: 4 characters per 3 bytes
        rec = replace(rec, original_value_b64=base64.b64encode(raw[:keep]).decode("ascii"))
        return DeadLetter(rec, raw, self.headers)

    def value(self) -> bytes:
        """The dead_letter record as compact UTF-8 JSON (the value to publish on the dead-letter topic)."""
        return json.dumps(self.record.to_wire(), separators=(",", ":"), ensure_ascii=False).encode()


def original_bytes(record: DeadLetterRecord) -> bytes:
    """Recover the original value, byte-exact, from a dead_letter record (its first bytes if truncated)."""
    return base64.b64decode(record.original_value_b64, validate=True)
