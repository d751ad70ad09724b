"""The hindsight arm and the realized-regret audit, both on counterfactual branches of the ground truth
(streams/replay/branching.py; definitions in docs/metrics.md "Counterfactual branching").

- `run_hindsight`: at each period, the drain's included, branch K >= 16 plans (the references' and the lead run's
  plans for that period, the previous committed plan, a spread over the levers around the lead's), commit the one
  of best value among those whose per-class violation rate stays within the lead's branch + 0.1 pp, go on. In the
  drain the branches' set is the backlog the arm carries (the requests open at the fork), so its drain is planned
  on its own state, not replayed from its lead's. The lead is the strongest run of the job (a replayed arm
  included), so the arm searches around the best plans known and its headroom is measured from them. It reads the
  realized future through the simulator: an oracle, never a deployable policy. It is not in the policy registry and
  `--policies` cannot select it; `aurelius replay --hindsight` runs it after the references of each job.
- `RegretAudit`: at >= 30 decisions of a run drawn by the workload seed, the comparison set (the
  references' plans for that period + the hindsight arm's K plans at the run's own state + the chosen
  plan) is branched; realized regret = (best value - chosen value) / |best value|.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimizer.lever_spread import lever_spread
from schemas.cost import CostConfig
from schemas.fleet import FleetSpec
from schemas.plan import Plan
from schemas.policy import History, Observations, Policy, PolicyContext
from streams.replay.branching import (
    DEFAULT_H,
    DEFAULT_K,
    DEFAULT_REPLICATES,
    DRAIN_CAP_S,
    DRAIN_STEP_S,
    ENGINE_FIELDS,
    NOISE_S,
    SCREEN_RESTART_TOP,
    SCREEN_TOP,
    SLA_SLACK,
    Branch,
    Comparison,
    arrival_periods,
    branch_mean,
    compare,
    live_replicas,
    null_variants,
    regret,
    sample_periods,
)
from streams.replay.driver import RunResult, run_replay
from streams.workload.builder import Workload
from worldmodel.groundtruth.runtime import Physics

HINDSIGHT = "hindsight"
#: the reference whose plans every branch continues under (closed loop through the runtime's autoscaler)
CONTINUATION = "production"


@dataclass(frozen=True)
class BranchSettings:
    """K candidates per period, H continuation periods, stage-2 width (and of it, restarts), noise replicates per
    branch, cost basis."""

    K: int = DEFAULT_K
    H: int = DEFAULT_H
    top: int = SCREEN_TOP
    restart_top: int = SCREEN_RESTART_TOP
    replicates: int = DEFAULT_REPLICATES
    basis: str = "rented"
    cost: CostConfig | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "K": self.K,
            "H": self.H,
            "screening": f"stage 1: every candidate over the decided period only (H = 0, no drain); stage 2: "
            f"the {self.top} best of stage 1, the {self.restart_top} best of it among the plans that restart an "
            f"engine (change {', '.join(ENGINE_FIELDS)} from the plan run the period before), production's plan "
            f"(the gate's baseline) and, for the regret audit, the chosen plan at H = {self.H} with the drain",
            "replicates": self.replicates,
            "noise": f"every stage-2 branch averaged over {self.replicates} noise replicates (arrivals not yet "
            f"arrived shifted later by under {NOISE_S * 1e3:.0f} ms, order kept; the realization left out; the "
            f"stage-1 screen on the first replicate; branching.py)"
            if self.replicates
            else "the realization alone",
            "continuation": f"{CONTINUATION}'s plans (the hindsight arm: its lead's), closed loop through the "
            f"runtime's autoscaler, at the decided plan's engine restart settings ({', '.join(ENGINE_FIELDS)})",
            "drain_step_s": DRAIN_STEP_S,
            "drain_cap_s": DRAIN_CAP_S,
            "sla_gate": f"per-class violation rate within production's branch + {SLA_SLACK * 100:.1f} pp",
            "cost_basis": self.basis,
        }


def g_star(references: dict[str, dict[str, Any]], basis: str) -> tuple[str, float]:
    """The strongest reference of a job and its gp/$ over the whole window on the cost basis (summaries)."""
    key = "gp_per_dollar_owned" if basis == "owned" else "gp_per_dollar"
    name = max(references, key=lambda n: references[n][key])
    return name, float(references[name][key])


def _plan_at(run: RunResult, k: int) -> Plan:
    """The plan `run` applied at period k (its last one past its end)."""
    if k in run.plan_by_period:
        return run.plan_by_period[k]
    return run.plan_by_period[max(run.plan_by_period)]


@dataclass
class _Context:
    """The branches' shared parts: the continuation and the spread's base are run `lead`'s plans
    (production for the regret audit, as defined; the hindsight arm's lead run for the arm)."""

    references: dict[str, RunResult]
    gstar: float
    period_s: float
    settings: BranchSettings
    lead: str = CONTINUATION

    def continuation(self, k: int) -> Callable[[int], Plan]:
        ref = self.references[self.lead]
        return lambda j: _plan_at(ref, k + j)

    def plans(self, run: RunResult, k: int) -> list[tuple[str, Plan]]:
        refs = {name: _plan_at(r, k) for name, r in self.references.items()}
        previous = run.plan_by_period.get(k - 1)
        return lever_spread(refs[self.lead], refs, previous, live_replicas(run), self.settings.K, prefix="hindsight")


class _Replayed(Policy):
    """A run's plans again, period by period (the hindsight arm's start; the plan its intercept replaces)."""

    name = HINDSIGHT

    def __init__(self, run: RunResult) -> None:
        self.run = run

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return _plan_at(self.run, 0)

    def plan(self, obs: Observations) -> Plan:
        return _plan_at(self.run, obs.period_index)


def run_hindsight(
    workload: Workload,
    fleet: FleetSpec,
    references: dict[str, RunResult],
    gstar: float,
    *,
    period_s: float = 300.0,
    physics: Physics | None = None,
    all_sites: bool = False,
    initial_replicas: dict[tuple[str, str, str], int] | None = None,
    settings: BranchSettings | None = None,
    on_period: Callable[[int], None] | None = None,
    start_from: str = CONTINUATION,
    **replay: Any,
) -> tuple[RunResult, list[dict[str, Any]]]:
    """The hindsight arm over the workload's window (module docstring); returns the run and its per-period
    choices. Period 0 is the start plan of run `start_from` in `references` (the lead: the job's strongest run,
    the fleet and engine configuration it starts the window with); every period's branches spread around the
    lead's plan, continue under its plans, and are gated against its branch (+0.1 pp per class); after the last
    arrival's period (the drain) it branches the same way, its set the requests still open (`drain` in a choice).
    replay: further run_replay arguments (window_s, grace_s), as the references were run."""
    if CONTINUATION not in references:
        raise ValueError("the hindsight arm needs the production reference's run (its continuation)")
    lead = references[start_from]
    settings = settings or BranchSettings()
    ctx = _Context(references, gstar, period_s, settings, lead=start_from)
    choices: list[dict[str, Any]] = []
    drain_from = arrival_periods(workload.requests["arrival_s"].to_numpy(), period_s)  # drain: from here

    def intercept(k: int, run: RunResult, plan: Plan) -> Plan:
        t = time.perf_counter()
        plans = ctx.plans(run, k)
        cmp = compare(run, plans, ctx.continuation(k), k * period_s, period_s, settings.H, gstar,
                      always=(f"ref:{start_from}",), top=settings.top, restart_top=settings.restart_top,
                      cost=settings.cost, basis=settings.basis, replicates=settings.replicates)  # fmt: skip
        label, best = cmp.best(gate=f"ref:{start_from}")
        choices.append({
            "period": k, "drain": k >= drain_from, "chosen": label,
            "value": best.value, "gp_per_dollar": best.gp_per_dollar, "requests": best.requests,
            "lead_value": cmp.full[f"ref:{start_from}"].value, "candidates": len(plans),
            "full": sorted(cmp.full), "wall_s": time.perf_counter() - t,
        })  # fmt: skip
        return dict(plans)[label]

    run = run_replay(workload, _Replayed(lead), fleet, period_s=period_s, physics=physics, on_period=on_period,
                     all_sites=all_sites, initial_replicas=initial_replicas, intercept=intercept, **replay)  # fmt: skip
    run.policy = HINDSIGHT
    return run, choices


@dataclass
class RegretAudit:
    """Realized regret of a run's decisions at the sampled periods: pass `intercept` to run_replay, then
    `attach` the results to the run's decision records (their `realized` field).

    floor: also the regret the same two-stage comparison gives the chosen plan against its null variants
    (`branching.null_variants`: plans with no real effect), at the same decisions and replicates: the metric's
    noise floor, what a decision scores when no alternative is truly better (the record's `realized.floor`)."""

    references: dict[str, RunResult]
    gstar: float
    period_s: float
    periods: int
    seed: int
    settings: BranchSettings = field(default_factory=BranchSettings)
    floor: bool = False
    realized: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: per audited period, whether its decision record says it fell back to the baseline's plan (`attach`)
    fell_back: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if CONTINUATION not in self.references:
            raise ValueError("realized regret needs the production reference's run (its continuation)")
        self.sample = set(sample_periods(self.periods, self.seed))
        self._ctx = _Context(self.references, self.gstar, self.period_s, self.settings)

    def intercept(self, k: int, run: RunResult, plan: Plan) -> Plan:
        if k not in self.sample:
            return plan
        t = time.perf_counter()
        self.realized[k], cmp = self._outcome(run, k, [("chosen", plan), *self._ctx.plans(run, k)])
        if self.floor:  # the chosen plan's branches are the audit's own, not run again
            mine = Comparison({"chosen": cmp.screened["chosen"]}, {"chosen": cmp.full["chosen"]})
            self.realized[k]["floor"] = self._outcome(run, k, [("chosen", plan), *null_variants(plan)], mine)[0]
        refused = refused_candidate(run.decisions[-1] if run.decisions else None, k)
        if refused is not None and refused[0] != plan:  # beside the set, never in it: the regret is unchanged
            self.realized[k]["refused"] = self._refused(run, k, *refused, cmp.full["chosen"])
        self.realized[k]["wall_s"] = time.perf_counter() - t
        return plan

    def _outcome(self, run: RunResult, k: int, plans: list[tuple[str, Plan]],
                 known: Comparison | None = None) -> tuple[dict[str, Any], Comparison]:
        """The chosen plan's branch against the best of `plans` (two-stage, the chosen plan always at full H), and
        the comparison's branches."""
        s = self.settings
        cmp = compare(run, plans, self._ctx.continuation(k), k * self.period_s, self.period_s, s.H, self.gstar,
                      always=("chosen",), top=s.top, restart_top=s.restart_top, cost=s.cost, basis=s.basis,
                      replicates=s.replicates,
                      known=known)  # fmt: skip
        return {**realized_outcome(cmp), "set_size": len(plans), "H": s.H, "g_star": self.gstar}, cmp

    def _refused(self, run: RunResult, k: int, plan: Plan, predicted_gain: float | None,
                 chosen: Branch) -> dict[str, Any]:
        """The refused candidate's full branch (the chosen plan's settings and continuation) against the chosen's."""
        s = self.settings
        b = branch_mean(run, plan, self._ctx.continuation(k), k * self.period_s, self.period_s, s.H, self.gstar,
                        cost=s.cost, basis=s.basis, label="refused", replicates=s.replicates)  # fmt: skip
        return {"label": plan.label, "value": b.value, "gp_per_dollar": b.gp_per_dollar,
                "gain": b.gp_per_dollar / chosen.gp_per_dollar - 1.0 if chosen.gp_per_dollar > 0 else None,
                "predicted_gain": predicted_gain, "value_gap": b.value - chosen.value,
                "within_sla": b.passes(chosen), "branch": branch_terms(b)}  # fmt: skip

    def attach(self, run: RunResult) -> None:
        """Write each audited decision's outcome into its decision record's `realized` field."""
        for rec in run.decisions:
            k = rec.get("period_index")
            if k in self.realized:
                rec["realized"] = self.realized[k]
                if "fallback" in rec:
                    self.fell_back[k] = bool(rec["fallback"])

    def stats(self) -> dict[str, Any]:
        """regret_stats of the regrets, and of the value gap per request of the branch's set (`gap_per_request`,
        requests / request: the same ranking without the ratio's blow-up when |best value| is near 0); once
        `attach`ed to decision records that say whether they fell back, the same split into the decisions that
        committed the baseline's plan (`fallback`) and those that committed the planner's own (`planned`)."""
        out = _stats(list(self.realized.values()))
        out["sla_gated"] = _stats([r["sla_gated"] for r in self.realized.values()])
        if self.floor:
            out["floor"] = _stats([r["floor"] for r in self.realized.values()])
        if self.fell_back:
            for part, fell in (("fallback", True), ("planned", False)):
                out[part] = _stats([r for k, r in self.realized.items() if self.fell_back.get(k) is fell])
        refused = [refused_entry(k, r) for k, r in self.realized.items() if "refused" in r]
        if refused:
            out["refused"] = refused_summary(refused)
        return out


def refused_candidate(record: dict[str, Any] | None, k: int) -> tuple[Plan, float | None] | None:
    """The plan a fallback decision refused and its predicted gp/$ gain over the baseline's plan (ratio, as the
    Pareto gate measured both), from its record (period `k`'s, else None; the record's `refused`,
    optimizer/fallback.py). None when the decision did not fall back at the Pareto gate (it committed its own plan,
    or fell back before any candidate passed the hard gates: low forecast confidence, missing inputs, none
    feasible).

    >>> from schemas.plan import PoolPlan
    >>> p = Plan((PoolPlan("us-east", "llama-3.1-8b", "H100", 1, 4, 1, "fp8", 64, 1590),), label="c")
    >>> rec = {"period_index": 3, "fallback": True, "refused": {"plan": p.as_dict(), "predicted_gain": 0.01}}
    >>> plan, gain = refused_candidate(rec, 3)
    >>> plan == p, gain, refused_candidate(rec, 4), refused_candidate({**rec, "refused": None}, 3)
    (True, 0.01, None, None)
    """
    if not record or record.get("period_index") != k or not record.get("refused"):
        return None
    return Plan.from_dict(record["refused"]["plan"]), record["refused"].get("predicted_gain")


def refused_entry(k: int, r: dict[str, Any]) -> dict[str, Any]:
    """One audited fallback's refused candidate, as `refused_summary` pools it (gap per request: requests /
    request of the chosen branch's set)."""
    f = r["refused"]
    return {"period_index": k, "gain": f["gain"], "predicted_gain": f["predicted_gain"],
            "gap_per_request": f["value_gap"] / max(r["requests"], 1), "within_sla": f["within_sla"]}


def refused_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What the fallbacks' refused candidates would have realized against the baseline's plan each decision
    committed: regret_stats of the realized gp/$ gain (ratio), of the planner's predicted gain (ratio) and of the
    value gap per request (> 0: the refused plan was better by the regret's measure), and how many of them were
    better while keeping every class's violation rate within the chosen branch's + 0.1 pp (`better_within_sla`:
    decisions where falling back cost value). `entries` (`refused_entry`) pool over runs."""
    gains = [e["gain"] for e in entries if e["gain"] is not None]
    return {
        "n": len(entries),
        "realized_gain": regret_stats(gains),
        "predicted_gain": regret_stats([e["predicted_gain"] for e in entries if e["predicted_gain"] is not None]),
        "gap_per_request": regret_stats([e["gap_per_request"] for e in entries]),
        "better_within_sla": sum(1 for e in entries if e["gap_per_request"] > 0 and e["within_sla"]),
        "entries": entries,
    }


def realized_outcome(cmp: Comparison) -> dict[str, Any]:
    """The "chosen" branch of `cmp` against its best full branch: values (requests), gp/$ and the regret ratio;
    `sla_gated`, a diagnostic beside that regret of record: the same against the best among the branches whose
    every class's violation rate is within the chosen plan's + 0.1 pp (the Pareto gate's terms), which tells an
    alternative that buys value by missing SLAs the decision kept from one that beats it on both."""
    best_label, best = cmp.best()
    chosen = cmp.full["chosen"]
    gated_label, gated = cmp.best(gate="chosen")
    return {
        "value": chosen.value,
        "gp_per_dollar": chosen.gp_per_dollar,
        "best_value": best.value,
        "best_label": best_label,
        "best_gp_per_dollar": best.gp_per_dollar,
        "regret": regret(best.value, chosen.value),
        "value_gap": best.value - chosen.value,  # requests; beside the ratio, which |best| near 0 inflates
        "requests": chosen.requests,
        "sla_gated": {"best_label": gated_label, "regret": regret(gated.value, chosen.value),
                      "value_gap": gated.value - chosen.value, "requests": chosen.requests},
        "branches": {"chosen": branch_terms(chosen), "best": branch_terms(best)},
    }


def branch_terms(b: Branch) -> dict[str, Any]:
    """A branch's value terms, for asking in SQL why a decision's value fell short: SLA-met (requests of the
    set), served_after (requests), cost (USD), duration (s), unresolved (requests) and per-class violation rate."""
    return {"sla_met": b.sla_met, "served_after": b.served_after, "cost_usd": b.cost_usd,
            "duration_s": b.end_s - b.t0, "unresolved": b.unresolved, "violation": b.violation}


def _stats(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    return regret_summary([r["regret"] for r in outcomes], [r["value_gap"] / max(r["requests"], 1) for r in outcomes])


def regret_summary(regrets: list[float], gaps: list[float]) -> dict[str, Any]:
    """regret_stats of realized regrets with `gap_per_request`: mean, p50, p90, n and values of the value gaps
    per request (requests / request) of the same decisions."""
    out = regret_stats(regrets)
    g = regret_stats(gaps)
    out["gap_per_request"] = {k: g[k] for k in ("mean", "p50", "p90", "n", "values")}
    return out


def regret_stats(values: list[float]) -> dict[str, Any]:
    """mean, p50, p90, share > 0 and n of realized regrets (None figures when there are none)."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "share_positive": None, "n": 0, "values": []}
    return {
        "mean": float(v.mean()),
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "share_positive": float((v > 0).mean()),
        "n": int(v.size),
        "values": [float(x) for x in v],
    }


def hindsight_check(summaries: dict[str, dict[str, Any]], basis: str) -> dict[str, Any]:
    """hindsight >= every arm of the same run in gp/$ (on the basis); {"valid", "beaten_by"}."""
    key = "gp_per_dollar_owned" if basis == "owned" else "gp_per_dollar"
    h = summaries[HINDSIGHT][key]
    beaten = sorted(n for n, s in summaries.items() if n != HINDSIGHT and s[key] > h)
    return {"valid": not beaten, "beaten_by": beaten}
