"""The protocol v1 workload builder: window, requests, history and prices for one market (docs/workload.md).

Protocol mode: arrivals are a seeded non-homogeneous Poisson process whose rate is the ServeGen m-large
shape aligned to the market's local clock, scaled so the 3-hour window expects ``target_requests``; each
request draws its class from the protocol shares; sizes walk each class's trace in time order, cycled,
from a seeded offset. Pure-trace mode (``source="azure"|"mooncake"``) replays one trace unchanged.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from schemas.policy import History
from schemas.protocol import PROTOCOL_V1, ClassSpec, Protocol, RequestClass
from streams.datasets.prices import available_years, load_prices
from streams.datasets.traces import load_azure, load_mooncake
from streams.workload.history import protocol_history, trace_history
from streams.workload.rate import RateProfile
from streams.workload.window import Rule, Window, select_window

#: The three regions of the three-site mode; every tenant may run anywhere by default.
REGIONS: tuple[str, ...] = ("us-east", "us-central", "us-west")
SOURCES = ("protocol", "azure", "mooncake")
#: Independent random streams per seed; history is seeded separately from the window.
STREAM = {"arrivals": 1, "classes": 2, "offsets": 3, "deadlines": 4, "history": 5, "residency": 6}
TRACE_DERIVED = "trace-derived"
MODELED = "modeled"

REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Utf8(),
    "arrival_s": pl.Float64(),
    "request_class": pl.Utf8(),
    "model": pl.Utf8(),
    "input_tokens": pl.Int32(),
    "output_tokens": pl.Int32(),
    "prefix_block_ids": pl.List(pl.Int64()),
    "deadline_s": pl.Float64(),
    "sla_ttft_ms": pl.Float64(),
    "sla_tpot_ms": pl.Float64(),
    "tenant": pl.Utf8(),
    "allowed_regions": pl.List(pl.Utf8()),
}


@dataclass(frozen=True)
class Workload:
    """One market's replay input.

    Parameters
    ----------
    window : the chosen window.
    requests : one row per request, sorted by arrival; columns `REQUEST_SCHEMA` (arrival_s and
        deadline_s in s after ``window.start``; output_tokens is ground truth, never shown at arrival).
    history : the 7 days before the window, as aggregates.
    prices : price records from the history start to 24 h past the window (or arrivals) end, plus the
        day-ahead hours published by then; with published_at, so consumers filter with
        `availability.visible`.
    seed : workload seed.
    source : "protocol", "azure" or "mooncake".
    provenance : request column -> "trace-derived" or "modeled".
    """

    window: Window
    requests: pl.DataFrame
    history: History
    prices: pl.DataFrame
    seed: int
    source: str
    provenance: dict[str, str]


def rng(seed: int, stream: str, market: str) -> np.random.Generator:
    """The generator of one named random stream of a market's workload seed.

    The market is part of the entropy, so markets built with the same seed draw independently.
    """
    return np.random.default_rng(np.random.SeedSequence([seed, STREAM[stream], zlib.crc32(market.encode())]))


def size_traces() -> dict[RequestClass, pl.DataFrame]:
    """Per-class size traces in time order: input_tokens, output_tokens, prefix_block_ids."""
    empty = pl.lit([], dtype=pl.List(pl.Int64)).alias("prefix_block_ids")
    return {
        RequestClass.CODE: load_azure("code").select("input_tokens", "output_tokens", empty),
        RequestClass.CHAT: load_azure("conv").select("input_tokens", "output_tokens", empty),
        RequestClass.BATCH: load_mooncake().select("input_tokens", "output_tokens", "prefix_block_ids"),
    }


def _price_years(market: str, year: int, start: datetime | None) -> list[int]:
    base = year if start is None else start.year
    return [y for y in (base - 1, base, base + 1) if y in available_years(market)]


def _span_s(protocol: Protocol, periods: int | None, period_minutes: float) -> float:
    if period_minutes <= 0:
        raise ValueError(f"period_minutes must be positive, got {period_minutes}")
    if periods is None:
        return protocol.window_hours * 3600.0
    if periods <= 0:
        raise ValueError(f"periods must be positive, got {periods}")
    return periods * period_minutes * 60.0


def _class_columns(spec: ClassSpec) -> list[pl.Expr]:
    """Constant columns of a class: request_class, model and its SLA (null for deferrable work)."""
    return [
        pl.lit(spec.name.value).alias("request_class"),
        pl.lit(spec.model.value).alias("model"),
        pl.lit(spec.ttft_slo_ms, dtype=pl.Float64).alias("sla_ttft_ms"),
        pl.lit(spec.tpot_slo_ms, dtype=pl.Float64).alias("sla_tpot_ms"),
    ]


def _protocol_requests(
    profile: RateProfile,
    span_s: float,
    seed: int,
    protocol: Protocol,
    traces: dict[RequestClass, pl.DataFrame],
) -> tuple[pl.DataFrame, dict[RequestClass, int]]:
    """Arrivals, classes, sizes and deadlines; returns the frame and each class's trace offset."""
    arrival = profile.sample(span_s, rng(seed, "arrivals", profile.market))
    specs = protocol.classes
    shares = [c.share for c in specs]
    cls = rng(seed, "classes", profile.market).choice(len(specs), size=arrival.size, p=shares)
    offsets_gen = rng(seed, "offsets", profile.market)
    offsets = {c.name: int(offsets_gen.integers(traces[c.name].height)) for c in specs}
    deferrable = np.array([c.deferrable for c in specs])[cls]
    lo = np.array([c.deadline_min_s or 0.0 for c in specs])[cls[deferrable]]
    hi = np.array([c.deadline_max_s or 0.0 for c in specs])[cls[deferrable]]
    deadline = np.full(arrival.size, np.nan)
    deadline[deferrable] = arrival[deferrable] + rng(seed, "deadlines", profile.market).uniform(lo, hi)
    parts = []
    for i, c in enumerate(specs):
        pos = np.flatnonzero(cls == i)  # the class's requests in arrival order walk its trace from the offset
        rows = (offsets[c.name] + np.arange(pos.size)) % traces[c.name].height
        parts.append(traces[c.name][rows].with_columns(pl.Series("_pos", pos), *_class_columns(c)))
    df = pl.concat(parts).sort("_pos").with_columns(
        pl.Series("arrival_s", arrival), pl.Series("deadline_s", deadline).fill_nan(None)
    )
    return df, offsets


def _trace_requests(source: str, protocol: Protocol) -> pl.DataFrame:
    """One trace unchanged: azure = code (8B) + conv (70B) merged by time; mooncake = chat on 70B."""
    chat = protocol.spec(RequestClass.CHAT)
    if source == "mooncake":
        return load_mooncake().with_columns(
            (pl.col("arrival_ms") / 1000.0).alias("arrival_s"), *_class_columns(chat)
        )
    no_blocks = pl.lit([], dtype=pl.List(pl.Int64)).alias("prefix_block_ids")
    parts = [
        load_azure(kind).with_row_index("_row").with_columns(*_class_columns(spec), no_blocks)
        for kind, spec in (("code", protocol.spec(RequestClass.CODE)), ("conv", chat))
    ]
    df = pl.concat(parts).sort("arrived_at", "request_class", "_row")  # "chat" < "code": chat first on ties
    since = (pl.col("arrived_at") - pl.lit(df["arrived_at"].min())).dt.total_microseconds()
    return df.with_columns((since / 1e6).alias("arrival_s"))


def _finish(df: pl.DataFrame, market: str, seed: int) -> pl.DataFrame:
    """Add ids, tenant, regions, missing columns; order and type columns as `REQUEST_SCHEMA`."""
    if "deadline_s" not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.Float64).alias("deadline_s"))
    df = df.sort("arrival_s", maintain_order=True).with_columns(
        (pl.lit(f"{market}-s{seed}-") + pl.int_range(pl.len()).cast(pl.Utf8).str.zfill(7))
        .alias("request_id"),
        (pl.lit("tenant-") + pl.col("request_class")).alias("tenant"),
        pl.lit(list(REGIONS), dtype=pl.List(pl.Utf8)).alias("allowed_regions"),
    )
    return df.select(list(REQUEST_SCHEMA)).cast(REQUEST_SCHEMA)


def build_workload(
    market: str,
    year: int = 2023,
    *,
    rule: Rule = "max",
    start: datetime | None = None,
    periods: int | None = None,
    period_minutes: float = 5.0,
    seed: int = 0,
    source: str = "protocol",
    protocol: Protocol = PROTOCOL_V1,
) -> Workload:
    """Build one market's workload, deterministically from its arguments.

    Parameters
    ----------
    market : "PJM", "ERCOT" or "CAISO".
    year : market-local year the window is chosen in.
    rule : window rule, "max" or "median" (see `select_window`).
    start : explicit window start (UTC, on the hour); overrides ``rule``.
    periods : control periods to generate arrivals for (default: the whole 3-h window).
    period_minutes : control period length (min).
    seed : workload seed; each random draw has its own stream (`STREAM`).
    source : "protocol" (mixed v1 workload), or "azure" / "mooncake" to replay that trace unchanged.
    protocol : classes, shares, SLAs and volume.

    Returns
    -------
    Workload
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; known: {SOURCES}")
    span_s = _span_s(protocol, periods, period_minutes)
    prices = load_prices(market, _price_years(market, year, start))
    window = select_window(prices, year, rule, start, protocol.window_hours)
    history_start = window.start - timedelta(days=protocol.history_days)
    horizon_end = max(window.end, window.start + timedelta(seconds=span_s)) + timedelta(hours=24)
    if source == "protocol":
        window_s = protocol.window_hours * 3600.0
        profile = RateProfile.scaled(market, window.start, protocol.target_requests, window_s)
        traces = size_traces()
        df, offsets = _protocol_requests(profile, span_s, seed, protocol, traces)
        history = protocol_history(profile, traces, offsets, rng(seed, "history", market), prices, protocol)
        derived = ("arrival_s", "input_tokens", "output_tokens", "prefix_block_ids")
    else:
        df = _trace_requests(source, protocol)
        history = trace_history(df, window.start, prices, protocol)  # the whole trace, repeated backward
        if periods is not None:
            df = df.filter(pl.col("arrival_s") < span_s)
        derived = ("arrival_s", "request_class", "model", "input_tokens", "output_tokens", "prefix_block_ids")
    requests = _finish(df, market, seed)
    provenance = {c: TRACE_DERIVED if c in derived else MODELED for c in REQUEST_SCHEMA if c != "request_id"}
    # every hour up to the horizon, plus day-ahead hours past it that are already published by then
    window_prices = prices.filter(
        (pl.col("interval_start") >= history_start)
        & ((pl.col("interval_start") < horizon_end) | (pl.col("published_at") <= horizon_end))
    )
    return Workload(window, requests, history, window_prices, seed, source, provenance)
