"""Day-ahead prices published before the decision are returned exactly, with zero-width intervals; hours
beyond the published day are forecast."""

from datetime import UTC, datetime, timedelta

import numpy as np

from forecasting.pool import PoolForecaster

FAST = ("snaive_day", "seasonal_mean", "lag_regression")


def _day_ahead(days: int) -> tuple[np.ndarray, list[datetime], list[datetime]]:
    """ERCOT-like: each operating day's 24 prices published at 13:00 local (18:00 UTC) the day before."""
    t0 = datetime(2023, 6, 1, 5, tzinfo=UTC)  # local midnight CDT
    rng = np.random.default_rng(0)
    starts = [t0 + timedelta(hours=h) for h in range(24 * days)]
    y = np.array([40 + 15 * np.sin(2 * np.pi * h / 24) + rng.normal(0, 2) for h in range(24 * days)])
    pub = [t0 + timedelta(days=h // 24 - 1, hours=13) for h in range(24 * days)]
    return y, starts, pub


def test_published_hours_returned_exactly_and_the_rest_forecast():
    y, starts, pub = _day_ahead(30)
    f = PoolForecaster(pool=FAST).update_many(y, starts, pub)
    as_of = starts[24 * 20] + timedelta(hours=14)  # day 20, 14:00 local: day 21 is published
    fc = f.forecast(40, as_of)
    first = 24 * 20 + 14
    known_until = 24 * 22  # end of day 21
    n_known = known_until - first
    assert fc.known[:n_known].all() and not fc.known[n_known:].any()
    np.testing.assert_array_equal(fc.point[:n_known], y[first:known_until])
    np.testing.assert_array_equal(fc.lo95[:n_known], fc.hi95[:n_known])
    assert np.all(fc.hi80[n_known:] > fc.lo80[n_known:])
    before = f.forecast(40, starts[24 * 20] + timedelta(hours=12))  # 12:00: day 21 not yet published
    assert before.known.sum() == 24 - 12


def test_a_later_publication_is_invisible_before_it():
    y, starts, pub = _day_ahead(30)
    f = PoolForecaster(pool=FAST).update_many(y, starts, pub)
    as_of = starts[24 * 20] + timedelta(hours=12, minutes=59)
    a = f.forecast(30, as_of)
    g = PoolForecaster(pool=FAST).update_many(np.where(np.array(pub) > as_of, y + 500, y), starts, pub)
    np.testing.assert_array_equal(a.point, g.forecast(30, as_of).point)
