"""The Parquet audit log of DESIGN.md: a directory of immutable Parquet files keyed by decision id.

Each flush writes one file `audit-<UTC time>-<uuid>.parquet` under a temporary dot-name and renames it
into place (`os.replace` is atomic on one file system), so a reader globbing `audit-*.parquet` never
sees a partial file. The store is idempotent on `decision_id`: it loads the ids already on disk when it
opens and skips re-delivered ones; the SQL view (sinks/sql.py) dedupes by decision_id as a second guard.
Scalar fields get typed columns; nested fields (plans, gates, forecasts, ...) are JSON text columns,
queryable with DuckDB's `json_extract`; `record` keeps the whole record as JSON.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.base import AuditSink, SinkBackpressureError

FILE_GLOB = "audit-*.parquet"

_TS = pa.timestamp("us", tz="UTC")
#: Typed columns taken from the audit record (schemas/README.md, audit_record).
SCALAR_COLUMNS: dict[str, pa.DataType] = {
    "decision_id": pa.string(),
    "policy": pa.string(),
    "market": pa.string(),
    "period_index": pa.int64(),
    "period_start": _TS,
    "as_of": _TS,
    "candidates_evaluated": pa.int64(),
    "fallback": pa.bool_(),
    "fallback_reason": pa.string(),
    "regret": pa.float64(),
    "late_records": pa.int64(),
}
#: Nested fields kept as JSON text.
JSON_COLUMNS = (
    "inputs", "forecasts", "top_candidates", "gates", "chosen_plan", "reference_plan", "predicted_delta",
    "realized",
)
SCHEMA = pa.schema(
    [pa.field(k, t) for k, t in SCALAR_COLUMNS.items()]
    + [pa.field(k, pa.string()) for k in JSON_COLUMNS]
    + [pa.field("record", pa.string()), pa.field("kafka_offset", pa.int64()), pa.field("written_at", _TS)]
)


def _ts(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def to_row(record: Mapping[str, Any], offset: int | None, written_at: datetime) -> dict[str, Any]:
    """One audit record as a row of `SCHEMA` (`offset`: Kafka offset or None; `written_at`: UTC)."""
    row: dict[str, Any] = {k: record.get(k) for k in SCALAR_COLUMNS}
    if row["market"] is None and record.get("markets"):
        row["market"] = ",".join(record["markets"])
    row["period_start"] = _ts(row["period_start"])
    row["as_of"] = _ts(row["as_of"])
    row.update({k: _json(record.get(k)) for k in JSON_COLUMNS})
    row.update(record=_json(dict(record)), kafka_offset=offset, written_at=written_at)
    return row


def existing_ids(directory: Path) -> set[str]:
    """Decision ids already in the Parquet files of `directory`."""
    ids: set[str] = set()
    for path in sorted(directory.glob(FILE_GLOB)):
        ids.update(pq.read_table(path, columns=["decision_id"]).column("decision_id").to_pylist())
    return ids


class ParquetAuditStore(AuditSink):
    """The audit log directory as a sink.

    Parameters
    ----------
    directory : the audit log directory (created if missing).
    max_pending : records buffered before `add` raises `SinkBackpressureError` (count).
    retry_after_s : the wait the backpressure error suggests (s).
    """

    def __init__(self, directory: str | os.PathLike[str], max_pending: int = 10_000,
                 retry_after_s: float = 0.5) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_pending = max_pending
        self.retry_after_s = retry_after_s
        self._ids = existing_ids(self.directory)
        self._pending: list[tuple[Mapping[str, Any], int | None]] = []

    def __contains__(self, decision_id: str) -> bool:
        return decision_id in self._ids

    def add(self, record: Mapping[str, Any], offset: int | None = None) -> bool:
        decision_id = str(record["decision_id"])
        if decision_id in self._ids or any(r["decision_id"] == decision_id for r, _ in self._pending):
            return False
        if len(self._pending) >= self.max_pending:
            raise SinkBackpressureError(self.retry_after_s, len(self._pending))
        self._pending.append((record, offset))
        return True

    def flush(self) -> int:
        if not self._pending:
            return 0
        now = datetime.now(UTC)
        table = pa.Table.from_pylist([to_row(r, o, now) for r, o in self._pending], schema=SCHEMA)
        name = f"audit-{now:%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.directory / f".{name}.tmp"
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.directory / name)
        self._ids.update(str(r["decision_id"]) for r, _ in self._pending)
        n = len(self._pending)
        self._pending.clear()
        return n
