"""The replay's `Workload` from an operator's records.

- requests: one per recorded arrival in the replay range, arrival_s = its event time after the range
  start, prompt and prefix blocks from the arrival record, output_tokens from its completion record (the
  simulator's ground truth for the request; no policy sees it before the completion, as in the bundled
  replay); an arrival without a completion gets its class's median recorded output (reported).
- classes and SLAs: the config's, else the records', else protocol v1's (reported per class); deferrable
  deadlines from deadline_at, else arrival + the config's deadline_s, else protocol v1's mid-range.
- prices: the price records of the market, hours they miss filled from the bundled series (reported).
- history: aggregates of the records in the 7 days before the range (per-minute arrivals per class,
  per-period size quantiles, prices), or empty frames with a report entry when the records hold none.
- seeds: seed 0 is the records exactly. Seed s > 0 varies what a recording cannot pin down: each arrival
  moves uniformly within its second (`floor(arrival_s) + U[0, 1)`), and output sizes are shuffled among the
  requests of the same class arriving in the same control period (that period's size distribution kept).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl

from schemas.policy import History
from schemas.protocol import PROTOCOL_V1, RequestClass
from streams.datasets.prices import available_years, load_prices
from streams.history.checks import Records
from streams.history.config import HistoryConfig
from streams.history.report import HistoryReport
from streams.workload.builder import REGIONS, REQUEST_SCHEMA, Workload, rng
from streams.workload.history import QUANTILES, history_prices
from streams.workload.window import Window

PRICE_COLUMNS = ("market", "location", "market_run", "interval_start", "interval_end", "lmp_usd_mwh", "published_at")
_UTC = pl.Datetime("us", "UTC")
MEASURED = "measured"
SOURCE = "history"


def floor_to(t: datetime, period_s: float) -> datetime:
    """`t` floored to a multiple of `period_s` since the epoch (UTC)."""
    s = t.timestamp()
    return datetime.fromtimestamp(s - s % period_s, t.tzinfo)


def replay_range(
    records: Records, period_s: float, start: datetime | None = None, end: datetime | None = None
) -> tuple[datetime, datetime]:
    """[start, end) of the replay: given, or from the first arrival (floored to the period) to the last record
    of the serving kinds (ceiled to a whole number of periods)."""
    if records.arrivals.height == 0:
        raise ValueError("the history holds no request arrivals to replay")
    lo = start or floor_to(records.arrivals["event_at"].min(), period_s)  # type: ignore[arg-type]
    if end is None:
        end = max(
            f["event_at"].max()
            for f in (records.arrivals, records.completions, records.telemetry, records.fleet_events)
            if f.height
        )  # type: ignore[type-var]
    n = max(1, int(np.ceil((end - lo).total_seconds() / period_s - 1e-9)))
    return lo, lo + timedelta(seconds=n * period_s)


def _seconds(col: str, start: datetime) -> pl.Expr:
    return (pl.col(col) - pl.lit(start).cast(_UTC)).dt.total_microseconds() / 1e6


def _sla(df: pl.DataFrame, config: HistoryConfig, report: HistoryReport) -> pl.DataFrame:
    """Per class: the config's SLA, else the records', else protocol v1's (reported)."""
    for spec in PROTOCOL_V1.classes:
        c = spec.name
        m = pl.col("request_class") == c.value
        n = df.filter(m).height
        if n == 0:
            continue
        cfg = config.classes.get(c)
        for col, given, default in (
            ("sla_ttft_ms", cfg and cfg.ttft_ms, spec.ttft_slo_ms),
            ("sla_tpot_ms", cfg and cfg.tpot_ms, spec.tpot_slo_ms),
        ):
            if spec.deferrable:
                df = df.with_columns(pl.when(m).then(None).otherwise(pl.col(col)).alias(col))
            elif given is not None:
                df = df.with_columns(pl.when(m).then(float(given)).otherwise(pl.col(col)).alias(col))
                report.add("sla", "assumed", "request_arrival", n, f"class {c}: {col} = {given} from the config")
            else:
                missing = df.filter(m & pl.col(col).is_null()).height
                df = df.with_columns(pl.when(m & pl.col(col).is_null()).then(default).otherwise(pl.col(col)).alias(col))
                report.add(
                    "sla",
                    "assumed" if missing else "checked",
                    "request_arrival",
                    missing,
                    f"class {c}: {col} from the records; {missing} without one take protocol v1's {default}",
                )
    return df


def _deadlines(df: pl.DataFrame, start: datetime, config: HistoryConfig, report: HistoryReport) -> pl.DataFrame:
    deadline = pl.lit(None, dtype=pl.Float64)
    for spec in PROTOCOL_V1.classes:
        if not spec.deferrable:
            continue
        c = spec.name
        cfg = config.classes.get(c)
        rule = cfg.deadline_s if cfg and cfg.deadline_s is not None else (spec.deadline_min_s + spec.deadline_max_s) / 2  # type: ignore[operator]
        m = pl.col("request_class") == c.value
        missing = df.filter(m & pl.col("deadline_at").is_null()).height
        if missing:
            src = "the config's deadline_s" if cfg and cfg.deadline_s is not None else "protocol v1's mid-range"
            report.add(
                "deadline",
                "assumed",
                "request_arrival",
                missing,
                f"class {c}: no deadline_at in the record; arrival + {rule:.0f} s ({src})",
            )
        deadline = (
            pl.when(m).then(pl.coalesce(_seconds("deadline_at", start), pl.col("arrival_s") + rule)).otherwise(deadline)
        )
    return df.with_columns(deadline.alias("deadline_s"))


def _outputs(arr: pl.DataFrame, comp: pl.DataFrame, report: HistoryReport) -> pl.DataFrame:
    df = arr.join(comp.select("request_id", "output_tokens"), on="request_id", how="left")
    missing = df.filter(pl.col("output_tokens").is_null())
    if missing.height:
        med = (
            comp.join(arr.select("request_id", "request_class"), on="request_id")
            .group_by("request_class")
            .agg(pl.col("output_tokens").median().round().cast(pl.Int64).alias("_med"))
        )
        overall = int(comp["output_tokens"].median() or 1) if comp.height else 1  # type: ignore[arg-type]
        df = (
            df.join(med, on="request_class", how="left")
            .with_columns(pl.coalesce("output_tokens", "_med", pl.lit(overall)).alias("output_tokens"))
            .drop("_med")
        )
        report.add(
            "arrival_without_completion",
            "assumed",
            "request_arrival",
            missing.height,
            "no completion recorded (unfinished when the recording ended, or lost): output size = the class's "
            "median recorded output; counted as a violation on the recorded side",
        )
    else:
        report.add("arrival_without_completion", "checked", "request_arrival", 0, "every arrival has a completion")
    return df


def _noise(df: pl.DataFrame, seed: int, market: str, period_s: float) -> pl.DataFrame:
    """Seed s > 0: arrivals jittered within their second, outputs shuffled within (class, period)."""
    if seed == 0:
        return df
    t = df["arrival_s"].to_numpy()
    t = np.floor(t) + rng(seed, "arrivals", market).uniform(0.0, 1.0, t.size)
    out = df["output_tokens"].to_numpy().copy()
    key = df["request_class"].to_numpy().astype(str).astype(object) + (t // period_s).astype(np.int64).astype(str)
    gen = rng(seed, "offsets", market)
    for k in np.unique(key):
        idx = np.flatnonzero(key == k)
        out[idx] = out[gen.permutation(idx)]
    return df.with_columns(pl.Series("arrival_s", t), pl.Series("output_tokens", out)).sort(
        "arrival_s", maintain_order=True
    )


def prices_for(records: Records, market: str, lo: datetime, hi: datetime, report: HistoryReport) -> pl.DataFrame:
    """Hourly prices of `market` over [lo, hi): the price records', hours they miss from the bundled series."""
    rec = records.prices.filter(pl.col("market") == market)
    if rec.height:
        run = rec["market_run"].mode()[0]
        other = rec.filter(pl.col("market_run") != run).height
        if other:
            report.add("prices", "dropped", "price", other, f"market runs other than {run} (one hourly series replays)")
        rec = rec.filter(pl.col("market_run") == run)
    rec = rec.select(PRICE_COLUMNS).filter((pl.col("interval_end") > lo) & (pl.col("interval_start") < hi))
    hours = pl.datetime_range(
        floor_to(lo, 3600.0), hi, "1h", time_unit="us", time_zone="UTC", closed="left", eager=True
    )
    missing = hours.filter(~hours.is_in(rec["interval_start"].implode()))
    if missing.len() == 0:
        report.add("prices", "checked", "price", rec.height, "every hour of the replay horizon from the price records")
        return rec.sort("interval_start")
    years = sorted({d.year for d in missing.to_list()} & set(available_years(market)))
    bundled = load_prices(market, years).select(PRICE_COLUMNS) if years else pl.DataFrame(schema=rec.schema)
    fill = bundled.filter(pl.col("interval_start").is_in(missing.implode()))
    if fill.height < missing.len():
        raise ValueError(
            f"{market}: {missing.len() - fill.height} hours between {lo} and {hi} have no price record "
            "and no bundled price; add price records for them"
        )
    report.add(
        "prices",
        "assumed",
        "price",
        fill.height,
        f"hours without a price record filled from the bundled {market} series (of {missing.len()} missing)",
    )
    return pl.concat([rec, fill.cast(rec.schema)]).sort("interval_start")


def _empty_history(prices: pl.DataFrame, start: datetime) -> History:
    per_minute = pl.DataFrame(schema={"minute_at": _UTC, "request_class": pl.String, "requests": pl.Int64})
    cols: dict[str, pl.DataType] = {"period_at": _UTC, "request_class": pl.String}
    cols |= {f"{s}_{q}": pl.Float64() for s in ("input_tokens", "output_tokens") for q, _ in QUANTILES}
    return History(per_minute, pl.DataFrame(schema=cols), history_prices(prices, start - timedelta(days=7), start))


def history(records: Records, start: datetime, prices: pl.DataFrame, period_s: float, report: HistoryReport) -> History:
    """Aggregates of the records in the 7 days before `start` (see the module docstring)."""
    since = start - timedelta(days=PROTOCOL_V1.history_days)
    before = records.arrivals.filter((pl.col("event_at") >= since) & (pl.col("event_at") < start))
    if before.height == 0:
        report.add(
            "history",
            "skipped",
            "request_arrival",
            0,
            "no records in the 7 days before the replay range: forecasters and policies start without the "
            "week's aggregates (pass --history-start to keep part of the records as history)",
        )
        return _empty_history(prices, start)
    first = floor_to(before["event_at"].min(), 60.0)  # type: ignore[arg-type]
    covered = (start - first).total_seconds() / 86400.0
    report.add(
        "history",
        "checked" if covered >= 7 - 1e-9 else "assumed",
        "request_arrival",
        before.height,
        f"history aggregates from {covered:.2f} days of the 7 before the range start",
    )
    minutes = pl.datetime_range(first, start, "1m", time_unit="us", time_zone="UTC", closed="left", eager=True)
    grid = pl.DataFrame({"minute_at": minutes}).join(
        pl.DataFrame({"request_class": [c.value for c in RequestClass]}), how="cross"
    )
    counts = before.group_by(pl.col("event_at").dt.truncate("1m").alias("minute_at"), "request_class").agg(
        pl.len().cast(pl.Int64).alias("requests")
    )
    per_minute = (
        grid.join(counts, on=["minute_at", "request_class"], how="left")
        .with_columns(pl.col("requests").fill_null(0))
        .sort("minute_at", "request_class")
    )
    sized = before.join(records.completions.select("request_id", "output_tokens"), on="request_id", how="left")
    every = f"{int(period_s)}s"
    q = (
        sized.group_by(pl.col("event_at").dt.truncate(every).alias("period_at"), "request_class")
        .agg(
            *(
                pl.col(s).cast(pl.Float64).quantile(v, "linear").alias(f"{s}_{name}")
                for s in ("input_tokens", "output_tokens")
                for name, v in QUANTILES
            )
        )
        .sort("period_at", "request_class")
    )
    return History(per_minute, q, history_prices(prices, since, start))


def build_history_workload(
    records: Records,
    config: HistoryConfig,
    market: str,
    start: datetime,
    end: datetime,
    seed: int,
    prices: pl.DataFrame,
    hist: History,
    report: HistoryReport,
) -> Workload:
    """The replay's workload over [start, end) (see the module docstring); `prices` from `prices_for`, `hist`
    from `history`; `report` gets the SLA, deadline and output findings (seed 0 only: the others repeat them)."""
    period_s = config.period_minutes * 60.0
    sink = report if seed == 0 else HistoryReport()
    arr = records.arrivals.filter((pl.col("event_at") >= start) & (pl.col("event_at") < end))
    after = records.arrivals.filter(pl.col("event_at") >= end).height
    if after:
        sink.add("range", "dropped", "request_arrival", after, f"arrivals at or after the replay range end {end}")
    df = _outputs(arr, records.completions, sink).with_columns(_seconds("event_at", start).alias("arrival_s"))
    df = _deadlines(_sla(df, config, sink), start, config, sink)
    df = _noise(df, seed, market, period_s).with_columns(
        pl.coalesce("tenant", pl.lit("tenant-") + pl.col("request_class")).alias("tenant"),
        pl.coalesce("allowed_regions", pl.lit(list(REGIONS), dtype=pl.List(pl.String))).alias("allowed_regions"),
        pl.col("prefix_block_ids").fill_null(pl.lit([], dtype=pl.List(pl.Int64))),
    )
    requests = df.select(list(REQUEST_SCHEMA)).cast(REQUEST_SCHEMA)  # type: ignore[arg-type]
    hours = prices.filter((pl.col("interval_end") > start) & (pl.col("interval_start") < end))
    window = Window(market, start, end, float(hours["lmp_usd_mwh"].mean() or 0.0), "history")  # type: ignore[arg-type]
    provenance = {c: MEASURED for c in REQUEST_SCHEMA if c != "request_id"}
    return Workload(window, requests, hist, prices, seed, SOURCE, provenance)
