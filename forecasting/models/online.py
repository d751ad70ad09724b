"""river online learners, updated one observation at a time (river is imported lazily)."""

from __future__ import annotations

from typing import Any

import numpy as np

from forecasting.models.base import PointModel, PrefixCache, register_model
from forecasting.store import SeriesView


@register_model
class RiverHoltWinters(PointModel):
    """river.time_series.HoltWinters (additive), learning each new value of the view in order.

    The learner's position is tied to the data it has learned (`PrefixCache`); when a view is not an
    extension of that data (an earlier as-of, a late revision) the learner is rebuilt from the view.

    Parameters
    ----------
    season, week, seed : see `PointModel`.
    alpha, beta, gamma : level, trend and season smoothing (0-1).
    """

    name = "river_holtwinters"

    def __init__(self, season: int, week: int, seed: int = 0, alpha: float = 0.3, beta: float = 0.01,
                 gamma: float = 0.2) -> None:
        super().__init__(season, week, seed)
        self.alpha, self.beta, self.gamma = alpha, beta, gamma
        self._cache = PrefixCache()
        self._model: Any = None

    def _new(self) -> Any:
        from river.time_series import HoltWinters  # lazy: river loads only when this member is built

        return HoltWinters(alpha=self.alpha, beta=self.beta, gamma=self.gamma, seasonality=self.season)

    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        y = view.filled
        if len(y) < 2 * self.season:
            return None
        if self._model is None or not self._cache.valid_for(view):
            self._model, done = self._new(), 0
        else:
            done = len(self._cache)
        for v in y[done:]:
            self._model.learn_one(float(v))
        self._cache.set(view)
        return np.asarray(self._model.forecast(horizon=n), dtype=float)
