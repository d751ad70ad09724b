"""Bounded coupled search.

1. Score every generated candidate (coupled bundles from candidates.py).
2. Clear decision: the best feasible candidate beats the runner-up by more than `close_margin` (relative)
   -> stop.
3. Close decision: coordinate moves (one lever one step, per pool) from the best `top_k` plans, over a lever
   set that widens in stages (clock, batch, precision -> + capacity, admission -> + routing). A stage is
   repeated while it improves the best score by more than `min_gain` (relative); the next stage starts when
   it does not. Stop when the last stage stops improving or the evaluation budget is spent.

The budget is min(max_evals, floor(grid_share x audit grid size)), so the search never uses more than
10% of the audit grid's evaluations by construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optimizer.fallback import Scored
from optimizer.levers import LeverSpace, neighbours, plan_key
from optimizer.plan import Plan

LEVER_STAGES: tuple[tuple[str, ...], ...] = (
    ("clock", "batch", "precision"),
    ("clock", "batch", "precision", "capacity", "admission"),
    ("clock", "batch", "precision", "capacity", "admission", "routing"),
)


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


def rank(scored: Sequence[Scored]) -> list[Scored]:
    """Feasible plans first, each group by score, best first (stable for ties)."""
    return sorted(scored, key=lambda s: (not s.feasible, -s.score))


def search(candidates: Sequence[Plan], score: Callable[[Plan], Scored], space: LeverSpace,
           cfg: SearchConfig, grid_size: int) -> SearchResult:
    """Run the bounded coupled search (module docstring).

    Parameters
    ----------
    candidates : generated plans, known-strong first (scored in this order until the budget ends).
    score : evaluates one plan: forward model, hard gates, objective.
    space : the lever value sets the coordinate moves stay inside.
    cfg : search settings.
    grid_size : the audit grid's size (count); caps the budget at cfg.grid_share of it.
    """
    budget = cfg.budget(grid_size)
    seen: dict[tuple[object, ...], Scored] = {}

    def run(plan: Plan) -> bool:
        k = plan_key(plan)
        if k in seen or len(seen) >= budget:
            return False
        seen[k] = score(plan)
        return True

    for c in candidates:
        run(c)
    if not cfg.expand:
        return SearchResult(tuple(rank(list(seen.values()))), len(seen), "no-expand", 0)
    if _clear(rank(list(seen.values())), cfg.close_margin):
        return SearchResult(tuple(rank(list(seen.values()))), len(seen), "clear", 0)
    stage, stages_run = 0, 0
    while stage < len(cfg.stages) and len(seen) < budget:
        ranked = rank(list(seen.values()))
        before = ranked[0].score
        stages_run += 1
        for s in ranked[: cfg.top_k]:
            for _, plan in neighbours(s.plan, space, cfg.stages[stage]):
                run(plan)
        after = rank(list(seen.values()))[0].score
        if not after > before + cfg.min_gain * abs(before):
            stage += 1
    reason = "budget" if len(seen) >= budget else "converged"
    return SearchResult(tuple(rank(list(seen.values()))), len(seen), reason, stages_run)


def _clear(ranked: Sequence[Scored], margin: float) -> bool:
    """True when the best feasible plan beats the runner-up by more than `margin` (relative)."""
    feasible = [s for s in ranked if s.feasible]
    if len(feasible) < 2:
        return len(feasible) == 1 and len(ranked) > 1
    best, second = feasible[0].score, feasible[1].score
    return best - second > margin * abs(best)
