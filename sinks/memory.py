"""An in-memory, list-like audit sink for tests and debugging."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from sinks.base import AuditSink


class MemorySink(AuditSink):
    """Keeps flushed audit records in a list, idempotent on decision_id like the Parquet store.

    Examples
    --------
    >>> s = MemorySink()
    >>> s.add({"decision_id": "d1"}), s.add({"decision_id": "d1"})
    (True, False)
    >>> len(s), s.flush(), len(s)
    (0, 1, 1)
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.offsets: list[int | None] = []
        self._pending: list[tuple[dict[str, Any], int | None]] = []
        self._ids: set[str] = set()

    def add(self, record: Mapping[str, Any], offset: int | None = None) -> bool:
        decision_id = str(record["decision_id"])
        if decision_id in self._ids:
            return False
        self._ids.add(decision_id)
        self._pending.append((dict(record), offset))
        return True

    def flush(self) -> int:
        n = len(self._pending)
        for record, offset in self._pending:
            self.records.append(record)
            self.offsets.append(offset)
        self._pending.clear()
        return n

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]
