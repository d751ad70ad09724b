"""The seasonal median members: a price spike on one day does not move them, where it moves the mean."""

import numpy as np

from forecasting.models import make_model
from forecasting.store import SeriesView


def _view(y: np.ndarray) -> SeriesView:
    y = np.array(y, dtype=float)  # a read-only copy, as the store hands out
    y.setflags(write=False)
    return SeriesView(0, 3_600_000_000, y, y, 3_600_000_000 * len(y))


def test_seasonal_median_ignores_a_one_day_spike() -> None:
    day = 40.0 + 10.0 * np.sin(np.arange(24) / 24 * 2 * np.pi)
    y = np.tile(day, 14)
    y[-30] = 3000.0  # one hour of yesterday-but-one spikes
    med = make_model("seasonal_median", 24, 168).predict(_view(y), 24)
    mean = make_model("seasonal_mean", 24, 168).predict(_view(y), 24)
    assert np.allclose(med, day)
    slot = (len(y) - 30) % 24
    assert mean[slot] > day[slot] + 500.0  # the mean carries the spike forward


def test_median_day_week_takes_the_middle_of_day_week_and_profile() -> None:
    y = np.tile(np.full(24, 50.0), 14)
    y[-24:] = 80.0  # yesterday high: the day naive says 80, the week naive and the 7-day median say 50
    out = make_model("median_day_week", 24, 168).predict(_view(y), 24)
    assert np.allclose(out, 50.0)
    y[-168:] = 80.0  # the whole last week high: all three agree on 80
    assert np.allclose(make_model("median_day_week", 24, 168).predict(_view(y), 24), 80.0)
