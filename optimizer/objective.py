"""The ranking objective: risk-adjusted SLA-safe goodput per dollar (docs/optimizer.md defines it).

Per period, with C = deferred work carried over (requests), S = SLA-met requests, K = cost ($) and
N = served requests, all from the forward model's PredictedOutcome:

    c_carry = (K / N) * ((1 - e) + e * pi)          cost of a carried request when it runs later ($), unless
                                                    the deferral LP priced it (its energy at the horizon's
                                                    price plus its GPU time: `carry_usd_per_request`)
    g       = (S + C) / (K + C * c_carry)            carry-adjusted gp/$ (requests/$)
    g_lo    = g * gp/$_lo / gp/$                     its pessimistic bound
    score   = (1 - rho) * g + rho * g_lo

e = energy share of K; pi = future_price_ratio, the mean risk-adjusted forecast price over the deferral
horizon / this period's. Carried deferrable work is counted as met (the deferral LP and the runtime keep it
within its deadline) and charged at what it will cost when it runs, so holding work is never free: without
the carry term a one-period score would reward deferring everything. gp/$_lo is the forward model's lower
bound from the forecast intervals and its risk band (drift found by self-calibration). rho in [0, 1] is the
risk aversion. Switch costs (reloads, cold starts) are in K. With C = 0, g is the plain predicted gp/$.
K is on the operator's cost basis (`cost_basis`, schemas/cost.py): rented (the GPU-hours held at the rental rate
+ energy) or owned (the whole fleet at its amortized rate + energy: capacity held costs only its energy); the
lower bound's haircut gp/$_lo / gp/$ is the forward model's, on either basis.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.cost import COST_BASES
from schemas.forecast import PredictedOutcome


@dataclass(frozen=True)
class Objective:
    """Risk-adjusted, carry-adjusted gp/$ (requests/$).

    risk_aversion : rho (0-1); future_price_ratio : pi (ratio, > 0); carry_usd_per_request : the deferral LP's
    cost of one carried deferrable request ($; None: the period's mean cost per request scaled by pi);
    cost_basis : "rented" or "owned", the basis the cost K is counted on.

    Examples
    --------
    >>> from dataclasses import replace
    >>> from schemas.forecast import PredictedOutcome
    >>> o = PredictedOutcome((), 1.0, 1.0, 1.0, 10.0, 10.0, 0, 0.0, 1.0, 1000.0, 100.0, 80.0)
    >>> Objective(0.5).score(o)
    90.0
    >>> Objective(0.5, cost_basis="owned").score(replace(o, cost_usd_owned=20.0))  # 1000 / $20, the same haircut
    45.0
    """

    risk_aversion: float = 0.5
    future_price_ratio: float = 1.0
    carry_usd_per_request: float | None = None
    cost_basis: str = "rented"

    def __post_init__(self) -> None:
        if not 0.0 <= self.risk_aversion <= 1.0:
            raise ValueError("risk_aversion must lie in [0, 1]")
        if self.cost_basis not in COST_BASES:
            raise ValueError(f"cost_basis {self.cost_basis!r} not in {COST_BASES}")

    def cost(self, o: PredictedOutcome) -> float:
        """The predicted cost K on the objective's basis ($)."""
        return o.cost_usd if self.cost_basis == "rented" else o.cost_usd_owned

    def gp(self, o: PredictedOutcome) -> float:
        """Carry-adjusted point gp/$, g (requests/$)."""
        carry = max(o.deferred_carryover, 0.0)
        k = self.cost(o)
        if carry == 0.0:
            return o.gp_per_dollar if self.cost_basis == "rented" else (o.sla_met / k if k > 0 else 0.0)
        served = sum(c.served for c in o.classes)
        e = o.energy_cost_usd / k if k else 0.0
        c_carry = (k / max(served, 1.0) * ((1.0 - e) + e * self.future_price_ratio)
                   if self.carry_usd_per_request is None else self.carry_usd_per_request)
        return (o.sla_met + carry) / (k + carry * c_carry)

    def score(self, o: PredictedOutcome) -> float:
        """(1 - rho) g + rho g_lo (requests/$)."""
        g = self.gp(o)
        haircut = min(o.gp_per_dollar_lo / o.gp_per_dollar, 1.0) if o.gp_per_dollar > 0 else 1.0
        return (1.0 - self.risk_aversion) * g + self.risk_aversion * g * haircut


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
