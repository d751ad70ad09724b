"""Replicas per pool over a control period (step 1 of worldmodel/forward.py): the count the runtime's autoscaler
places within the plan's floors and ceilings and the GPUs of the inventory, and how many of them serve while
new replicas and reloads load."""

from __future__ import annotations

import math

from schemas.plan import Plan
from worldmodel.queueing import Pool
from worldmodel.transients import held_share


def place(
    plan: Plan, pools: list[Pool], mus: list[float], lam: float, free: dict[tuple[str, str], float],
    util_s: float = 0.0, period_s: float = 300.0,
) -> list[float]:
    """Replicas per pool of one model, as the runtime's autoscaler places them (count).

    The model's desired count is what keeps the replicas at the autoscale target (by throughput, and by the
    runtime's own metric: batch slots held plus prefill share, `util_s` per request), clamped to the plan's
    summed floor and ceiling. Scale-up is immediate. Scale-down waits out the 300 s stabilization window, run
    from the last scale-up's end: existing replicas more than 10% above the need go once it allows
    (`transients.held_share`; the count is then time-averaged over the period of `period_s` s), except those
    only the in-force plan's floor held (`snapshot.floors`) that this plan's floor lets go: the autoscaler's
    history of desired counts is taken before the floor clamp, so it releases them at once unless its own count
    needs them. Before, every existing replica was held for the whole period. Tried and measured
    worse: a half-period decay; scaling down to what the telemetry's running sequences per batch slot ask
    for (it misses the prefill share of the runtime's metric and predicted the reference's 8B pool to
    collapse to one replica); the same plus the GPU busy share (always 1.0 on a decoding 70B pool). The count
    is split floors first, then existing replicas, then growth in the plan's pool order, each pool
    within its ceiling and the GPUs left of its type (the inventory). The count is in replicas of the first
    pool: a replica of a slower pool counts for its throughput's share of one (the runtime's autoscaler adds
    replicas until the fleet's utilization is at its target, wherever they start): the A100s a 70B model
    spills onto when its H100s are full are no longer counted as if each served like an H100 (before
    2026-12-02; CAISO's 2023 window at 49 chat req/s: 6 A100s predicted then, 7 now). With several sites each site's
    autoscaler grows by its share of the load (the router spreads work by serving capacity): growth is split
    over the sites in proportion to the replicas they hold, what a site's ceilings refuse going to the rest.

    `mus`: a replica's throughput per pool (req/s); `lam`: the model's arrivals (req/s); `free`: GPUs left per
    (site, gpu type) (count), drawn down by what is placed.
    """
    floors = [p.plan.replica_floor for p in pools]
    mu_pref = mus[0] if mus else 0.0
    # a replica's share of the first pool's throughput (ratio): the autoscaler adds replicas until the fleet's
    # utilization is at its target, so a slower pool's replica counts for less of the desired capacity
    w = [m / mu_pref if mu_pref > 0 and m > 0 else 1.0 for m in mus]
    if plan.autoscale:
        exact = lam * max(1.0 / max(mu_pref, 1e-12), util_s) / plan.autoscale_target if lam > 0 else 0.0
        need = math.ceil(exact)
        kept = sum((p.current - p.released) * wk for p, wk in zip(pools, w, strict=True))
        if kept > need:  # the surplus goes once the stabilization window allows (time-averaged over the period)
            kept = need + (kept - need) * held_share(pools, exact, kept, period_s)
        desired = max(float(need), kept)
        desired = min(max(desired, sum(f * wk for f, wk in zip(floors, w, strict=True))),
                      sum(p.plan.replica_ceiling * wk for p, wk in zip(pools, w, strict=True)))
    else:
        desired = sum(f * wk for f, wk in zip(floors, w, strict=True))
    counts = [0.0] * len(pools)

    def grow(k: int, upto: float) -> None:
        nonlocal desired
        p = pools[k].plan
        room = free.get((p.site, p.gpu), math.inf) // max(p.tp, 1)  # a site not in the inventory: unbounded
        add = max(min(upto - counts[k], room, desired / w[k]), 0.0)
        counts[k] += add
        desired -= add * w[k]
        free[(p.site, p.gpu)] = free.get((p.site, p.gpu), math.inf) - add * p.tp

    for k in range(len(pools)):
        grow(k, floors[k])
    for k, p in enumerate(pools):  # existing replicas, in the plan's order (the runtime drains the last first)
        kept_k = max(p.current - p.released, floors[k])
        grow(k, min(p.plan.replica_ceiling, kept_k) if plan.autoscale else floors[k])
    if plan.autoscale:
        sites = list(dict.fromkeys(p.plan.site for p in pools))
        if len(sites) > 1:  # one autoscaler per site: each grows by its share of the load, so growth
            # follows the sites' present counts (equal when none has any); a site at its ceilings
            # leaves its share to the others (the router sends them what it cannot take)
            have = {s: sum(counts[k] for k, p in enumerate(pools) if p.plan.site == s) for s in sites}
            total = sum(have.values())
            growth = desired
            for s in sites:
                add = math.ceil(growth * (have[s] / total if total > 0 else 1.0 / len(sites)) - 1e-9)
                for k, p in enumerate(pools):
                    if p.plan.site == s and add > 0:
                        before = counts[k]
                        grow(k, min(p.plan.replica_ceiling, counts[k] + add))
                        add -= counts[k] - before
        for k, p in enumerate(pools):
            grow(k, p.plan.replica_ceiling)
    return counts


def serving_replicas(p: Pool, n: float, T: float) -> float:
    """Replicas of a pool serving on average over the period (count): n less the replica-seconds spent loading
    (new replicas, loads in flight, precision reloads) / T (s)."""
    starting = max(n - p.current, 0)
    lost = starting * min(p.load_s + 15.0, T) + sum(min(x, T) for x in p.loading_left_s)
    lost += min(p.reloads, n) * min(p.load_s, T)
    return max(n - lost / T, 0.0)
