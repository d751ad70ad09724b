"""The independent regret audit: a full factorial grid of plans, scored beside the decision.

The grid is anchored on the reference plan and never uses the search's candidates or the MILP. Factors
(each applied to every pool at once): SM clock step (5) x max_batch (5) x capacity scale of the reference's
floor and ceiling (0.25, 0.5, 0.75, 1) x batch admission (3) x either precision (bf16, fp8; when some pool
may run fp8) or routing (prefix_load, least_load): 600 plans.

regret = (best feasible grid score - chosen score) / |best feasible grid score|, and 0 when the chosen plan
scores at least the best (or the grid has no feasible plan). "Feasible" means passing every hard gate.
The audit runs after the decision; its time is not part of decision latency.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from optimizer.fallback import Scored
from optimizer.levers import LeverSpace
from schemas.fleet import kv_dtype_for
from schemas.plan import BatchAdmission, Plan, PoolPlan, Routing

CAPACITY_SCALES: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
ADMISSIONS: tuple[BatchAdmission, ...] = (
    BatchAdmission.IMMEDIATE, BatchAdmission.PRESSURE, BatchAdmission.HOLD)


@dataclass(frozen=True)
class AuditResult:
    """grid_size, feasible (counts); best : best feasible grid plan (None if none); regret (ratio, >= 0)."""

    grid_size: int
    feasible: int
    best: Scored | None
    chosen_score: float
    regret: float


def audit_grid(reference: Plan, space: LeverSpace) -> list[Plan]:
    """The factorial grid (module docstring), in a fixed order.

    Parameters
    ----------
    reference : anchor plan (pools, tp, and the capacity the scales apply to).
    space : lever value sets (clock steps, batch steps, allowed precisions, inventory bounds).
    """
    n_clk = min(len(space.pool(p.key).clocks_mhz) for p in reference.pools)
    batches = space.pools[0].max_batches
    fp8_somewhere = any("fp8" in space.pool(p.key).precisions for p in reference.pools)
    last: tuple[object, ...] = ("bf16", "fp8") if fp8_somewhere else (Routing.PREFIX_LOAD, Routing.LEAST_LOAD)
    grid = []
    for level, batch, scale, adm, x in itertools.product(range(n_clk), batches, CAPACITY_SCALES, ADMISSIONS,
                                                         last):
        pools = tuple(_pool(p, space, level, batch, scale, x if fp8_somewhere else None)
                      for p in reference.pools)
        plan = replace(reference.with_pools(pools), batch_admission=adm,
                       routing=reference.routing if fp8_somewhere else Routing(str(x)),
                       label=f"grid c{level} b{batch} x{scale} {adm} {x}")
        grid.append(plan)
    return grid


def grid_size(reference: Plan, space: LeverSpace) -> int:
    """Size of the audit grid without building it (count)."""
    n_clk = min(len(space.pool(p.key).clocks_mhz) for p in reference.pools)
    return n_clk * len(space.pools[0].max_batches) * len(CAPACITY_SCALES) * len(ADMISSIONS) * 2


def run_audit(grid: list[Plan], score: Callable[[Plan], Scored], chosen_score: float) -> AuditResult:
    """Score every grid plan and compute the regret of `chosen_score` (requests/$)."""
    scored = [score(p) for p in grid]
    feasible = [s for s in scored if s.feasible]
    best = max(feasible, key=lambda s: s.score, default=None)
    return AuditResult(len(grid), len(feasible), best, chosen_score,
                       0.0 if best is None else regret(best.score, chosen_score))


def regret(best_score: float, chosen_score: float) -> float:
    """(best - chosen) / |best|, 0 when chosen >= best (ratio).

    Examples
    --------
    >>> regret(10.0, 9.0), regret(10.0, 11.0)
    (0.1, 0.0)
    """
    if chosen_score >= best_score or best_score == 0 or math.isinf(best_score):
        return 0.0
    return (best_score - chosen_score) / abs(best_score)


def _pool(p: PoolPlan, space: LeverSpace, level: int, batch: int, scale: float,
          precision: object | None) -> PoolPlan:
    lv = space.pool(p.key)
    floor = min(math.ceil(p.replica_floor * scale), lv.max_replicas)
    ceiling = max(min(math.ceil(p.replica_ceiling * scale), lv.max_replicas), floor)
    q = p.precision
    if precision is not None:
        keep = p.precision if p.precision in lv.precisions else lv.precisions[0]
        q = str(precision) if str(precision) in lv.precisions else keep
    return replace(p, sm_clock_mhz=lv.clocks_mhz[level], max_batch=batch, replica_floor=floor,
                   replica_ceiling=ceiling, precision=q, kv_dtype=kv_dtype_for(q, p.kv_dtype))
