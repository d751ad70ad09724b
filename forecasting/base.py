"""The `Forecaster` protocol (river-like) and the forecaster registry.

    f.update(y, event_at, arrived_at)        # one observation; returns f
    f.update_many(ys, event_ats, arrived_ats) # a micro-batch; returns f
    f.forecast(horizon, as_of) -> Forecast    # steps start at the grid interval containing as_of

The history lives in a private `AsOfStore` (name-mangled, so subclasses cannot reach it). `forecast` takes
the store's view as of `as_of` and hands only that view to the subclass: observations that arrived later
do not exist for it. Constructor arguments are the configuration; `clone()` rebuilds from them, unfitted.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from datetime import datetime
from typing import Any, ClassVar, Self

import numpy as np

from forecasting.forecast import Forecast
from forecasting.store import AsOfStore, SeriesView, as_us_array, from_us, to_us
from schemas.registry import Registry


class Forecaster(ABC):
    """Base of every forecaster.

    Parameters
    ----------
    step_s : series step (s): 3600 for hourly prices, 300 for per-period series.
    season : steps per day (24 hourly, 288 five-minute).
    week : steps per week (168 hourly, 2016 five-minute).
    max_horizon : steps the models forecast past the last observation (more is computed on demand).
    source : provenance tag of the inputs (measured, trace-derived, benchmark-calibrated, modeled).
    seed : random seed; the same seed and inputs give the same forecast.
    """

    name: ClassVar[str] = ""
    oracle: ClassVar[bool] = False

    def __init__(self, step_s: float = 3600.0, season: int = 24, week: int = 168, max_horizon: int = 48,
                 source: str = "measured", seed: int = 0) -> None:
        self.step_s, self.season, self.week, self.max_horizon = step_s, season, week, max_horizon
        self.source, self.seed = source, seed
        self.__store = AsOfStore(step_s, season)

    @property
    def n_observations(self) -> int:
        """Observations stored (count), whatever their arrival time."""
        return len(self.__store)

    def update(self, y: float, event_at: datetime, arrived_at: datetime) -> Self:
        """Store one observation.

        Parameters
        ----------
        y : value in the series' unit.
        event_at : start of the interval it describes (UTC).
        arrived_at : when it reached us (UTC): publication for prices, completion for output lengths.
        """
        self.__store.update(float(y), to_us(event_at), to_us(arrived_at))
        return self

    def update_many(self, y: Any, event_at: Any, arrived_at: Any) -> Self:
        """Store a micro-batch (arrays or polars series; datetimes, datetime64 or us). Not modified."""
        self.__store.update_many(np.asarray(y, dtype=float), as_us_array(event_at), as_us_array(arrived_at))
        return self

    def forecast(self, horizon: int, as_of: datetime) -> Forecast:
        """Forecast `horizon` steps from the grid interval containing `as_of`, from what arrived by then.

        Raises ValueError when nothing had arrived by `as_of`.
        """
        if horizon < 1:
            raise ValueError("horizon must be >= 1")
        as_of_us = to_us(as_of)
        view = self.__store.view(as_of_us)
        if view is None:
            raise ValueError(f"{self.name}: no observation had arrived by {as_of.isoformat()}")
        return self._forecast(view, horizon, as_of_us)

    @abstractmethod
    def _forecast(self, view: SeriesView, horizon: int, as_of_us: int) -> Forecast:
        """The forecast from `view` (all the subclass may know)."""

    def _params(self) -> dict[str, Any]:
        sig = inspect.signature(type(self).__init__)
        return {p: getattr(self, p) for p in sig.parameters if p != "self"}

    def clone(self) -> Self:
        """An unfitted copy with the same configuration."""
        return type(self)(**self._params())

    def _steps(self, as_of_us: int, horizon: int) -> np.ndarray:
        step_us = int(round(self.step_s * 1e6))
        return (as_of_us // step_us + np.arange(horizon)).astype(np.int64)

    def _provenance(self, view: SeriesView, model: str) -> dict[str, str]:
        return {
            "inputs": self.source, "forecast": "modeled", "model": model, "observations": str(int(np.sum(
                np.isfinite(view.values)))), "last_event_at": view.time_of(view.end_index - 1).isoformat(),
            "as_of": from_us(view.as_of_us).isoformat(),
        }


FORECASTERS: Registry[Forecaster] = Registry("forecaster", ("forecasting.oracle", "forecasting.pool"))
register = FORECASTERS.register
create = FORECASTERS.create
names = FORECASTERS.names
