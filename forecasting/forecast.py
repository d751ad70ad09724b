"""The frozen result every forecaster returns, and its conversion to the optimizer's boundary type."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from forecasting.store import from_us
from schemas.forecast import Interval


@dataclass(frozen=True, eq=False)
class Forecast:
    """Per-step point forecast with central 80% and 95% intervals.

    Parameters
    ----------
    step_at_us : start of each forecast step (microseconds since the epoch, UTC); length = horizon.
    step_s : step length (s).
    point, lo80, hi80, lo95, hi95 : per step, in the series' unit (requests/period, tokens, $/MWh, 0-1).
    known : per step, True when the value had already arrived (e.g. a published day-ahead price); such a
        step has a zero-width interval equal to the published value.
    confidence : 0-1; see docs/forecasting.md ("Confidence").
    model : the model that produced the forecast (the one chosen by rolling error, for the pool).
    as_of : the instant the forecast was made; it used only observations with arrived_at <= as_of.
    provenance : where the inputs came from (e.g. {"inputs": "observed", "last_event_at": ...}).
    oracle : True only for the oracle forecaster, which reads the realized future on purpose.
    """

    step_at_us: np.ndarray
    step_s: float
    point: np.ndarray
    lo80: np.ndarray
    hi80: np.ndarray
    lo95: np.ndarray
    hi95: np.ndarray
    known: np.ndarray
    confidence: float
    model: str
    as_of: datetime
    provenance: dict[str, str] = field(default_factory=dict)
    oracle: bool = False

    def __post_init__(self) -> None:
        n = len(self.step_at_us)
        for name in ("point", "lo80", "hi80", "lo95", "hi95", "known"):
            a = getattr(self, name)
            if len(a) != n:
                raise ValueError(f"{name} has {len(a)} steps, expected {n}")
            a.flags.writeable = False
        self.step_at_us.flags.writeable = False
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence {self.confidence} outside [0, 1]")

    def __len__(self) -> int:
        return len(self.step_at_us)

    def step_at(self, step: int) -> datetime:
        """Start of step `step` (0-based), UTC."""
        return from_us(int(self.step_at_us[step]))

    def to_interval(self, step: int) -> Interval:
        """The optimizer's `Interval` for step `step` (0-based), same unit as the series."""
        return Interval(
            point=float(self.point[step]), lo80=float(self.lo80[step]), hi80=float(self.hi80[step]),
            lo95=float(self.lo95[step]), hi95=float(self.hi95[step]),
        )

    def index_at(self, at_us: int) -> int:
        """Index of the step whose interval contains `at_us` (microseconds); ValueError when outside."""
        k = int((at_us - int(self.step_at_us[0])) // int(round(self.step_s * 1e6)))
        if not 0 <= k < len(self):
            raise ValueError("instant outside the forecast's steps")
        return k

    def scaled(self, factor: float) -> Forecast:
        """Same forecast with every value multiplied by `factor` > 0 (e.g. requests/period -> requests/s)."""
        if factor <= 0:
            raise ValueError("factor must be positive")
        return Forecast(
            self.step_at_us.copy(), self.step_s, self.point * factor, self.lo80 * factor, self.hi80 * factor,
            self.lo95 * factor, self.hi95 * factor, self.known.copy(), self.confidence, self.model,
            self.as_of, dict(self.provenance), self.oracle,
        )
