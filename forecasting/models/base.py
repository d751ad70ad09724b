"""Point models: the members of a forecaster's pool. Each maps a `SeriesView` to n point forecasts.

A point model sees only the view it is handed. When it keeps state between calls (an online learner's
position, a fitted model), it also keeps the exact data that state came from and drops the state unless
that data is a prefix of the view it is asked about (`PrefixCache`), so no state can carry a later
observation into an earlier forecast.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from forecasting.store import SeriesView, first_mismatch
from schemas.registry import Registry


class PrefixCache:
    """The data a piece of state was derived from; `valid_for` says whether it is a prefix of a view."""

    def __init__(self) -> None:
        self.start_index: int | None = None
        self.ref: np.ndarray = np.empty(0)

    def set(self, view: SeriesView) -> None:
        """Record that the state now reflects exactly `view`."""
        self.start_index, self.ref = view.start_index, view.values

    def valid_for(self, view: SeriesView) -> bool:
        """True when the recorded data is a prefix of `view`."""
        return (
            self.start_index == view.start_index
            and len(self.ref) <= len(view)
            and first_mismatch(view.values, self.ref) == len(self.ref)
        )

    def __len__(self) -> int:
        return len(self.ref)


class PointModel(ABC):
    """One pool member.

    Parameters
    ----------
    season : steps per day (24 for hourly series, 288 for 5-minute series).
    week : steps per week (168 hourly, 2016 five-minute).
    seed : random seed (the built-in members are deterministic; kept for the protocol).
    """

    name: ClassVar[str] = ""

    def __init__(self, season: int, week: int, seed: int = 0) -> None:
        self.season, self.week, self.seed = season, week, seed

    @abstractmethod
    def predict(self, view: SeriesView, n: int) -> np.ndarray | None:
        """Point forecasts for the `n` grid steps after the view's end; None when the view is too short."""


MODELS: Registry[PointModel] = Registry(
    "point model",
    ("forecasting.models.naive", "forecasting.models.online", "forecasting.models.periodic",
     "forecasting.models.regression"),
)  # fmt: skip
model_names = MODELS.names


def register_model(cls: type[PointModel]) -> type[PointModel]:
    """Class decorator: register a point model under its `name`; an empty or duplicate name is an error."""
    return MODELS.register(cls.name)(cls)


def make_model(name: str, season: int, week: int, seed: int = 0) -> PointModel:
    """Build a registered point model."""
    return MODELS.create(name, season=season, week=week, seed=seed)
