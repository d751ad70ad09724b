"""Window selection (DESIGN.md "Time"): which contiguous hours of a market's year are replayed.

- ``max``: the contiguous run of ``hours`` hourly prices with the highest mean price in the year.
- ``median``: the run whose mean is closest to the median of all runs' means in the year.
- ``start`` given: the run starting there (on the hour; every hour must be in the data).

A run is contiguous when its hours follow each other without a gap; runs spanning a gap are never
candidates. Ties go to the earliest run. "Year" is the market-local calendar year of the run's hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl

from schemas.availability import MARKET_TZ

Rule = Literal["max", "median"]


@dataclass(frozen=True)
class Window:
    """A replay window.

    Parameters
    ----------
    market : market whose prices chose it.
    start, end : UTC instants; [start, end).
    mean_price_usd_mwh : mean hourly price over the window ($/MWh).
    rule : "max", "median" or "start" (given explicitly).
    """

    market: str
    start: datetime
    end: datetime
    mean_price_usd_mwh: float
    rule: str

    def local(self) -> tuple[datetime, datetime]:
        """Start and end in market-local time."""
        tz = ZoneInfo(MARKET_TZ[self.market])
        return self.start.astimezone(tz), self.end.astimezone(tz)


def _whole_hours(hours: float) -> int:
    if hours <= 0 or hours != int(hours):
        raise ValueError(f"window length must be a positive whole number of hours, got {hours}")
    return int(hours)


def _market(prices: pl.DataFrame) -> str:
    markets = prices["market"].unique().to_list()
    if len(markets) != 1:
        raise ValueError(f"select_window takes one market's prices, got {markets}")
    return str(markets[0])


def run_means(prices: pl.DataFrame, hours: int) -> pl.DataFrame:
    """Mean price of every contiguous ``hours``-hour run.

    Returns
    -------
    pl.DataFrame
        start (Datetime us UTC), mean_price_usd_mwh, one row per run that spans no gap, in time order.
    """
    df = prices.sort("interval_start")
    starts = df["interval_start"].dt.epoch("us").to_numpy()
    price = df["lmp_usd_mwh"].to_numpy()
    if starts.size < hours:
        return pl.DataFrame(schema={"start": pl.Datetime("us", "UTC"), "mean_price_usd_mwh": pl.Float64})
    span = starts[hours - 1 :] - starts[: starts.size - hours + 1]
    ok = span == (hours - 1) * 3_600_000_000
    means = np.lib.stride_tricks.sliding_window_view(price, hours).mean(axis=1)
    return pl.DataFrame({"start": df["interval_start"][: ok.size].filter(pl.Series(ok)),
                         "mean_price_usd_mwh": means[ok]})


def select_window(
    prices: pl.DataFrame,
    year: int,
    rule: Rule = "max",
    start: datetime | None = None,
    hours: float = 3.0,
) -> Window:
    """Choose the replay window of one market.

    Parameters
    ----------
    prices : one market's frame from `streams.datasets.prices.load_prices` (may hold several years).
    year : market-local calendar year to choose in (ignored when ``start`` is given).
    rule : "max" (most expensive run) or "median" (run whose mean is closest to the year's median run
        mean; ties: earliest).
    start : explicit window start (UTC, on the hour); overrides ``rule``.
    hours : window length (h, whole hours).

    Returns
    -------
    Window
    """
    n = _whole_hours(hours)
    market = _market(prices)
    if start is not None:
        return _explicit(prices, market, start, n)
    local_year = pl.col("interval_start").dt.convert_time_zone(MARKET_TZ[market]).dt.year()
    runs = run_means(prices.filter(local_year == year), n)
    if runs.height == 0:
        raise ValueError(f"{market}: no contiguous {n}-h run in {year}")
    means = runs["mean_price_usd_mwh"].to_numpy()
    if rule == "max":
        i = int(np.argmax(means))
    elif rule == "median":
        i = int(np.argmin(np.abs(means - np.median(means))))
    else:
        raise ValueError(f"unknown window rule {rule!r}; use 'max' or 'median'")
    begin = runs["start"][i].astimezone(UTC)
    return Window(market, begin, begin + timedelta(hours=n), float(means[i]), rule)


def _explicit(prices: pl.DataFrame, market: str, start: datetime, n: int) -> Window:
    begin = (start if start.tzinfo else start.replace(tzinfo=UTC)).astimezone(UTC)
    if begin.minute or begin.second or begin.microsecond:
        raise ValueError(f"window start must be on the hour, got {begin.isoformat()}")
    end = begin + timedelta(hours=n)
    inside = prices.filter((pl.col("interval_start") >= begin) & (pl.col("interval_start") < end))
    if inside.height != n:
        raise ValueError(
            f"{market}: window {begin.isoformat()} + {n} h is not inside the data "
            f"({inside.height}/{n} hours present)"
        )
    return Window(market, begin, end, float(inside["lmp_usd_mwh"].mean()), "start")
