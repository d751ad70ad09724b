"""Capacity MILP: warm replicas per pool against forecast demand, inventory, the site power cap and the
swap budget.

Variables n_p (integer replicas of pool p), d_p >= |n_p - prev_p| (replicas changed), s_m >= 0 (demand of
model m left unserved, requests/s):

    min   sum_p c_p n_p + M sum_m s_m + eps sum_p d_p
    s.t.  sum_{p serves m} u * r_p n_p + s_m >= D_m                        (demand with headroom)
          sum_{p at site s on gpu g} tp_p n_p <= G_{s,g}                   (GPU inventory)
          B_s + sum_{p at s} w_p n_p <= cap_s                              (site IT power cap)
          sum_p d_p <= swap_budget;  0 <= n_p <= N_p

c_p: cost of a replica-hour ($/h: GPU rental + energy at the risk-adjusted price); r_p: sustainable
requests/s of one replica at its config; u: target utilisation (headroom = 1 - u); w_p: power a busy replica
adds over idle (W); B_s: the site's idle power (W). Solved with HiGHS, time limit and MIP gap always set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from optimizer.solver import solve_highs

#: Penalty per request/s of unserved demand ($/h), far above any replica's hourly cost.
SHORTFALL_PENALTY_USD_H = 1.0e4


@dataclass(frozen=True)
class SizingPool:
    """One pool as the MILP sees it.

    key : (site, model, gpu); tp : GPUs per replica (count); rps : sustainable requests/s per replica;
    added_power_w : power one busy replica adds over idle (W); cost_usd_h : replica-hour cost ($/h);
    prev_replicas : replicas warm now (count); max_replicas : inventory bound (count).
    """

    key: tuple[str, str, str]
    tp: int
    rps: float
    added_power_w: float
    cost_usd_h: float
    prev_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class Sizing:
    """replicas per pool key (count), unserved demand per model (requests/s), solver status, and the
    replicas' cost (objective_usd_h, $/h)."""

    replicas: dict[tuple[str, str, str], int]
    shortfall_rps: dict[str, float]
    status: str
    objective_usd_h: float


class _Problem:
    """The capacity MILP (module docstring), built once per fleet structure with cvxpy Parameters.

    The structure (pools with their tp, models, the (site, gpu) inventories and sites with a power-bearing
    pool) fixes the constraint matrices; rps, costs, power, demand, inventory, caps, the previous fleet and
    the swap budget are Parameters, so cvxpy canonicalizes the problem once (DPP) and each of the ~8 sizings a
    decision runs costs only the HiGHS solve.
    """

    def __init__(
        self,
        keys: tuple[tuple[str, str, str], ...],
        tps: tuple[int, ...],
        models: tuple[str, ...],
        groups: tuple[tuple[str, str], ...],
        sites: tuple[str, ...],
    ) -> None:
        import cvxpy as cp  # lazy: cvxpy takes ~1 s to import; only the planner's solves need it

        n_p = len(keys)
        self.keys, self.models, self.groups, self.sites = keys, models, groups, sites
        self.n = cp.Variable(n_p, integer=True)
        d = cp.Variable(n_p, nonneg=True)
        self.s = cp.Variable(len(models), nonneg=True)
        self.ur = cp.Parameter(n_p, nonneg=True)
        self.cost = cp.Parameter(n_p)
        self.prev = cp.Parameter(n_p)
        self.maxr = cp.Parameter(n_p)
        self.demand = cp.Parameter(len(models))
        self.added_w = cp.Parameter(n_p, nonneg=True)
        self.headroom_w = cp.Parameter(len(sites))
        self.gpus = cp.Parameter(len(groups))
        self.budget = cp.Parameter()
        a_m = np.array([[1.0 if k[1] == m else 0.0 for k in keys] for m in models])
        cons = [
            self.n >= 0,
            self.n <= self.maxr,
            d >= self.n - self.prev,
            d >= self.prev - self.n,
            cp.sum(d) <= self.budget,
            a_m @ cp.multiply(self.ur, self.n) + self.s >= self.demand,
        ]
        if groups:
            a_g = np.array(
                [[float(tp) if (k[0], k[2]) == g else 0.0 for k, tp in zip(keys, tps, strict=True)] for g in groups]
            )
            cons.append(a_g @ self.n <= self.gpus)
        if sites:
            a_s = np.array([[1.0 if k[0] == site else 0.0 for k in keys] for site in sites])
            cons.append(a_s @ cp.multiply(self.added_w, self.n) <= self.headroom_w)
        obj = self.cost @ self.n + SHORTFALL_PENALTY_USD_H * cp.sum(self.s) + 1e-3 * cp.sum(d)
        self.problem = cp.Problem(cp.Minimize(obj), cons)

    def solve(
        self,
        pools: Sequence[SizingPool],
        demand_rps: Mapping[str, float],
        gpus: Mapping[tuple[str, str], int],
        power_cap_w: Mapping[str, float],
        base_power_w: Mapping[str, float],
        swap_budget: int,
        target_utilization: float,
        mip_gap: float,
    ) -> Sizing | None:
        import cvxpy as cp  # lazy: cvxpy takes ~1 s to import; only the planner's solves need it

        self.ur.value = np.array([max(target_utilization * p.rps, 0.0) for p in pools])
        self.cost.value = np.array([p.cost_usd_h for p in pools])
        self.prev.value = np.array([float(p.prev_replicas) for p in pools])
        self.maxr.value = np.array([float(p.max_replicas) for p in pools])
        self.demand.value = np.array([float(demand_rps.get(m, 0.0)) for m in self.models])
        self.added_w.value = np.array([max(p.added_power_w, 0.0) for p in pools])
        self.headroom_w.value = np.array([power_cap_w[s] - base_power_w.get(s, 0.0) for s in self.sites])
        self.gpus.value = np.array([float(gpus[g]) for g in self.groups])
        self.budget.value = float(swap_budget)
        try:
            solve_highs(self.problem, mip_gap=mip_gap)
        except cp.error.SolverError:
            return None
        if self.n.value is None:
            return None
        reps = {p.key: int(round(float(v))) for p, v in zip(pools, self.n.value, strict=True)}
        short = {m: float(v) for m, v in zip(self.models, self.s.value, strict=True)}
        cost = float(np.array([p.cost_usd_h for p in pools]) @ np.array(list(reps.values()), dtype=float))
        return Sizing(reps, short, str(self.problem.status), cost)


_PROBLEMS: dict[tuple[object, ...], _Problem] = {}


def size_capacity(
    pools: Sequence[SizingPool],
    demand_rps: Mapping[str, float],
    gpus: Mapping[tuple[str, str], int],
    power_cap_w: Mapping[str, float],
    base_power_w: Mapping[str, float],
    swap_budget: int,
    target_utilization: float = 0.8,
    mip_gap: float = 1e-3,
) -> Sizing | None:
    """Solve the capacity MILP (module docstring) on a problem cached per fleet structure. None when
    infeasible (e.g. the swap budget cannot reach an inventory- and power-feasible fleet from the current one).

    Parameters
    ----------
    pools : candidate pools (only placements the caller allows: residency is applied before).
    demand_rps : forecast demand per model (requests/s), e.g. the 80% upper interval.
    gpus : GPUs per (site, gpu type) (count).
    power_cap_w, base_power_w : per site, IT power cap and idle power of the whole site (W).
    swap_budget : replicas that may change this period (count).
    target_utilization : u in the demand constraint (0-1).
    mip_gap : HiGHS's relative MIP gap (its work limits: optimizer/solver.py).

    Examples
    --------
    >>> p = [SizingPool(("s", "m", "H100"), 1, 10.0, 500.0, 3.0, 0, 8)]
    >>> size_capacity(p, {"m": 35.0}, {("s", "H100"): 8}, {"s": 1e5}, {"s": 0.0}, 8).replicas
    {('s', 'm', 'H100'): 5}
    """
    if not pools:
        return Sizing({}, {m: float(d) for m, d in demand_rps.items()}, "empty", 0.0)
    keys = tuple(p.key for p in pools)
    models = tuple(sorted({k[1] for k in keys} | set(demand_rps)))
    groups = tuple(g for g in gpus if any((k[0], k[2]) == g for k in keys))
    sites = tuple(
        s for s in power_cap_w if any(k[0] == s and p.added_power_w > 0 for k, p in zip(keys, pools, strict=True))
    )
    tps = tuple(p.tp for p in pools)
    struct = (keys, tps, models, groups, sites)
    prob = _PROBLEMS.get(struct)
    if prob is None:
        if len(_PROBLEMS) > 64:
            _PROBLEMS.clear()
        prob = _PROBLEMS[struct] = _Problem(*struct)
    return prob.solve(
        pools, demand_rps, gpus, power_cap_w, base_power_w, swap_budget, target_utilization, mip_gap
    )
