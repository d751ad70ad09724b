"""Information availability as code (DESIGN.md "Information availability").

- PJM real-time hourly prices are known when their hour ends: ``published_at = interval_end``.
- ERCOT and CAISO day-ahead hourly prices for operating day D (market-local calendar day of the
  interval start) are known from 13:00 market-local time on D - 1.
- A request arrival record carries no output length; it is known only at completion.

A consumer as of t sees exactly the price rows with ``published_at <= t`` (`visible`) and the requests
with ``arrived_at <= t``.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

import polars as pl

REAL_TIME_HOURLY = "REAL_TIME_HOURLY"
DAY_AHEAD_HOURLY = "DAY_AHEAD_HOURLY"

#: Market-local clock of each market (operating days and the 13:00 day-ahead publication).
MARKET_TZ: dict[str, str] = {
    "PJM": "America/New_York",
    "ERCOT": "America/Chicago",
    "CAISO": "America/Los_Angeles",
}
#: The market run of each bundled series (gridstatus `Markets` names).
MARKET_RUN: dict[str, str] = {"PJM": REAL_TIME_HOURLY, "ERCOT": DAY_AHEAD_HOURLY, "CAISO": DAY_AHEAD_HOURLY}
#: Day-ahead results are published at this market-local time the day before the operating day.
DAY_AHEAD_PUBLISH_LOCAL = time(13, 0)
#: Schema version written into arrival records (schemas/request_arrival.v1).
ARRIVAL_SCHEMA_VERSION = "1"

_HOUR = timedelta(hours=1)


def _check_market(market: str) -> None:
    if market not in MARKET_TZ:
        raise ValueError(f"unknown market {market!r}; known: {sorted(MARKET_TZ)}")


def published_at(market: str, interval_start: datetime) -> datetime:
    """Publication time of one hourly price.

    Parameters
    ----------
    market : "PJM", "ERCOT" or "CAISO".
    interval_start : start of the hourly interval (tz-aware; naive is read as UTC).

    Returns
    -------
    datetime
        UTC instant from which the price is known.

    Examples
    --------
    >>> from datetime import datetime, timezone
    >>> published_at("ERCOT", datetime(2023, 7, 10, 5, tzinfo=timezone.utc)).isoformat()
    '2023-07-09T18:00:00+00:00'
    >>> published_at("PJM", datetime(2023, 7, 10, 5, tzinfo=timezone.utc)).isoformat()
    '2023-07-10T06:00:00+00:00'
    """
    _check_market(market)
    start = interval_start if interval_start.tzinfo else interval_start.replace(tzinfo=ZoneInfo("UTC"))
    if MARKET_RUN[market] == REAL_TIME_HOURLY:
        return (start + _HOUR).astimezone(ZoneInfo("UTC"))
    tz = ZoneInfo(MARKET_TZ[market])
    day = start.astimezone(tz).date() - timedelta(days=1)
    return datetime.combine(day, DAY_AHEAD_PUBLISH_LOCAL, tzinfo=tz).astimezone(ZoneInfo("UTC"))


def published_at_expr(market: str, interval_start: pl.Expr | None = None) -> pl.Expr:
    """Vectorized `published_at` over a ``Datetime(us, UTC)`` column (default ``interval_start``)."""
    _check_market(market)
    start = pl.col("interval_start") if interval_start is None else interval_start
    if MARKET_RUN[market] == REAL_TIME_HOURLY:
        return start + pl.duration(hours=1)
    tz = MARKET_TZ[market]
    day_before = start.dt.convert_time_zone(tz).dt.date() - pl.duration(days=1)
    local = day_before.cast(pl.Datetime("us")) + pl.duration(hours=DAY_AHEAD_PUBLISH_LOCAL.hour)
    return local.dt.replace_time_zone(tz).dt.convert_time_zone("UTC")


def visible(prices: pl.DataFrame, as_of: datetime) -> pl.DataFrame:
    """Price rows a consumer knows as of ``as_of``: exactly those with ``published_at <= as_of``.

    Parameters
    ----------
    prices : frame with a ``published_at`` column (Datetime UTC).
    as_of : the consumer's clock (tz-aware; naive is read as UTC).
    """
    t = as_of if as_of.tzinfo else as_of.replace(tzinfo=ZoneInfo("UTC"))
    return prices.filter(pl.col("published_at") <= pl.lit(t).dt.convert_time_zone("UTC"))


def arrival_records(requests: pl.DataFrame, window_start: datetime, site: str) -> pl.DataFrame:
    """Workload requests as request_arrival records (schemas/README.md): no output length.

    Parameters
    ----------
    requests : the builder's request frame (``arrival_s`` and ``deadline_s`` in s after window start).
    window_start : UTC start of the window (t = 0 of ``arrival_s``).
    site : the site the requests reached (schemas/request_arrival.v1: a non-empty string).

    Returns
    -------
    pl.DataFrame
        schema_version, request_id, event_at, arrived_at (= event_at in process), request_class, model,
        input_tokens, prefix_block_ids, site, tenant, allowed_regions, sla_ttft_ms, sla_tpot_ms,
        deadline_at. ``output_tokens`` is dropped: it is known only at completion.
    """
    t0 = pl.lit(window_start if window_start.tzinfo else window_start.replace(tzinfo=ZoneInfo("UTC")))
    t0 = t0.dt.convert_time_zone("UTC").dt.cast_time_unit("us")
    event_at = t0 + pl.duration(microseconds=(pl.col("arrival_s") * 1e6).round().cast(pl.Int64))
    deadline_at = t0 + pl.duration(microseconds=(pl.col("deadline_s") * 1e6).round().cast(pl.Int64))
    return requests.select(
        pl.lit(ARRIVAL_SCHEMA_VERSION).alias("schema_version"),
        "request_id",
        event_at.alias("event_at"),
        event_at.alias("arrived_at"),
        "request_class",
        "model",
        "input_tokens",
        "prefix_block_ids",
        pl.lit(site, dtype=pl.Utf8).alias("site"),
        "tenant",
        "allowed_regions",
        "sla_ttft_ms",
        "sla_tpot_ms",
        deadline_at.alias("deadline_at"),
    )


def market_rows(prices: pl.DataFrame, market: str) -> pl.DataFrame:
    """The price records of one market (all of them when the frame has no `market` column).

    In the three-site mode the stream delivers every site's market prices; a consumer of one market's price
    (a regime, a threshold, a forecaster) takes its own rows.
    """
    if "market" not in prices.columns:
        return prices
    return prices.filter(pl.col("market") == market)
