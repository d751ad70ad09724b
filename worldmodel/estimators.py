"""The residual estimators of self-calibration (worldmodel/selfcal.py): a mergeable exponentially weighted mean
and variance of log residuals, and the EWMA over periods of a class's learned TPOT tail shape."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EwmaStat:
    """Exponentially weighted mean and variance that merge (``+=``), river-style: ``update`` returns self.

    Parameters
    ----------
    alpha : weight of the newest sample (0-1); the effective sample size saturates at 1 / alpha.
    """

    alpha: float
    n: float = 0.0
    mean: float = 0.0
    var: float = 0.0

    def update(self, x: float) -> EwmaStat:
        """Learn one sample (the residual's units: log ratio, or rate for SLA)."""
        a = max(self.alpha, 1.0 / (self.n + 1.0))  # plain running mean until 1/alpha samples
        d = x - self.mean
        self.mean += a * d
        self.var = (1.0 - a) * (self.var + a * d * d)
        self.n = min(self.n + 1.0, 1.0 / self.alpha)
        return self

    def __iadd__(self, other: EwmaStat) -> EwmaStat:
        n = self.n + other.n
        if n <= 0.0:
            return self
        d = other.mean - self.mean
        mean = self.mean + d * other.n / n
        self.var = (self.n * self.var + other.n * other.var + d * d * self.n * other.n / n) / n
        self.mean, self.n = mean, n
        return self

    def get(self) -> float:
        """The mean."""
        return self.mean


@dataclass
class TailShape:
    """EWMA over periods of per-request TPOT / replica-median TPOT quantiles of one class.

    levels : quantile levels (0-1); alpha : weight of the newest period (0-1); ratios : current estimate
    (ratio, non-decreasing); n : periods learned (count).
    """

    levels: tuple[float, ...]
    alpha: float
    ratios: list[float] = field(default_factory=list)
    n: int = 0

    def update(self, ratios: tuple[float, ...]) -> None:
        """Learn one period's ratios at `levels`."""
        a = max(self.alpha, 1.0 / (self.n + 1.0))
        new = [max(float(r), 0.0) for r in ratios]
        self.ratios = new if not self.ratios else [(1 - a) * o + a * x for o, x in zip(self.ratios, new, strict=True)]
        for i in range(1, len(self.ratios)):  # keep quantiles ordered
            self.ratios[i] = max(self.ratios[i], self.ratios[i - 1])
        self.n += 1

    def table(self) -> tuple[tuple[float, float], ...]:
        """(level, ratio) pairs."""
        return tuple(zip(self.levels, self.ratios, strict=True))
