"""The oracle: returns the realized future, flagged `oracle=True`, for the oracle-gap arm only.

It is the one forecaster that reads what had not arrived: the realized series is handed to its constructor
(by the replay harness, which has it). Its observations (`update`) are kept like any forecaster's but are
used only where the realized series has no value for a step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forecasting.base import Forecaster, register
from forecasting.forecast import Forecast
from forecasting.store import SeriesView, as_us_array, from_us


@register("oracle")
class OracleForecaster(Forecaster):
    """Perfect foresight with zero-width intervals and confidence 1.

    Parameters
    ----------
    truth_y : realized values (series unit), one per step.
    truth_event_at : start of each realized step (datetimes, datetime64 or microseconds, UTC).
    step_s, season, week, max_horizon, source, seed : see `Forecaster`.
    """

    name = "oracle"
    oracle = True

    def __init__(self, truth_y: Any = (), truth_event_at: Any = (), step_s: float = 3600.0, season: int = 24,
                 week: int = 168, max_horizon: int = 48, source: str = "measured", seed: int = 0) -> None:
        super().__init__(step_s, season, week, max_horizon, source, seed)
        self.truth_y, self.truth_event_at = truth_y, truth_event_at
        step_us = int(round(step_s * 1e6))
        idx = as_us_array(np.asarray(truth_event_at)) // step_us if len(truth_event_at) else np.empty(0, int)
        self._truth = dict(zip(idx.tolist(), np.asarray(truth_y, dtype=float).tolist(), strict=True))

    def _forecast(self, view: SeriesView, horizon: int, as_of_us: int) -> Forecast:
        steps = self._steps(as_of_us, horizon)
        last = float(view.filled[-1])
        point = np.array([self._truth.get(int(g), last) for g in steps])
        zero = point.copy()
        prov = self._provenance(view, self.name) | {"forecast": "oracle (realized future)"}
        return Forecast(
            step_at_us=steps * view.step_us, step_s=self.step_s, point=point, lo80=zero, hi80=zero.copy(),
            lo95=zero.copy(), hi95=zero.copy(), known=np.zeros(horizon, dtype=bool), confidence=1.0,
            model=self.name, as_of=from_us(as_of_us), provenance=prov, oracle=True,
        )
