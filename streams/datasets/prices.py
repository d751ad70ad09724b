"""Hourly wholesale prices 2020-2024 for PJM, ERCOT and CAISO, in one normalized UTC shape.

Source quirks (data/prices/SOURCE.md), each handled here explicitly:

- CAISO year files run from local midnight Dec 31 of the previous year, so consecutive files overlap by
  24 h. The overlapping rows are checked to agree (else `ValueError`), then deduplicated.
- CAISO and PJM write the interval start in UTC without an offset; ERCOT writes market-local time with
  its UTC offset. All are parsed to ``Datetime("us", "UTC")``.
- PJM lacks Dec 31 of every year. Gaps are reported by `price_gaps` and logged as a warning by
  `load_prices`, never filled.

A "year" is the market-local calendar year of the interval start (operating days).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo

import polars as pl

from schemas.availability import MARKET_RUN, MARKET_TZ, published_at_expr
from streams.datasets.paths import data_dir

log = logging.getLogger(__name__)

#: Bundled folder and priced location of each market.
FOLDER: dict[str, str] = {"PJM": "US-MIDA-PJM", "ERCOT": "US-TEX-ERCO", "CAISO": "US-CAL-CISO"}
LOCATION: dict[str, str] = {"PJM": "DOM", "ERCOT": "HB_HUBAVG", "CAISO": "TH_NP15_GEN-APND"}
#: Whether the file's `Datetime` carries a UTC offset (else it is UTC written without one).
HAS_OFFSET: dict[str, bool] = {"PJM": False, "ERCOT": True, "CAISO": False}

PRICE_SCHEMA: dict[str, pl.DataType] = {
    "market": pl.Utf8(),
    "location": pl.Utf8(),
    "market_run": pl.Utf8(),
    "interval_start": pl.Datetime("us", "UTC"),
    "interval_end": pl.Datetime("us", "UTC"),
    "lmp_usd_mwh": pl.Float64(),
    "published_at": pl.Datetime("us", "UTC"),
}


def _file(root: Path, market: str, year: int) -> Path:
    return root / "prices" / FOLDER[market] / f"{FOLDER[market]}_electricity_prices_{year}.csv.gz"


def available_years(market: str) -> list[int]:
    """Years with a bundled price file for ``market``."""
    _check(market)
    folder = data_dir() / "prices" / FOLDER[market]
    files = folder.glob("*_electricity_prices_*.csv.gz")
    return sorted(int(f.name.removesuffix(".csv.gz").rsplit("_", 1)[1]) for f in files)


def _check(market: str) -> None:
    if market not in FOLDER:
        raise ValueError(f"unknown market {market!r}; known: {sorted(FOLDER)}")


def _read_file(root: Path, market: str, year: int) -> pl.DataFrame:
    """One raw year file as (interval_start UTC, lmp_usd_mwh), quirks not yet handled."""
    raw = pl.read_csv(_file(root, market, year), schema={"Datetime": pl.Utf8, "Price (USD/MWh)": pl.Float64})
    ts = pl.col("Datetime")
    if HAS_OFFSET[market]:
        start = ts.str.to_datetime("%Y-%m-%d %H:%M:%S%:z", time_unit="us").dt.convert_time_zone("UTC")
    else:
        start = ts.str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us").dt.replace_time_zone("UTC")
    return raw.select(start.alias("interval_start"), pl.col("Price (USD/MWh)").alias("lmp_usd_mwh"))


def _dedupe_overlap(market: str, df: pl.DataFrame) -> pl.DataFrame:
    """Drop rows repeated across year files after checking that their prices agree."""
    dup = df.filter(pl.col("interval_start").is_duplicated())
    if dup.height:
        values = dup.group_by("interval_start").agg(pl.col("lmp_usd_mwh").n_unique().alias("n"))
        bad = values.filter(pl.col("n") > 1)
        if bad.height:
            raise ValueError(
                f"{market}: overlapping year files disagree at {bad.height} hours, "
                f"first {bad.sort('interval_start')['interval_start'][0]}"
            )
    return df.unique(subset="interval_start", keep="first", maintain_order=True)


@lru_cache(maxsize=32)
def _load(root: Path, market: str, years: tuple[int, ...]) -> pl.DataFrame:
    files = [_read_file(root, market, y) for y in years]
    df = _dedupe_overlap(market, pl.concat(files))
    local_year = pl.col("interval_start").dt.convert_time_zone(MARKET_TZ[market]).dt.year()
    df = df.filter(local_year.is_in(list(years))).sort("interval_start")
    out = df.select(
        pl.lit(market).alias("market"),
        pl.lit(LOCATION[market]).alias("location"),
        pl.lit(MARKET_RUN[market]).alias("market_run"),
        pl.col("interval_start"),
        (pl.col("interval_start") + pl.duration(hours=1)).alias("interval_end"),
        pl.col("lmp_usd_mwh"),
        published_at_expr(market).dt.cast_time_unit("us").alias("published_at"),
    )
    gaps = price_gaps(out)
    if gaps.height:
        log.warning(
            "%s %s: %d gap(s), %d missing hours, reported not filled (first %s)",
            market, list(years), gaps.height, gaps["missing_hours"].sum(), gaps["gap_start"][0],
        )
    return out


def load_prices(market: str, years: Iterable[int]) -> pl.DataFrame:
    """Hourly prices of one market for the given market-local calendar years.

    Parameters
    ----------
    market : "PJM" (DOM zone, real-time hourly), "ERCOT" (HB_HUBAVG, day-ahead) or "CAISO"
        (TH_NP15_GEN-APND, day-ahead).
    years : market-local calendar years to load (2020-2024 bundled).

    Returns
    -------
    pl.DataFrame
        market, location, market_run, interval_start, interval_end (Datetime us UTC), lmp_usd_mwh ($/MWh),
        published_at (Datetime us UTC, see `schemas.availability`), sorted by interval_start.
        Gaps stay gaps: see `price_gaps`.
    """
    _check(market)
    ys = tuple(sorted(set(int(y) for y in years)))
    missing = sorted(set(ys) - set(available_years(market)))
    if missing:
        raise FileNotFoundError(f"{market}: no bundled prices for {missing}; have {available_years(market)}")
    return _load(data_dir(), market, ys).clone()


def price_gaps(df: pl.DataFrame, start: datetime | None = None, end: datetime | None = None) -> pl.DataFrame:
    """Missing hours of one market's price series, reported as runs.

    Parameters
    ----------
    df : one market's frame from `load_prices`.
    start, end : expected coverage [start, end) (UTC). Default: the market-local calendar years the
        frame touches, so a missing last day of a year is reported too.

    Returns
    -------
    pl.DataFrame
        gap_start, gap_end (Datetime us UTC; the gap is [gap_start, gap_end)), missing_hours (i64).
    """
    dt = pl.Datetime("us", "UTC")
    out_schema = {"gap_start": dt, "gap_end": dt, "missing_hours": pl.Int64}
    if df.height == 0:
        return pl.DataFrame(schema=out_schema)
    markets = df["market"].unique().to_list()
    if len(markets) != 1:
        raise ValueError(f"price_gaps takes one market, got {markets}")
    tz = ZoneInfo(MARKET_TZ[markets[0]])
    utc = ZoneInfo("UTC")
    starts = df["interval_start"].sort()
    if start is None:
        start = datetime(starts[0].astimezone(tz).year, 1, 1, tzinfo=tz).astimezone(utc)
    if end is None:
        end = datetime(starts[-1].astimezone(tz).year + 1, 1, 1, tzinfo=tz).astimezone(utc)
    # expected: each hour starts where the previous one ended; coverage runs from `start` to `end`
    ends = pl.DataFrame({"s": starts}).select(pl.col("s") + pl.duration(hours=1)).to_series()
    gaps = pl.DataFrame(
        {
            "gap_start": pl.concat([pl.Series([start], dtype=dt), ends]),
            "gap_end": pl.concat([starts, pl.Series([end], dtype=dt)]),
        }
    ).with_columns((pl.col("gap_end") - pl.col("gap_start")).dt.total_hours().alias("missing_hours"))
    return gaps.filter(pl.col("missing_hours") > 0).select(list(out_schema)).cast(out_schema)
