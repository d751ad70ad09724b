"""`aurelius publish`: replay history into the Kafka topics at a chosen speed-up, keeping event times.

Sources (one per run):

- `--from-dir DIR`: a replay's `--emit-observations` output (`OUT/observations/<market>/<policy>/seed<k>/`
  with `arrivals|completions|telemetry|fleet_events|prices.parquet`; `DIR` may be `OUT` if it holds one
  such folder), `DIR/<kind>.parquet` (schema field names), or exported topics as `DIR/<kind>.jsonl`
  (one wire record per line);
- otherwise the bundled hourly prices of `--markets` over the window of `--start/--year/--window-rule`
  and `--periods`.

Records go out in the order they became observable (prices at `published_at`, the rest at `event_at`),
paced so that `speedup` event-time seconds pass per wall second; each record's Kafka timestamp is its
event time and its key is its idempotency key, so a re-published record is a duplicate the worker ignores.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from schemas.kafka_client import KafkaClientSettings, client_kwargs, settings_from_args, start_client
from schemas.records import frame_to_wire
from schemas.timestamps import ts_from_wire
from schemas.topics import INPUT_KINDS, Topics, ensure_topics
from streams.datasets.prices import available_years, load_prices
from streams.ingest import record_key
from streams.pipeline import clock_time
from streams.workload.window import select_window

Item = tuple[datetime, int, str, dict[str, Any]]


#: `aurelius replay --emit-observations` file stems (Observations fields) -> record kind.
REPLAY_STEMS: dict[str, str] = {"arrivals": "request_arrival", "completions": "request_completion",
                                "telemetry": "gpu_telemetry", "fleet_events": "fleet_event", "prices": "price"}


def _frame_records(kind: str, df: pl.DataFrame) -> list[dict[str, Any]]:
    if kind == "price":  # a replay's price frames are the bundled series: observable at publication
        df = df.with_columns(
            *([] if "event_at" in df.columns else [pl.col("interval_start").alias("event_at")]),
            *([] if "arrived_at" in df.columns else [pl.col("published_at").alias("arrived_at")]),
        )
    keep = [c for c in df.columns if c != "schema_version"]
    return frame_to_wire(kind, df.select(keep), validate=False)


def _files(root: Path) -> dict[str, Path]:
    """kind -> file in `root`, by kind name (`<kind>.parquet|.jsonl`) or replay stem (`arrivals.parquet`)."""
    out: dict[str, Path] = {}
    for stem, kind in [*((k, k) for k in INPUT_KINDS), *REPLAY_STEMS.items()]:
        for ext in ("parquet", "jsonl"):
            if kind not in out and (root / f"{stem}.{ext}").exists():
                out[kind] = root / f"{stem}.{ext}"
    return out


def find_observations(directory: str | Path) -> dict[str, Path]:
    """The observation files under `directory`: in it, in `observations/`, or in the one folder below that
    holds them (a replay writes `OUT/observations/<market>/<policy>/seed<k>/`)."""
    root = Path(directory)
    if (root / "observations").is_dir():
        root = root / "observations"
    found = _files(root)
    if found:
        return found
    below = sorted({p.parent for p in root.rglob("*") if p.suffix in (".parquet", ".jsonl")})
    below = [d for d in below if _files(d)]
    if len(below) != 1:
        where = ", ".join(str(d) for d in below) or "none"
        raise FileNotFoundError(f"need exactly one observation folder under {root}; found: {where} "
                                f"(files <kind>.parquet|.jsonl, kinds: {', '.join(INPUT_KINDS)})")
    return _files(below[0])


def load_directory(directory: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Wire records per kind from the observation files under `directory` (see `find_observations`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, path in find_observations(directory).items():
        if path.suffix == ".parquet":
            out[kind] = _frame_records(kind, pl.read_parquet(path))
        else:
            out[kind] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def bundled_prices(markets: Iterable[str], year: int, rule: str, start: datetime | None,
                   periods: int | None, period_minutes: float) -> dict[str, list[dict[str, Any]]]:
    """Price records of the bundled series published up to the window's end, from a day before its start.

    Parameters
    ----------
    markets : market names (PJM, ERCOT, CAISO).
    year, rule, start : the window choice of `aurelius replay` (`streams.workload.window.select_window`).
    periods, period_minutes : window length as control periods (count) of `period_minutes` (min);
        None periods: 3 h.
    """

    rows: list[dict[str, Any]] = []
    for market in markets:
        y = start.year if start else year
        prices = load_prices(market, [v for v in (y - 1, y) if v in available_years(market)])
        window = select_window(prices, year, rule=rule, start=start)  # type: ignore[arg-type]
        end = window.start + (timedelta(minutes=periods * period_minutes) if periods else window.end - window.start)
        sel = prices.filter(
            (pl.col("published_at") <= end) & (pl.col("published_at") >= window.start - timedelta(days=1))
        ).with_columns(event_at=pl.col("interval_start"), arrived_at=pl.col("published_at"))
        rows.extend(_frame_records("price", sel))
    return {"price": rows}


def ordered(records: dict[str, list[dict[str, Any]]]) -> Iterator[Item]:
    """All records merged in observable-time order: (clock time, seq, kind, record)."""
    items: list[Item] = []
    seq = 0
    for kind, rows in records.items():
        for r in rows:
            items.append((clock_time(kind, r), seq, kind, r))
            seq += 1
    heapq.heapify(items)
    while items:
        yield heapq.heappop(items)


async def publish(records: dict[str, list[dict[str, Any]]], bootstrap_servers: str, topics: Topics,
                  speedup: float, kafka: KafkaClientSettings | None = None) -> int:
    """Produce every record to its kind's topic, paced at `speedup` (event s per wall s; <= 0: flat out).

    Returns the number of records produced (each acknowledged by the broker). `kafka`: security and start-up
    retry of the clients (schemas.kafka_client; None: env `KAFKA_*`); raises `KafkaUnavailable` when no
    broker answers within its `startup_timeout_s`.
    """
    from aiokafka import AIOKafkaProducer  # lazy: the Kafka client loads only where a command talks to a broker

    await ensure_topics(bootstrap_servers, topics.all(), kafka=kafka)
    producer = await start_client(
        lambda: AIOKafkaProducer(**client_kwargs(kafka, bootstrap_servers), enable_idempotence=False, acks="all",
                                 linger_ms=5, max_batch_size=256 * 1024),
        kafka, bootstrap_servers, "producer")
    n = 0
    try:
        wall0 = time.monotonic()
        first: datetime | None = None
        pending = []
        for at, _, kind, rec in ordered(records):
            first = first or at
            if speedup > 0:
                delay = (at - first).total_seconds() / speedup - (time.monotonic() - wall0)
                if delay > 0:
                    await asyncio.sleep(delay)
            ts_ms = int(ts_from_wire(rec["event_at"]).timestamp() * 1000)
            pending.append(await producer.send(
                topics.for_kind(kind).name, json.dumps(rec).encode(), key=record_key(kind, rec).encode(),
                timestamp_ms=ts_ms,
            ))
            n += 1
            if len(pending) >= 10_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return n


def run(args: argparse.Namespace) -> int:
    kafka = settings_from_args(args)  # invalid settings fail before any data is loaded
    topics = Topics(prefix=args.topic_prefix)
    if args.from_dir:
        records = load_directory(args.from_dir)
    else:
        start = datetime.fromisoformat(args.start.replace("Z", "+00:00")) if args.start else None
        records = bundled_prices(args.markets.split(","), args.year, args.window_rule, start, args.periods,
                                 args.period_minutes)
    n = asyncio.run(publish(records, args.bootstrap_servers, topics, args.speedup, kafka=kafka))
    kinds = ", ".join(f"{k}: {len(v)}" for k, v in records.items())
    print(f"published {n} records to {args.bootstrap_servers} ({kinds}) at speed-up {args.speedup}")
    return 0
