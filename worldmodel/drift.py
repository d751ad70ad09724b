"""Drift detection of self-calibration (worldmodel/selfcal.py): a two-sided CUSUM on standardized residuals
and the alarm it raises."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass
class Cusum:
    """Two-sided CUSUM on standardized residuals. ``update(z)`` returns +1/-1 on an up/down alarm, else 0.

    Parameters
    ----------
    k : reference value (in standard deviations; half the shift to detect fastest).
    h : decision interval (standard deviations).
    """

    k: float = 0.5
    h: float = 10.0
    pos: float = 0.0
    neg: float = 0.0
    alarms: int = 0

    def update(self, z: float) -> int:
        """Add one standardized residual (standard deviations); the sums restart after an alarm."""
        self.pos = max(0.0, self.pos + z - self.k)
        self.neg = max(0.0, self.neg - z - self.k)
        fired = 1 if self.pos > self.h else -1 if self.neg > self.h else 0
        if fired:
            self.alarms += 1
            self.pos = self.neg = 0.0
        return fired


@dataclass(frozen=True)
class Alarm:
    """A CUSUM alarm: key, direction (+1 slower/higher, -1 faster/lower), shift (log units), time, samples."""

    key: tuple[str, str, str, str]
    direction: int
    shift: float
    at: datetime
    samples: int
