"""Bounded coupled search.

1. Score every generated candidate (coupled bundles from candidates.py).
2. Clear decision: the best feasible candidate beats the runner-up by more than `close_margin` (relative)
   -> stop.
3. Close decision: cyclic coordinate ascent from each of the best `top_k` plans in turn. A coordinate is one
   lever of one pool (clock, batch, precision, capacity) or a plan-wide lever (admission, routing); along
   each, step while a step beats the current plan by more than `min_gain` (relative), then move on. Stages
   add coordinates (clock, batch, precision -> capacity, admission -> routing); when a stage improved, one
   more cycle over every coordinate so far runs. Stop when that is done or the evaluation budget is spent.
   A lever with a step gain of its own (`SearchConfig.step_gain`) steps only on a gain above it, and a plan
   one of its steps first reached with less is not ranked: the step is within the model's error for that
   lever (the planner sets the precision margin: a switch reloads, and switches inside it flapped). With a
   precision step gain and the plan in force given, a generated candidate that switches precision is scored
   beside its twin at the precision in force and ranked only if it beats the twin by that gain.

The budget is min(max_evals, floor(grid_share x audit grid size)), so the search never uses more than
10% of the audit grid's evaluations by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from optimizer.fallback import Scored
from optimizer.levers import LeverSpace, neighbours, plan_key
from optimizer.margins import families_moved
from schemas.plan import Plan

LEVER_STAGES: tuple[tuple[str, ...], ...] = (("clock", "batch", "precision"), ("admission", "capacity"),
                                             ("routing",))
PLAN_WIDE = ("admission", "routing")


@dataclass(frozen=True)
class SearchConfig:
    """close_margin, min_gain : relative score gaps (ratio); top_k : plans expanded per stage (count);
    max_evals : evaluation cap (count); grid_share : max share of the audit grid's evaluations (ratio);
    expand : False scores the candidates only (the fixed-grid ablation); stages : lever sets per stage."""

    close_margin: float = 0.02
    min_gain: float = 1e-4
    top_k: int = 2
    max_evals: int = 40
    grid_share: float = 0.10
    expand: bool = True
    stages: tuple[tuple[str, ...], ...] = LEVER_STAGES
    step_gain: Mapping[str, float] = field(default_factory=dict)

    def budget(self, grid_size: int) -> int:
        """Evaluations allowed (count), given the audit grid's size (count)."""
        return min(self.max_evals, math.floor(self.grid_share * grid_size))


@dataclass(frozen=True)
class SearchResult:
    """ranked : every evaluated plan, feasible first, then by score, best first; evaluations (count);
    stop_reason : "clear", "converged", "budget" or "no-expand"; stages : stages run (count)."""

    ranked: tuple[Scored, ...]
    evaluations: int
    stop_reason: str
    stages: int

    @property
    def best(self) -> Scored:
        return self.ranked[0]


def rank(scored: Sequence[Scored], reference: Plan | None = None) -> list[Scored]:
    """Feasible plans first, each group by score, best first; among equal scores the plan moving fewer lever
    families from `reference` first (a lever the model sees no value in stays where the reference has it),
    then in evaluation order.

    >>> from optimizer.fallback import Scored
    >>> from schemas.plan import BatchAdmission, PoolPlan
    >>> ref = Plan((PoolPlan("s", "m", "H100", 1, 8, 4, "bf16", 256, 1980),), label="reference")
    >>> moved = replace(ref, batch_admission=BatchAdmission.IMMEDIATE, label="immediate")
    >>> tied = [Scored(moved, None, 83.2, ()), Scored(ref, None, 83.2, ())]
    >>> [s.plan.label for s in rank(tied)], [s.plan.label for s in rank(tied, ref)]
    (['immediate', 'reference'], ['reference', 'immediate'])
    """
    def moved(s: Scored) -> int:
        return 0 if reference is None else len(families_moved(s.plan, reference))

    return sorted(scored, key=lambda s: (not s.feasible, -s.score, moved(s)))


def search(candidates: Sequence[Plan], score: Callable[[Plan], Scored], space: LeverSpace,
           cfg: SearchConfig, grid_size: int, reference: Plan | None = None,
           in_force: Plan | None = None) -> SearchResult:
    """Run the bounded coupled search (module docstring).

    Parameters
    ----------
    candidates : generated plans, known-strong first (scored in this order until the budget ends).
    score : evaluates one plan: forward model, hard gates, objective.
    space : the lever value sets the coordinate moves stay inside.
    cfg : search settings.
    grid_size : the audit grid's size (count); caps the budget at cfg.grid_share of it.
    reference : the plan ties are broken towards (`rank`); None: evaluation order alone.
    in_force : the plan in force; with a precision step gain, a candidate switching precision from it is scored
        beside its twin at the precision in force and not ranked unless it beats the twin by that gain.
    """
    budget = cfg.budget(grid_size)
    seen: dict[tuple[object, ...], Scored] = {}

    def run(plan: Plan) -> bool:
        k = plan_key(plan)
        if k in seen or len(seen) >= budget:
            return False
        seen[k] = score(plan)
        return True

    unearned: set[tuple[object, ...]] = set()  # plans whose precision switch is short of its step gain

    def ranked_now() -> list[Scored]:
        return rank([s for k, s in seen.items() if k not in unearned], reference)

    for c in candidates:
        run(c)
    gain = cfg.step_gain.get("precision")
    for c in list(seen.values()) if gain is not None and in_force is not None else ():
        twin = _without_switch(c.plan, in_force)
        if twin is None:
            continue
        run(twin)
        t = seen.get(plan_key(twin))
        if t is not None and not _better(c, t, gain):
            unearned.add(plan_key(c.plan))
    ranked = ranked_now()
    if not cfg.expand:
        return SearchResult(tuple(ranked), len(seen), "no-expand", 0)
    if _clear(ranked, cfg.close_margin):
        return SearchResult(tuple(ranked), len(seen), "clear", 0)
    stages_run = 0
    for start in ranked[: cfg.top_k]:
        current, so_far = start, ()
        for levers in cfg.stages:
            stages_run += 1
            so_far = (*so_far, *levers)
            before = current
            current = _cycle(current, levers, space, run, seen, cfg, unearned)
            if current is not before and len(so_far) > len(levers):
                current = _cycle(current, so_far, space, run, seen, cfg, unearned)
            if len(seen) >= budget:
                break
    reason = "budget" if len(seen) >= budget else "converged"
    return SearchResult(tuple(ranked_now()), len(seen), reason, stages_run)


def _cycle(current: Scored, levers: tuple[str, ...], space: LeverSpace, run: Callable[[Plan], bool],
           seen: dict[tuple[object, ...], Scored], cfg: SearchConfig, unearned: set[tuple[object, ...]]) -> Scored:
    """One pass of coordinate ascent over `levers`: plan-wide coordinates, then each pool's; a plan a step
    first reaches with a gain above min_gain but not above its lever's step gain joins `unearned`."""
    coords: list[tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]]] = [
        ((lv,), ()) for lv in levers if lv in PLAN_WIDE]
    coords += [((lv,), (p.key,)) for p in current.plan.pools for lv in levers if lv not in PLAN_WIDE]
    for lv, pools in coords:
        gain = cfg.step_gain.get(lv[0], cfg.min_gain)
        improved = True
        while improved:
            improved = False
            for move, plan in neighbours(current.plan, space, lv, pools):
                plan = replace(plan, label=f"{current.plan.label} > {move}")
                k = plan_key(plan)
                new = run(plan)
                if not new and k not in seen:
                    return current  # budget spent
                s = seen[k]
                if _better(s, current, gain):
                    current, improved = s, True
                    break
                if new and _better(s, current, cfg.min_gain):
                    unearned.add(k)
    return current


def _without_switch(plan: Plan, in_force: Plan) -> Plan | None:
    """`plan` with every pool's weights and KV dtype as `in_force` has them (no reload); None when it switches none."""
    was = {p.key: p for p in in_force.pools}
    pools = tuple(replace(p, precision=was[p.key].precision, kv_dtype=was[p.key].kv_dtype)
                  if p.key in was and (p.precision, p.kv_dtype) != (was[p.key].precision, was[p.key].kv_dtype) else p
                  for p in plan.pools)  # fmt: skip
    if pools == plan.pools:
        return None
    return replace(plan.with_pools(pools), label=f"{plan.label} at the precision in force")


def _better(a: Scored, b: Scored, min_gain: float) -> bool:
    """a beats b: feasible over infeasible, else a higher score by more than min_gain (relative)."""
    if a.feasible != b.feasible:
        return a.feasible
    return a.score > b.score + min_gain * abs(b.score)


def _clear(ranked: Sequence[Scored], margin: float) -> bool:
    """True when the best feasible plan beats the runner-up by more than `margin` (relative)."""
    feasible = [s for s in ranked if s.feasible]
    if len(feasible) < 2:
        return len(feasible) == 1 and len(ranked) > 1
    best, second = feasible[0].score, feasible[1].score
    return best - second > margin * abs(best)
