"""Intervals are calibrated on a series with known Gaussian noise; confidence falls on a pattern break."""

from datetime import timedelta

import numpy as np

from forecasting.calibration import interval_offsets
from forecasting.checks import HOUR_US, T0, synthetic
from forecasting.evaluate import backtest
from forecasting.pool import PoolForecaster

FAST = ("snaive_day", "seasonal_mean", "lag_regression")


def test_coverage_matches_nominal_on_gaussian_noise():
    y, ev, arr = synthetic(n=24 * 7 * 20, seed=3, noise=4.0)
    f = PoolForecaster(pool=FAST, max_horizon=24)
    origins = ev[24 * 7 * 6 :: 23]
    sc = backtest(f, y, ev, arr, origins, 24)
    s = sc.summary()
    assert abs(s["coverage_80"] - 0.80) < 0.04, s
    assert abs(s["coverage_95"] - 0.95) < 0.03, s
    # width close to the Gaussian ideal for noise sd 4 (2 * 1.2816 * 4 = 10.3), not far wider
    assert s["width_80"] < 1.6 * 10.3, s


def test_confidence_falls_when_the_series_breaks_pattern():
    n, brk = 24 * 7 * 6, 24 * 7 * 5
    y, ev, arr = synthetic(n=n, seed=1, noise=2.0, shift_at=brk, shift=25.0)
    f = PoolForecaster(pool=FAST, max_horizon=24).update_many(y, ev, arr)
    before = f.forecast(24, T0 + timedelta(hours=brk)).confidence
    after = f.forecast(24, T0 + timedelta(hours=brk + 12)).confidence
    assert after < 0.6 * before, (before, after)


def test_forecast_steps_start_at_the_interval_containing_as_of():
    y, ev, arr = synthetic(n=400)
    f = PoolForecaster(pool=FAST).update_many(y, ev, arr)
    fc = f.forecast(3, T0 + timedelta(hours=300, minutes=20))
    assert fc.step_at_us[0] == ev[300] and np.all(np.diff(fc.step_at_us) == HOUR_US)
    assert fc.to_interval(0).lo95 <= fc.to_interval(0).point <= fc.to_interval(0).hi95


def test_each_level_calibrates_on_its_own_window_of_origins():
    rng = np.random.default_rng(0)
    old = rng.normal(0.0, 10.0, size=(200, 6))
    recent = rng.normal(0.0, 1.0, size=(100, 6))
    res = np.vstack([old, recent])
    zero = {80: 0.0, 95: 0.0}
    split = interval_offsets(res, 6, zero, rows={80: 100})
    whole = interval_offsets(res, 6, zero)
    # the 80% band follows the last 100 origins only (sd 1: half-width ~1.28); the 95% band all 300
    assert np.all(np.abs(split[:2]) < 2.0), split[:2]
    assert np.allclose(split[2:], whole[2:])
    assert np.all(np.abs(whole[:2]) > 3.0), whole[:2]
