"""The lag regression winsorizes its lag inputs: a spike does not echo through the day-ago features."""

import numpy as np

from forecasting.models import make_model
from forecasting.store import SeriesView


def _view(y: np.ndarray) -> SeriesView:
    y = np.array(y, dtype=float)
    y.setflags(write=False)
    return SeriesView(0, 3_600_000_000, y, y, 3_600_000_000 * len(y))


def _series(days: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = 40.0 + 10.0 * np.sin(np.arange(24) / 24 * 2 * np.pi)
    level = np.repeat(rng.normal(0.0, 8.0, days), 24)  # each day's level moves: yesterday's shape, today's level
    return np.tile(shape, days) + level + rng.normal(0.0, 0.5, 24 * days)


def test_a_spike_does_not_echo_through_the_day_ago_features() -> None:
    y = _series(80, seed=2)
    clean = make_model("lag_regression", 24, 168).predict(_view(y), 24)
    spiked = y.copy()
    spiked[-20] = 9000.0  # one hour, 20 h ago: its slot is 4 steps ahead tomorrow and in the day-ago features
    out = make_model("lag_regression", 24, 168).predict(_view(spiked), 24)
    # unclipped the day-ago features carried ~4,000 of it; clipped at 30 MAD (~250 here) well under 100
    assert np.max(np.abs(out - clean)) < 100.0, np.max(np.abs(out - clean))
