"""Seasonal naive (lag one day, lag one week), the seasonal profile mean and median, the median of the day, week and
seasonal median, the recent mean and the last value."""

from __future__ import annotations

import numpy as np

from forecasting.models.base import PointModel, register_model
from forecasting.store import SeriesView


def seasonal_naive(y: np.ndarray, n: int, lag: int) -> np.ndarray | None:
    """y[T + k - lag * ceil(k / lag)] for k = 1..n (T = last index); None when len(y) < lag."""
    if len(y) < lag or lag < 1:
        return None
    k = np.arange(1, n + 1)
    return y[len(y) - 1 + k - lag * np.ceil(k / lag).astype(int)].astype(float)


@register_model
class SeasonalNaiveDay(PointModel):
    """The value one day (`season` steps) earlier: seasonal naive lag 24 for hourly series."""

    name = "snaive_day"

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        return seasonal_naive(view.filled, n, self.season)


@register_model
class SeasonalNaiveWeek(PointModel):
    """The value one week (`week` steps) earlier: seasonal naive lag 168 for hourly series."""

    name = "snaive_week"

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        return seasonal_naive(view.filled, n, self.week)


@register_model
class SeasonalMean(PointModel):
    """Mean of the same slot over the last `days` seasons (at least 2 seasons of data)."""

    name = "seasonal_mean"
    days = 5
    reduce = staticmethod(np.mean)

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        y, s = view.filled, self.season
        d_max = min(self.days, len(y) // s)
        if d_max < 2:
            return None
        k = np.arange(1, n + 1)
        base = len(y) - 1 + k - s * np.ceil(k / s).astype(int)
        return self.reduce([y[base - d * s] for d in range(d_max)], axis=0)


@register_model
class SeasonalMedian(SeasonalMean):
    """Median of the same slot over the last `days` seasons: the seasonal profile without the spikes a mean carries
    forward (the MAE-optimal point of a spiky price series)."""

    name = "seasonal_median"
    days = 7
    reduce = staticmethod(np.median)


@register_model
class MedianDayWeek(SeasonalMedian):
    """Median of three: the value a day earlier, a week earlier, and the seasonal median (`seasonal_median`)."""

    name = "median_day_week"

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        med = super().predict(view, n)
        day = seasonal_naive(view.filled, n, self.season)
        week = seasonal_naive(view.filled, n, self.week)
        if med is None or day is None or week is None:
            return None
        return np.median(np.stack([day, week, med]), axis=0)


@register_model
class RecentMean(PointModel):
    """Mean of the last eighth of a season (at least one step): the fallback for short series."""

    name = "recent_mean"

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        w = max(1, self.season // 8)
        return np.full(n, float(np.mean(view.filled[-w:])))


@register_model
class LastValue(PointModel):
    """The last observed value, held: persistence, the usual winner one or two steps ahead of a price spike."""

    name = "last_value"

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        return np.full(n, float(view.filled[-1]))
