"""Decisions at period close: the policy behind a small `Decider` interface, and the audit record.

The worker calls `decide` once per control period with the observations its durable store holds for
that period (late records included and counted). The audit record is keyed by a stable decision id,
`decision_id(policy, markets, period_start)`, so a decision re-made after a crash is the same key and
the audit sink keeps one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import polars as pl

from schemas.audit import decision_id
from schemas.policy import History, Observations, Policy, PolicyContext
from schemas.records import frame_schema
from schemas.timestamps import ts_to_wire
from streams.ingest import IDEMPOTENCY_KEYS

OBSERVED_KINDS = tuple(IDEMPOTENCY_KEYS)


@dataclass(frozen=True)
class DecisionInput:
    """What one decision sees.

    period_index : the period decided for (its plan applies from `period_start`).
    period_start : start of that period (UTC); also the decision time `as_of`.
    observations : kind -> typed frame (schemas.records.frame_schema) of the records delivered since the
        previous decision; kinds without records may be absent.
    late_records : how many of them are late (their own period had closed) (count).
    """

    period_index: int
    period_start: datetime
    observations: dict[str, pl.DataFrame]
    late_records: int


class Decider(Protocol):
    """Makes one decision per period and returns its audit record (schemas/audit_record)."""

    def decide(self, inp: DecisionInput) -> dict[str, Any]: ...


def observation_frames(observations: dict[str, pl.DataFrame]) -> dict[str, pl.DataFrame]:
    """Typed frames per kind, every observed kind present (an empty frame of its schema where absent)."""
    return {kind: observations[kind] if kind in observations else pl.DataFrame(schema=frame_schema(kind))
            for kind in OBSERVED_KINDS}


class PolicyDecider:
    """A registered policy (schemas.policy) as a `Decider`.

    Parameters
    ----------
    policy : the policy; `start` is called before its first decision (also after a restart).
    ctx : static context (fleet, markets, window start = period 0 start, period length).
    history : the aggregates before the window.
    """

    def __init__(self, policy: Policy, ctx: PolicyContext, history: History) -> None:
        self.policy = policy
        self.ctx = ctx
        self.history = history
        self._started = False

    def decide(self, inp: DecisionInput) -> dict[str, Any]:
        if not self._started:
            first = self.policy.start(self.ctx, self.history)
            self._started = True
            if inp.period_index == 0:
                return self._audit(inp, first.as_dict())
        frames = observation_frames(inp.observations)
        obs = Observations(
            as_of=inp.period_start, period_index=inp.period_index, arrivals=frames["request_arrival"],
            completions=frames["request_completion"], telemetry=frames["gpu_telemetry"],
            fleet_events=frames["fleet_event"], prices=frames["price"],
        )
        return self._audit(inp, self.policy.plan(obs).as_dict())

    def _audit(self, inp: DecisionInput, plan: dict[str, Any]) -> dict[str, Any]:
        markets = tuple(self.ctx.markets)
        base: dict[str, Any] = {
            "schema_version": "1", "policy": self.policy.name, "markets": list(markets),
            "period_index": inp.period_index, "period_start": ts_to_wire(inp.period_start),
            "as_of": ts_to_wire(inp.period_start), "inputs": {}, "forecasts": {}, "candidates_evaluated": 0,
            "top_candidates": [], "gates": [], "chosen_plan": plan, "fallback": False,
            "fallback_reason": None, "reference_plan": None, "predicted_delta": None, "regret": None,
            "realized": None,
        }
        base.update(self.policy.last_decision() or {})
        base.update(
            decision_id=decision_id(self.policy.name, markets, inp.period_start),
            period_index=inp.period_index, period_start=ts_to_wire(inp.period_start),
            late_records=inp.late_records,
            observed={k: v.height for k, v in sorted(inp.observations.items()) if v.height},
        )
        return base
