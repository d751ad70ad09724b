"""Read an operator's recorded history into one polars frame per record kind (`frame_schema` columns).

Sources:

- a directory dump: `<kind>.parquet|.jsonl` per record kind, or the layout `aurelius replay
  --emit-observations` writes (`arrivals|completions|telemetry|fleet_events|prices.parquet`, also found
  one folder down, see `streams.publish.find_observations`); foreign producers as `<source>.jsonl`, one
  foreign record per line, where `<source>` names a field-map source (`dcgm`, `vllm`, `otel_genai`,
  `gridstatus_pjm`, ...: streams/fieldmaps/default.toml), mapped onto the wire schemas;
- Kafka topics (`read_topics`): every partition from the earliest offset, nothing committed (no group).

Nothing is decided while reading: the frames go to `streams.history.checks` as read. Records a source
cannot map are dropped with a report entry (count and first reason).
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl

from schemas import SchemaError
from schemas.kafka_client import KafkaClientSettings, client_kwargs, close_client, start_client
from schemas.records import frame_schema
from schemas.topics import INPUT_KINDS, Topics
from streams.fieldmap import FieldMap, fold_telemetry
from streams.history.report import HistoryReport
from streams.publish import find_observations

KINDS: tuple[str, ...] = tuple(INPUT_KINDS)
#: Bytes fetched per partition per request when reading topics (fewer round trips than aiokafka's 1 MiB).
FETCH_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class RawHistory:
    """The records as read: kind -> frame with the kind's `frame_schema` columns (empty when absent)."""

    frames: dict[str, pl.DataFrame]
    read_s: float

    @property
    def records(self) -> int:
        """Records read over every kind (count)."""
        return sum(f.height for f in self.frames.values())


def empty(kind: str) -> pl.DataFrame:
    """An empty frame of `kind`."""
    return pl.DataFrame(schema=frame_schema(kind))


def conform(kind: str, df: pl.DataFrame) -> pl.DataFrame:
    """`df` with exactly `frame_schema(kind)` columns: timestamps parsed from RFC 3339 strings where needed,
    absent optional columns null, others cast. A price frame of a replay (no event_at, arrived_at) takes
    interval_start and published_at, as `aurelius publish` does."""
    if kind == "price":
        if "event_at" not in df.columns and "interval_start" in df.columns:
            df = df.with_columns(pl.col("interval_start").alias("event_at"))
        if "arrived_at" not in df.columns and "published_at" in df.columns:
            df = df.with_columns(pl.col("published_at").alias("arrived_at"))
    exprs = []
    for name, dtype in frame_schema(kind).items():
        if name not in df.columns:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
        elif isinstance(dtype, pl.Datetime) and df.schema[name] == pl.String:
            exprs.append(pl.col(name).str.to_datetime(time_unit="us", time_zone="UTC").alias(name))
        elif isinstance(dtype, pl.Datetime):
            exprs.append(pl.col(name).dt.convert_time_zone("UTC").dt.cast_time_unit("us").alias(name))
        else:
            exprs.append(pl.col(name).cast(dtype).alias(name))
    return df.select(exprs)


def _read_file(kind: str, path: Path) -> pl.DataFrame:
    if path.suffix == ".parquet":
        return conform(kind, pl.read_parquet(path))
    return conform(kind, pl.read_ndjson(path, infer_schema_length=None))


def _foreign(directory: Path, fieldmap: FieldMap, report: HistoryReport) -> dict[str, list[dict[str, Any]]]:
    """Wire records per kind from `<source>.jsonl` files of foreign producers (field-mapped)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(fieldmap.sources):
        path = directory / f"{name}.jsonl"
        if not path.exists():
            continue
        ok: list[dict[str, Any]] = []
        bad, first = 0, ""
        kind = fieldmap.sources[name].kind
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                _, rec = fieldmap.apply(name, raw)
                rec["arrived_at"] = rec["event_at"]  # a dump has no bus arrival time: the event time stands in
                ok.append(rec)
            except (json.JSONDecodeError, SchemaError) as exc:
                bad += 1
                first = first or str(exc)
        if kind == "gpu_telemetry":
            ok = fold_telemetry(ok)
        out.setdefault(kind, []).extend(ok)
        report.sources[f"{kind}<-{name}"] = {"path": str(path), "records": len(ok)}
        report.add(
            "field_map",
            "assumed",
            kind,
            len(ok),
            f"{path.name} mapped through field-map source {name!r}; arrived_at taken as event_at",
        )
        if bad:
            report.add(
                "field_map", "dropped", kind, bad, f"{path.name}: records the field map cannot map (first: {first})"
            )
    return out


def read_directory(directory: str | Path, report: HistoryReport, fieldmap: FieldMap | None = None) -> RawHistory:
    """Read a directory dump (see the module docstring) into frames per kind; sources go into `report`."""
    t0 = time.perf_counter()
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"no history directory {root}")
    fm = fieldmap or FieldMap.load()
    foreign = _foreign(root, fm, report)
    try:
        files = find_observations(root)
    except FileNotFoundError:
        if not foreign:
            raise
        files = {}
    frames: dict[str, pl.DataFrame] = {}
    for kind in KINDS:
        parts = []
        if kind in files:
            parts.append(_read_file(kind, files[kind]))
            report.sources[kind] = {"path": str(files[kind]), "records": parts[-1].height}
        if foreign.get(kind):
            rows = pl.DataFrame(foreign[kind], infer_schema_length=None)
            parts.append(conform(kind, rows))
        frames[kind] = pl.concat(parts, how="vertical_relaxed") if parts else empty(kind)
        if not parts:
            report.add("missing_kind", "assumed", kind, 0, "no records of this kind in the directory")
    return RawHistory(frames, time.perf_counter() - t0)


def read_topics(
    bootstrap: str,
    start: datetime,
    end: datetime,
    report: HistoryReport,
    topics: Topics | None = None,
    settings: KafkaClientSettings | None = None,
) -> RawHistory:
    """Read the input topics' records whose Kafka timestamp (the event time `aurelius publish` and the
    producers set) lies in [start, end) (prices: from start on, for the drain), from each partition's
    earliest offset up to its end offset at the start of the read; no consumer group, nothing committed.

    Parameters
    ----------
    bootstrap : "host:port[,host:port]".
    start, end : UTC range (tz-aware); pass start - 7 days to get the history aggregates too.
    report : receives each topic's name and record count.
    topics : the deployment's topic names (default prefix "aurelius.").
    settings : Kafka security settings (None: from env `KAFKA_*`).
    """
    t0 = time.perf_counter()
    values = asyncio.run(_consume(bootstrap, start, end, topics or Topics(), settings))
    frames = {}
    for kind in KINDS:
        name = (topics or Topics()).for_kind(kind).name
        report.sources[kind] = {"topic": name, "records": len(values[kind])}
        frames[kind] = _decode(kind, values[kind]) if values[kind] else empty(kind)
    return RawHistory(frames, time.perf_counter() - t0)


def _decode(kind: str, values: list[bytes]) -> pl.DataFrame:
    """Frame of `kind` from JSON record values: parsed as one NDJSON document (values on one line each, as
    `aurelius publish` and JSON encoders write them), else record by record."""
    try:
        df = pl.read_ndjson(io.BytesIO(b"\n".join(values)), infer_schema_length=None)
    except pl.exceptions.ComputeError:  # a value spread over several lines
        df = pl.DataFrame([json.loads(v) for v in values], infer_schema_length=None)
    return conform(kind, df)


async def _consume(
    bootstrap: str, start: datetime, end: datetime, topics: Topics, settings: KafkaClientSettings | None
) -> dict[str, list[bytes]]:
    from aiokafka import AIOKafkaConsumer  # lazy: the Kafka client loads only when topics are read
    from aiokafka.structs import TopicPartition

    lo, hi = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    by_topic = {topics.for_kind(k).name: k for k in KINDS}
    consumer = await start_client(
        lambda: AIOKafkaConsumer(
            **client_kwargs(settings, bootstrap),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=FETCH_BYTES,
            fetch_max_bytes=4 * FETCH_BYTES,
        ),
        settings,
        bootstrap,
        "history reader",
    )
    out: dict[str, list[bytes]] = {k: [] for k in KINDS}
    try:
        await consumer.topics()  # the cluster's metadata: partitions_for_topic reads it
        tps = [TopicPartition(t, p) for t in by_topic for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        left = {tp for tp in tps if ends[tp] > 0}
        while left:
            batch = await consumer.getmany(*left, timeout_ms=1000, max_records=50_000)
            for tp, msgs in batch.items():
                kind = by_topic[tp.topic]
                for m in msgs:
                    if lo <= m.timestamp and (m.timestamp < hi or kind == "price"):  # prices: the drain's too
                        out[kind].append(m.value)
                if msgs and msgs[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
    finally:
        await close_client(consumer)
    return out
