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


def size_capacity(
    pools: Sequence[SizingPool],
    demand_rps: Mapping[str, float],
    gpus: Mapping[tuple[str, str], int],
    power_cap_w: Mapping[str, float],
    base_power_w: Mapping[str, float],
    swap_budget: int,
    target_utilization: float = 0.8,
    time_limit_s: float = 1.0,
    mip_gap: float = 1e-3,
) -> Sizing | None:
    """Solve the capacity MILP (module docstring). None when infeasible (e.g. the swap budget cannot reach
    an inventory- and power-feasible fleet from the current one).

    Parameters
    ----------
    pools : candidate pools (only placements the caller allows: residency is applied before).
    demand_rps : forecast demand per model (requests/s), e.g. the 80% upper interval.
    gpus : GPUs per (site, gpu type) (count).
    power_cap_w, base_power_w : per site, IT power cap and idle power of the whole site (W).
    swap_budget : replicas that may change this period (count).
    target_utilization : u in the demand constraint (0-1).
    time_limit_s, mip_gap : HiGHS time limit (s) and relative MIP gap.

    Examples
    --------
    >>> p = [SizingPool(("s", "m", "H100"), 1, 10.0, 500.0, 3.0, 0, 8)]
    >>> size_capacity(p, {"m": 35.0}, {("s", "H100"): 8}, {"s": 1e5}, {"s": 0.0}, 8).replicas
    {('s', 'm', 'H100'): 5}
    """
    import cvxpy as cp
    import numpy as np

    if not pools:
        return Sizing({}, {m: float(d) for m, d in demand_rps.items()}, "empty", 0.0)
    models = sorted({p.key[1] for p in pools} | set(demand_rps))
    n = cp.Variable(len(pools), integer=True)
    d = cp.Variable(len(pools), nonneg=True)
    s = cp.Variable(len(models), nonneg=True)
    prev = np.array([p.prev_replicas for p in pools], dtype=float)
    cons = [n >= 0, n <= np.array([p.max_replicas for p in pools]), d >= n - prev, d >= prev - n,
            cp.sum(d) <= swap_budget]
    for j, m in enumerate(models):
        r = np.array([target_utilization * p.rps if p.key[1] == m else 0.0 for p in pools])
        cons.append(r @ n + s[j] >= float(demand_rps.get(m, 0.0)))
    for (site, gpu), count in gpus.items():
        a = np.array([p.tp if (p.key[0], p.key[2]) == (site, gpu) else 0.0 for p in pools])
        if a.any():
            cons.append(a @ n <= count)
    for site, cap in power_cap_w.items():
        w = np.array([p.added_power_w if p.key[0] == site else 0.0 for p in pools])
        if w.any():
            cons.append(base_power_w.get(site, 0.0) + w @ n <= cap)
    cost = np.array([p.cost_usd_h for p in pools])
    obj = cost @ n + SHORTFALL_PENALTY_USD_H * cp.sum(s) + 1e-3 * cp.sum(d)
    prob = cp.Problem(cp.Minimize(obj), cons)
    solve_highs(prob, time_limit_s=time_limit_s, mip_gap=mip_gap)
    if n.value is None:
        return None
    reps = {p.key: int(round(float(v))) for p, v in zip(pools, n.value, strict=True)}
    short = {m: float(v) for m, v in zip(models, s.value, strict=True)}
    return Sizing(reps, short, str(prob.status), float(cost @ np.array(list(reps.values()))))
