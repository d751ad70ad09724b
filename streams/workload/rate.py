"""The arrival rate of protocol mode: the ServeGen m-large shape aligned to a market's local clock, scaled."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from schemas.availability import MARKET_TZ
from streams.datasets.servegen import aligned_rate

#: Rate grid step (s). The shape's knots sit on whole minutes, so the piecewise-linear rate is exact on it.
GRID_S = 60.0


@dataclass(frozen=True)
class RateProfile:
    """The scaled, clock-aligned arrival rate of one market, t = 0 at ``start``.

    Parameters
    ----------
    market : market whose local clock aligns the shape.
    start : t = 0 (UTC).
    scale : multiplier on the ServeGen shape (dimensionless).
    """

    market: str
    start: datetime
    scale: float = 1.0

    @classmethod
    def scaled(cls, market: str, start: datetime, expected_requests: float, window_s: float) -> RateProfile:
        """The profile whose expected count over [0, window_s] is ``expected_requests``."""
        return cls(market, start, expected_requests / cls(market, start).expected(0.0, window_s))

    def grid(self, t0_s: float, t1_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nodes (s), rate at nodes (req/s) and cumulative expected count at nodes over [t0_s, t1_s]."""
        nodes = np.unique(np.concatenate([np.arange(t0_s, t1_s, GRID_S), [t1_s]]))
        rate = self.scale * aligned_rate(MARKET_TZ[self.market], self.start, nodes)
        cum = np.concatenate([[0.0], np.cumsum(np.diff(nodes) * (rate[1:] + rate[:-1]) / 2)])
        return nodes, rate, cum

    def expected(self, t0_s: float, t1_s: float) -> float:
        """Expected arrivals in [t0_s, t1_s]."""
        return float(self.grid(t0_s, t1_s)[2][-1])

    def sample(self, span_s: float, gen: np.random.Generator) -> np.ndarray:
        """Sorted arrival times (s) in [0, span_s] of the non-homogeneous Poisson process."""
        nodes, rate, cum = self.grid(0.0, span_s)
        u = np.sort(gen.uniform(0.0, cum[-1], gen.poisson(cum[-1])))
        k = np.clip(np.searchsorted(cum, u, side="right") - 1, 0, nodes.size - 2)
        x = u - cum[k]
        slope = (rate[k + 1] - rate[k]) / (nodes[k + 1] - nodes[k])
        # solve cum_k + r_k dt + slope dt^2 / 2 = u for dt, in the form stable for slope -> 0
        root = np.sqrt(np.maximum(rate[k] ** 2 + 2 * slope * x, 0.0))
        denom = rate[k] + root
        dt = np.divide(2 * x, denom, out=np.zeros_like(x), where=denom > 0)
        return np.minimum(nodes[k] + dt, span_s)
