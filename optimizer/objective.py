"""The ranking objective: risk-adjusted SLA-safe goodput per dollar (docs/optimizer.md defines it).

    score = (1 - rho) * gp/$ + rho * gp/$_lo

gp/$ = predicted SLA-met requests / predicted operator cost over the period (requests/$), and gp/$_lo its
lower bound from the forecast intervals (arrivals at their 80% upper bound, prices at theirs) widened by the
world model's risk band (drift detected by its calibration), both from the forward model's
PredictedOutcome. rho in [0, 1] is the risk aversion: 0 ranks on the point forecast, 1 on the pessimistic
bound. Switch costs (reloads on a precision change, cold starts) are in the predicted cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from worldmodel.forecast_types import PredictedOutcome


@dataclass(frozen=True)
class Objective:
    """Risk-adjusted gp/$ (requests/$). risk_aversion is rho (0-1).

    Examples
    --------
    >>> from worldmodel.forecast_types import PredictedOutcome
    >>> o = PredictedOutcome((), 1.0, 1.0, 1.0, 10.0, 10.0, 0, 0.0, 1.0, 1000.0, 100.0, 80.0)
    >>> Objective(0.5).score(o)
    90.0
    """

    risk_aversion: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.risk_aversion <= 1.0:
            raise ValueError("risk_aversion must lie in [0, 1]")

    def score(self, outcome: PredictedOutcome) -> float:
        """Risk-adjusted gp/$ of one predicted outcome (requests/$)."""
        lo = min(outcome.gp_per_dollar_lo, outcome.gp_per_dollar)
        return (1.0 - self.risk_aversion) * outcome.gp_per_dollar + self.risk_aversion * lo


def predicted_delta(chosen: PredictedOutcome, reference: PredictedOutcome) -> dict[str, float]:
    """Chosen minus reference: gp/$ (requests/$), cost ($), energy (kWh), GPU-hours, and violation rate per
    class (percentage points)."""
    out = {
        "gp_per_dollar": chosen.gp_per_dollar - reference.gp_per_dollar,
        "gp_per_dollar_rel": (chosen.gp_per_dollar - reference.gp_per_dollar) / reference.gp_per_dollar
        if reference.gp_per_dollar else 0.0,
        "cost_usd": chosen.cost_usd - reference.cost_usd,
        "energy_kwh": chosen.energy_kwh - reference.energy_kwh,
        "gpu_hours": chosen.gpu_hours - reference.gpu_hours,
    }
    ref = {c.request_class: c.violation_rate for c in reference.classes}
    for c in chosen.classes:
        out[f"violation_pp_{c.request_class}"] = 100.0 * (c.violation_rate - ref.get(c.request_class, 0.0))
    return out
