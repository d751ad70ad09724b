"""Information availability: price publication times, `visible` exactness, arrival records without outputs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import polars as pl
import pytest

from schemas.availability import arrival_records, published_at, published_at_expr, visible
from schemas.fleet import MARKETS
from streams.datasets.prices import load_prices
from streams.workload.builder import build_workload

ARRIVAL_FIELDS = [
    "schema_version", "request_id", "event_at", "arrived_at", "request_class", "model", "input_tokens",
    "prefix_block_ids", "site", "tenant", "allowed_regions", "sla_ttft_ms", "sla_tpot_ms", "deadline_at",
]


def _local_day(df: pl.DataFrame, tz: str, day: datetime) -> pl.DataFrame:
    return df.filter(pl.col("interval_start").dt.convert_time_zone(tz).dt.date() == day.date())


def test_ercot_day_ahead_published_13_local_day_before():
    day = _local_day(load_prices("ERCOT", [2023]), "America/Chicago", datetime(2023, 7, 10))
    assert day.height == 24
    # 2023-07-09 13:00 CDT = 18:00Z, for every hour of the operating day
    assert day["published_at"].unique().to_list() == [datetime(2023, 7, 9, 18, tzinfo=UTC)]


@pytest.mark.parametrize(("day", "expected"), [
    (datetime(2023, 7, 10), datetime(2023, 7, 9, 20, tzinfo=UTC)),  # PDT
    (datetime(2023, 1, 10), datetime(2023, 1, 9, 21, tzinfo=UTC)),  # PST
])
def test_caiso_day_ahead_publication(day, expected):
    rows = _local_day(load_prices("CAISO", [2023]), "America/Los_Angeles", day)
    assert rows.height == 24 and rows["published_at"].unique().to_list() == [expected]


def test_pjm_real_time_published_at_interval_end():
    df = load_prices("PJM", [2023])
    assert (df["published_at"] == df["interval_end"]).all()
    assert published_at("PJM", datetime(2023, 7, 10, 5, tzinfo=UTC)) == datetime(2023, 7, 10, 6, tzinfo=UTC)


def test_operating_day_is_market_local():
    # 04:00Z on Jul 10 is 23:00 CDT on Jul 9: operating day Jul 9, published Jul 8 13:00 CDT
    assert published_at("ERCOT", datetime(2023, 7, 10, 4, tzinfo=UTC)) == datetime(2023, 7, 8, 18, tzinfo=UTC)
    assert published_at("ERCOT", datetime(2023, 7, 10, 5, tzinfo=UTC)) == datetime(2023, 7, 9, 18, tzinfo=UTC)


@pytest.mark.parametrize("market", MARKETS)
def test_scalar_and_vectorized_rules_agree(market):
    df = load_prices(market, [2023])
    got = df.select(published_at_expr(market).alias("p"))["p"]
    assert (got == df["published_at"]).all()
    sample = df.gather_every(97)
    expect = [published_at(market, t) for t in sample["interval_start"]]
    assert sample["published_at"].to_list() == expect


@pytest.mark.parametrize("market", ["PJM", "ERCOT"])
def test_visible_is_exactly_published_by_as_of(market):
    df = load_prices(market, [2023])
    rows = df.rows(named=True)
    publish = datetime(2023, 7, 9, 18, tzinfo=UTC)
    for as_of in (publish, publish - timedelta(microseconds=1), datetime(2023, 3, 12, 7, 30, tzinfo=UTC),
                  datetime(2023, 11, 5, 6, tzinfo=UTC)):
        expect = [r["interval_start"] for r in rows if r["published_at"] <= as_of]
        assert visible(df, as_of)["interval_start"].to_list() == expect


def test_day_ahead_visible_from_publication_instant():
    df = load_prices("ERCOT", [2023])
    tomorrow = _local_day(df, "America/Chicago", datetime(2023, 7, 10))["interval_start"]
    before = visible(df, datetime(2023, 7, 9, 17, 59, 59, 999999, tzinfo=UTC))
    at = visible(df, datetime(2023, 7, 9, 13, tzinfo=ZoneInfo("America/Chicago")))
    assert not before["interval_start"].is_in(tomorrow.implode()).any()
    assert at["interval_start"].is_in(tomorrow.implode()).sum() == 24
    # a naive as_of is read as UTC
    assert visible(df, datetime(2023, 7, 9, 18)).height == at.height


def test_pjm_hour_visible_exactly_when_it_ends():
    df = load_prices("PJM", [2023])
    t = datetime(2023, 7, 10, 6, tzinfo=UTC)
    assert visible(df, t)["interval_end"].max() == t
    assert visible(df, t - timedelta(microseconds=1))["interval_end"].max() == t - timedelta(hours=1)


@pytest.fixture(scope="module")
def ercot_short():
    return build_workload("ERCOT", 2023, periods=6)


def test_arrival_records_carry_no_output_length(ercot_short):
    w = ercot_short
    rec = arrival_records(w.requests, w.window.start, site="ercot-1")
    assert rec.columns == ARRIVAL_FIELDS
    assert "output_tokens" not in rec.columns and rec.height == w.requests.height
    first = w.requests.row(0, named=True)
    assert rec["event_at"][0] == w.window.start + timedelta(microseconds=round(first["arrival_s"] * 1e6))
    assert (rec["arrived_at"] == rec["event_at"]).all()
    batch = rec.filter(pl.col("request_class") == "batch")
    assert batch["deadline_at"].null_count() == 0 and batch["sla_ttft_ms"].null_count() == batch.height
    interactive = rec.filter(pl.col("request_class") != "batch")
    assert interactive["deadline_at"].null_count() == interactive.height
    utc = pl.Datetime("us", "UTC")
    assert rec.schema["event_at"] == utc and rec.schema["deadline_at"] == utc


def test_requests_seen_as_of_are_those_arrived(ercot_short):
    w = ercot_short
    rec = arrival_records(w.requests, w.window.start, "ercot-1")
    as_of = w.window.start + timedelta(minutes=7)
    seen = rec.filter(pl.col("arrived_at") <= as_of)
    assert seen.height == w.requests.filter(pl.col("arrival_s") <= 420.0).height


def test_history_prices_are_what_was_published_by_window_start():
    w = build_workload("ERCOT", 2023, periods=1)  # window 17:00-20:00 CDT: next day's DA already published
    start = w.window.start
    hist = w.history.prices
    assert hist["published_at"].max() <= start
    expect = visible(w.prices.filter(pl.col("interval_start") >= start - timedelta(days=7)), start)
    assert hist.equals(expect)
    # day-ahead rows through the end of the next operating day are known before the window
    assert hist["interval_start"].max() == datetime(2023, 8, 27, 4, tzinfo=UTC)
    assert hist["interval_start"].min() == start - timedelta(days=7)
