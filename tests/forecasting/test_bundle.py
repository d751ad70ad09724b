"""The MarketForecaster facade: history + one period of observations -> K DisturbanceForecasts."""

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from forecasting.bundle import MarketForecaster
from schemas.forecast import DisturbanceForecast
from schemas.policy import History, Observations
from schemas.protocol import CLASSES

START = datetime(2023, 7, 20, 18, tzinfo=UTC)


def _history() -> History:
    rng = np.random.default_rng(0)
    minutes = [START - timedelta(days=3) + timedelta(minutes=i) for i in range(3 * 1440)]
    apm = pl.DataFrame({"minute_at": np.repeat(minutes, 3), "request_class": list(CLASSES) * len(minutes),
                        "requests": rng.poisson(50, 3 * len(minutes))})
    periods = [START - timedelta(days=3) + timedelta(minutes=5 * i) for i in range(3 * 288)]
    sq = pl.DataFrame({"period_at": np.repeat(periods, 3), "request_class": list(CLASSES) * len(periods)})
    for col in ("input_tokens_p50", "input_tokens_p90", "input_tokens_p99", "output_tokens_p50",
                "output_tokens_p90", "output_tokens_p99"):
        sq = sq.with_columns(pl.lit(300.0 if "p50" in col else 900.0).alias(col))
    hours = [START - timedelta(days=10) + timedelta(hours=h) for h in range(10 * 24 + 30)]
    prices = pl.DataFrame({"interval_start": hours, "lmp_usd_mwh": 40 + 10 * np.sin(np.arange(len(hours)) / 4),
                           "published_at": [min(h, START - timedelta(hours=2)) for h in hours]})
    return History(apm, sq, prices)  # the hours after START are published day-ahead


def _observations(as_of: datetime) -> Observations:
    at = [as_of - timedelta(seconds=s) for s in range(1, 300, 2)]
    cls = [CLASSES[i % 3] for i in range(len(at))]
    arrivals = pl.DataFrame({"event_at": at, "request_class": cls, "input_tokens": [400] * len(at),
                             "prefix_block_ids": [[i % 7, 100 + i % 3] for i in range(len(at))]})
    comp = pl.DataFrame({"event_at": at, "request_class": cls, "output_tokens": [120] * len(at)})
    empty = pl.DataFrame()
    return Observations(as_of, 0, arrivals, comp, empty, empty, empty)


@pytest.mark.slow
def test_facade_returns_k_periods_with_published_prices_flagged():
    mf = MarketForecaster("ERCOT", horizon_periods=6).start(_history(), START)
    as_of = START + timedelta(minutes=5)
    out = mf.update(_observations(as_of)).forecast(as_of)
    assert len(out) == 6 and all(isinstance(d, DisturbanceForecast) for d in out)
    assert out[0].period_start == as_of and out[1].period_start == as_of + timedelta(minutes=5)
    assert all(d.price_published for d in out)  # published day-ahead: exact, zero width
    assert out[0].price_usd_mwh.lo95 == out[0].price_usd_mwh.point == out[0].price_usd_mwh.hi95
    for d in out:
        assert 0.0 <= d.confidence <= 1.0 and {c.request_class for c in d.demand} == set(CLASSES)
        for c in d.demand:
            r = c.arrivals_per_s
            assert 0 <= r.lo95 <= r.lo80 <= r.point <= r.hi80 <= r.hi95
            assert c.input_tokens_mean > 0 and 0.0 <= c.prefix_hit_rate <= 1.0
    assert {"price", "arrivals/chat", "output_p50/code", "prefix_reuse/batch"} <= set(mf.last_forecasts)


@pytest.mark.slow
def test_oracle_arm_is_flagged():
    truth = ([99.0] * 48, [START + timedelta(hours=h) for h in range(48)])
    mf = MarketForecaster("PJM", horizon_periods=3, truth={"price": truth}).start(_history(), START)
    out = mf.forecast(START)
    assert out[0].provenance["oracle"] == "true" and out[0].price_usd_mwh.point == 99.0
