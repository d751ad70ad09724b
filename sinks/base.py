"""The sink contract (after quixstreams' BaseSink): `add` buffers, `flush` makes durable.

A consumer calls `flush()` before it commits offsets, so a failed flush aborts the commit and the
records are delivered again (at-least-once). A sink that cannot keep up raises
`SinkBackpressureError` from `add`; the consumer pauses `retry_after_s` and flushes, it never drops.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any


class SinkBackpressureError(Exception):
    """The sink's buffer is full: flush, wait `retry_after_s` (s), then add the record again."""

    def __init__(self, retry_after_s: float, pending: int) -> None:
        super().__init__(f"sink buffer full ({pending} records pending); retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s
        self.pending = pending


class AuditSink(ABC):
    """Where audit records go. Idempotent on `decision_id`: adding a known id again is a no-op."""

    @abstractmethod
    def add(self, record: Mapping[str, Any], offset: int | None = None) -> bool:
        """Buffer one audit record (`offset`: its Kafka offset, if any); False if its id is known."""

    @abstractmethod
    def flush(self) -> int:
        """Make everything buffered durable; return the number of records written."""
