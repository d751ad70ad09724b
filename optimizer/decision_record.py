"""One audit record per decision, shaped per schemas/audit_record.v1.schema.json.

The decision id is sha256(policy|markets|period start) (the same formula as streams/decide.py), so a
decision re-made after a restart or in a replay keeps its key and the audit log keeps one row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from optimizer.audit_grid import AuditResult
from optimizer.fallback import Decision, Scored
from optimizer.objective import predicted_delta
from optimizer.search import SearchResult
from schemas.audit import decision_id
from schemas.forecast import DisturbanceForecast, Interval, PredictedOutcome
from schemas.plan import Plan
from schemas.timestamps import ts_to_wire
from worldmodel.snapshot import pool_name

#: Top candidates kept in the record (count).
TOP_N = 5


def outcome_dict(o: PredictedOutcome) -> dict[str, Any]:
    """A predicted outcome as plain JSON-able values (pool replicas keyed "site/model/gpu")."""
    d = asdict(o)
    d["pool_replicas"] = {pool_name(k): v for k, v in o.pool_replicas.items()}
    return d


def interval_dict(iv: Interval, confidence: float) -> dict[str, float]:
    return {"point": iv.point, "lo80": iv.lo80, "hi80": iv.hi80, "lo95": iv.lo95, "hi95": iv.hi95,
            "confidence": confidence}


def forecasts_dict(forecasts: Sequence[DisturbanceForecast]) -> dict[str, dict[str, float]]:
    """This period's forecasts by name: arrivals per class (requests/s) and price ($/MWh), plus the prices
    of the following periods (price_usd_mwh+k)."""
    if not forecasts:
        return {}
    f0 = forecasts[0]
    out = {f"arrivals_per_s.{d.request_class}": interval_dict(d.arrivals_per_s, f0.confidence)
           for d in f0.demand}
    out["price_usd_mwh"] = interval_dict(f0.price_usd_mwh, f0.confidence)
    for k, f in enumerate(forecasts[1:], start=1):
        out[f"price_usd_mwh+{k}"] = interval_dict(f.price_usd_mwh, f.confidence)
    return out


def candidate_dict(s: Scored) -> dict[str, Any]:
    return {"plan": s.plan.as_dict(), "predicted": outcome_dict(s.outcome), "score": s.score,
            "feasible": s.feasible, "gates": [g.as_dict() for g in s.gates]}


def build_record(
    *,
    policy: str,
    markets: Sequence[str],
    period_index: int,
    as_of: datetime,
    inputs: Mapping[str, Mapping[str, object]],
    forecasts: Sequence[DisturbanceForecast],
    decision: Decision,
    search: SearchResult | None,
    reference: Scored | None,
    audit: AuditResult | None,
    decision_ms: float,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the audit record of one decision.

    Parameters
    ----------
    policy, markets : who decided and for which market(s).
    period_index, as_of : the period decided for; it starts at the decision time `as_of` (UTC).
    inputs : named inputs and parameters, each with at least its provenance tag (Tagged.as_dict()).
    forecasts : this period's and the following periods' disturbance forecasts.
    decision : the chosen plan, its gates, fallback flag and reason, and on a Pareto fallback the candidate refused
        with its predicted gain over the reference (the record's `refused`).
    search : the search result (None when the confidence fallback skipped it).
    reference : the reference plan scored like a candidate (None if it could not be scored).
    audit : the regret audit (None when off).
    decision_ms : decision latency (ms), the audit excluded.
    extra : further keys (mode, search statistics, audit statistics).
    """
    chosen: Plan = decision.plan
    delta = None
    if reference is not None and decision.outcome is not None:
        delta = predicted_delta(decision.outcome, reference.outcome)
    rec: dict[str, Any] = {
        "schema_version": "1",
        "decision_id": decision_id(policy, markets, as_of),
        "policy": policy,
        "markets": list(markets),
        "period_index": period_index,
        "period_start": ts_to_wire(as_of),
        "as_of": ts_to_wire(as_of),
        "inputs": {k: dict(v) for k, v in inputs.items()},
        "forecasts": forecasts_dict(forecasts),
        "candidates_evaluated": search.evaluations if search else 0,
        "top_candidates": [candidate_dict(s) for s in (search.ranked[:TOP_N] if search else ())],
        "gates": [g.as_dict() for g in decision.gates],
        "chosen_plan": chosen.as_dict(),
        "chosen_predicted": outcome_dict(decision.outcome) if decision.outcome else None,
        "fallback": decision.fallback,
        "fallback_reason": decision.reason,
        "refused": {"plan": decision.refused[0].as_dict(), "predicted_gain": decision.refused[1]}
        if decision.refused else None,
        "reference_plan": reference.plan.as_dict() if reference else None,
        "predicted_delta": delta,
        "regret": audit.regret if audit else None,
        "decision_ms": decision_ms,
        "realized": None,
    }
    if audit is not None:
        rec["audit"] = {"grid_size": audit.grid_size, "feasible": audit.feasible,
                        "best_score": audit.best.score if audit.best else None,
                        "best_label": audit.best.plan.label if audit.best else None,
                        "chosen_score": audit.chosen_score}
    if search is not None:
        rec["search"] = {"evaluations": search.evaluations, "stop_reason": search.stop_reason,
                         "stages": search.stages}
    rec.update(extra or {})
    return rec
