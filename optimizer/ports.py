"""The two ports the Aurelius policy is injected with: the forecasts and the world model.

Real components: optimizer/forecast_adapter.py and optimizer/world_adapter.py; tests use fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import polars as pl

from schemas.forecast import DisturbanceForecast, PredictedOutcome
from schemas.plan import BatchAdmission, Plan
from schemas.policy import History, Observations, PolicyContext
from worldmodel.horizon import Horizon, HorizonSpec
from worldmodel.servingmodel import ServingModel


class ForecastProvider(Protocol):
    """Forecasts the disturbances of the coming periods using only what was delivered by `as_of`."""

    def start(self, ctx: PolicyContext, history: History) -> None: ...

    def update(self, obs: Observations) -> None: ...

    def forecast(self, as_of: datetime, periods: int) -> tuple[DisturbanceForecast, ...]: ...


class WorldModelPort(Protocol):
    """The world model as the optimizer uses it: state updates and a read-only evaluator per decision."""

    def start(self, ctx: PolicyContext, history: History) -> None: ...

    def update(self, obs: Observations) -> None: ...

    def evaluator(self, as_of: datetime, forecast: DisturbanceForecast, in_force: Plan | None = None,
                  running: Plan | None = None, spread: bool = True) -> Callable[[Plan], PredictedOutcome]:
        """A read-only scorer of plans for the period starting at `as_of`; `in_force` is the plan whose floors
        hold replicas a new plan may release; `running` the plan the runtime runs now (its KV dtype and token
        budget: a plan changing them restarts the pool); `spread` False scores the point forecast alone (the
        point figures stand for the bounds)."""
        ...

    def horizon(self, as_of: datetime, forecasts: tuple[DisturbanceForecast, ...], spec: HorizonSpec,
                in_force: Plan | None = None, running: Plan | None = None,
                continuation: tuple[BatchAdmission, ...] = ()) -> Callable[[Plan], Horizon]:
        """Per plan, its predicted path held over the forecasts' horizon (worldmodel/horizon.py), deferrable work
        admitted after the first step by `continuation` (per forecast period; empty: the plan's own)."""
        ...

    def serving(self) -> ServingModel: ...

    def replicas(self, as_of: datetime) -> dict[tuple[str, str, str], int]:
        """Warm + loading replicas per (site, model, gpu) as of `as_of` ({} when unknown)."""
        ...

    def waiting(self, as_of: datetime) -> dict[tuple[str, str, str], float]:
        """Sequences waiting per (site, model, gpu) over the minute before `as_of` (count: mean per warm replica x
        warm replicas; {} when unknown)."""
        ...

    def prices(self, market: str, as_of: datetime) -> pl.DataFrame:
        """`market`'s price records published by `as_of` (interval_start, lmp_usd_mwh $/MWh), by interval: the
        one price store the policy reads (the world state's)."""
        ...
