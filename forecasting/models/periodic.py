"""statsforecast models refit on a cadence over the recent history (statsforecast is imported lazily).

Fitting is the costly part (MSTL [24, 168] on 336 points ~0.1 s, AutoETS(24) ~0.25 s; BROKER.md), so each
member refits every `refit_every` steps (two weeks for hourly series) on its last `fit_steps` values. Between
refits the ETS-family members run their fitted parameters forward over the newest values (`forward`,
~0.3 ms), and MSTL reads further along the forecast path of its last fit.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from forecasting.models.base import PointModel, PrefixCache, register_model
from forecasting.store import SeriesView


class _StatsForecastMember(PointModel):
    """Shared refit/forward logic.

    Parameters
    ----------
    season, week, seed : see `PointModel`.
    fit_steps : values used per fit (steps); default two weeks of an hourly series.
    refit_every : steps of new data after which the model is refit; default two weeks of an hourly series
        (336), one week of a 5-minute series.
    """

    forwards = True

    def __init__(self, season: int, week: int, seed: int = 0, fit_steps: int | None = None,
                 refit_every: int | None = None) -> None:
        super().__init__(season, week, seed)
        self.fit_steps = fit_steps or max(2 * week if week <= 504 else 3 * season, 2 * season)
        self.refit_every = refit_every or (2 * week if week <= 504 else week)
        self._cache = PrefixCache()
        self._fitted: Any = None
        self._path = np.empty(0)

    def _spec(self) -> Any:
        raise NotImplementedError

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        y = view.filled
        if len(y) < self.fit_steps:
            return None
        since = len(view) - len(self._cache)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self._fitted is None or not self._cache.valid_for(view) or since >= self.refit_every:
                self._fitted = self._spec().fit(y[-self.fit_steps:])
                self._cache.set(view)
                self._path = np.asarray(self._fitted.predict(h=self.refit_every + n)["mean"], dtype=float)
                since = 0
            if self.forwards and since > 0:
                return np.asarray(self._fitted.forward(y=y[-self.fit_steps:], h=n)["mean"], dtype=float)
        if since + n > len(self._path):
            return None
        return self._path[since : since + n].copy()


@register_model
class StatsForecastMSTL(_StatsForecastMember):
    """MSTL with daily and weekly seasons (daily only when two weeks do not fit in `fit_steps`)."""

    name = "sf_mstl"
    forwards = False

    def _spec(self) -> Any:
        from statsforecast.models import MSTL  # lazy: statsforecast (numba) loads only when used

        seasons = [self.season, self.week] if self.fit_steps >= 2 * self.week else [self.season]
        return MSTL(season_length=seasons)


@register_model
class StatsForecastAutoETS(_StatsForecastMember):
    """AutoETS with a daily season (statsforecast drops seasonality above 24 steps)."""

    name = "sf_autoets"

    def _spec(self) -> Any:
        from statsforecast.models import AutoETS  # lazy: as above

        return AutoETS(season_length=self.season if self.season <= 24 else 1)


@register_model
class StatsForecastHoltWinters(_StatsForecastMember):
    """Additive Holt-Winters (ETS A,A,A) with a daily season."""

    name = "sf_holtwinters"

    def _spec(self) -> Any:
        from statsforecast.models import HoltWinters  # lazy: as above

        return HoltWinters(season_length=self.season if self.season <= 24 else 1, error_type="A")
