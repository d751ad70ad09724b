"""The decision step after scoring: confidence fallback, hard gates, Pareto gate against the reference.

The deterministic safe default is the reference policy's plan for the same period. It is recommended,
flagged `fallback` with its reason, when an input the forecast or the world model needs has not arrived yet
(a fresh worker without history: no price, no GPU telemetry, no request arrivals), when forecast confidence is
below the threshold, when no candidate passes the hard gates, or when no feasible candidate passes the Pareto
gate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optimizer.gates import GateResult, pareto_gate
from optimizer.objective import Objective
from schemas.forecast import PredictedOutcome
from schemas.plan import Plan


@dataclass(frozen=True)
class Scored:
    """A candidate plan with its predicted outcome, score (requests/$) and hard-gate results."""

    plan: Plan
    outcome: PredictedOutcome
    score: float
    gates: tuple[GateResult, ...]

    @property
    def feasible(self) -> bool:
        return all(g.passed for g in self.gates)


@dataclass(frozen=True)
class Decision:
    """The recommended plan, whether it is the fallback and why, and the gate results behind it.

    refused : on a Pareto fallback, the candidate the gate compared first (the best-ranked that passed the hard
        gates) and its predicted gp/$ gain over the reference, as the gate measured both (carry-adjusted point
        gp/$, `Objective.gp`; ratio); the audit branches it in the ground truth (streams/replay/hindsight.py).
    """

    plan: Plan
    outcome: PredictedOutcome | None
    fallback: bool
    reason: str | None
    gates: tuple[GateResult, ...]
    refused: tuple[Plan, float | None] | None = None


def confidence_fallback(confidence: float, threshold: float) -> str | None:
    """The fallback reason when forecast confidence (0-1) is below `threshold` (0-1), else None.

    Examples
    --------
    >>> confidence_fallback(0.4, 0.6)
    'forecast confidence 0.40 < threshold 0.60'
    >>> confidence_fallback(0.9, 0.6) is None
    True
    """
    if confidence < threshold:
        return f"forecast confidence {confidence:.2f} < threshold {threshold:.2f}"
    return None


#: What a fresh start can lack (`missing_inputs`): the market's price, the fleet's GPU telemetry, request arrivals.
MISSING_PRICE = "no price has arrived for {market}"
MISSING_TELEMETRY = "no GPU telemetry has arrived"
MISSING_ARRIVALS = "no request has arrived"


def missing_inputs(market: str, *, price: bool, telemetry: bool, arrivals: bool) -> tuple[str, ...]:
    """What is missing, in words, given whether a price of `market`, GPU telemetry and request arrivals have
    been seen (history or delivered records); empty when nothing is.

    Examples
    --------
    >>> missing_inputs("CAISO", price=False, telemetry=False, arrivals=True)
    ('no price has arrived for CAISO', 'no GPU telemetry has arrived')
    >>> missing_inputs("PJM", price=True, telemetry=True, arrivals=True)
    ()
    """
    seen = ((price, MISSING_PRICE.format(market=market)), (telemetry, MISSING_TELEMETRY),
            (arrivals, MISSING_ARRIVALS))
    return tuple(what for ok, what in seen if not ok)


def missing_inputs_fallback(missing: Sequence[str]) -> str | None:
    """The fallback reason when inputs are missing (`missing_inputs`), else None: without them there is nothing to
    forecast or score, so the reference plan is recommended as is.

    Examples
    --------
    >>> missing_inputs_fallback(("no price has arrived for CAISO", "no GPU telemetry has arrived"))
    'missing inputs: no price has arrived for CAISO; no GPU telemetry has arrived'
    >>> missing_inputs_fallback(()) is None
    True
    """
    return f"missing inputs: {'; '.join(missing)}" if missing else None


def _no_worse_than_reference(s: Scored, reference: Scored, tolerance_pp: float) -> bool:
    """True when `s` fails only the SLA gate and no class is predicted worse than the reference plan by more than
    `tolerance_pp` (pp): when the reference itself breaks the budget, recommending it instead is no safer."""
    failed = [g.name for g in s.gates if not g.passed]
    if failed != ["sla"]:
        return False
    ref = {c.request_class: c.violation_rate for c in reference.outcome.classes}
    return all(100.0 * (c.violation_rate - ref.get(c.request_class, 0.0)) <= tolerance_pp + 1e-12
               for c in s.outcome.classes)


def decide(ranked: Sequence[Scored], reference: Scored, objective: Objective,
           tolerance_pp: float = 0.1, min_gain: float | Callable[[Plan], float] = 0.0) -> Decision:
    """Pick the best-scoring candidate that passes every hard gate and the Pareto gate; otherwise the
    reference plan, flagged fallback, with the reason (no feasible candidate, or the best feasible
    candidate's Pareto failure). A candidate failing only the SLA gate still competes when no class is
    predicted worse than the reference's by more than `tolerance_pp`: the reference breaks the budget too.

    Parameters
    ----------
    ranked : scored candidates, best first.
    reference : the reference policy's plan, scored and gated like a candidate.
    objective : the ranking objective (the Pareto gate compares point and risk-adjusted gp/$).
    tolerance_pp : allowed rise of any class's violation rate over the reference (percentage points).
    min_gain : predicted gp/$ gain over the reference a candidate needs (ratio), or per candidate plan (the
        per-lever margins, optimizer/margins.py).
    """
    feasible = [s for s in ranked if s.feasible or _no_worse_than_reference(s, reference, tolerance_pp)]
    if not feasible:
        worst = next((g for g in ranked[0].gates if not g.passed), None) if ranked else None
        why = f"{worst.name}: {worst.reason}" if worst else "no candidates"
        return Decision(reference.plan, reference.outcome, True,
                        f"no candidate passed the hard gates (best: {why})", reference.gates)
    first_failure: GateResult | None = None
    for s in feasible:
        margin = min_gain(s.plan) if callable(min_gain) else min_gain
        g = pareto_gate(s.outcome, reference.outcome, objective, tolerance_pp, margin)
        if g.passed:
            return Decision(s.plan, s.outcome, False, None, (*s.gates, g))
        first_failure = first_failure or g
    assert first_failure is not None
    g_ref = objective.gp(reference.outcome)
    gain = objective.gp(feasible[0].outcome) / g_ref - 1.0 if g_ref > 0 else None
    return Decision(reference.plan, reference.outcome, True, f"pareto: {first_failure.reason}",
                    (*reference.gates, first_failure), (feasible[0].plan, gain))
