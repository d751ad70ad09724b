"""The runtime autoscaler's surges, priced for a plan that leaves it room (part of step 1 of worldmodel/forward.py).

Under load the runtime's autoscaler does not settle on the count placement.py sizes by throughput. A burst fills
the batch slots, requests wait, the backlog trigger (ceil(waiting / 5) replicas) fires and grows the model x2 or +4
replicas per 15 s tick up to its ceilings or the GPUs left; the new replicas load for the cold start (332 s for a
70B replica) and mostly serve a backlog that has drained by then; the idle fleet goes only once the 300 s
stabilization has passed. On the reference's plan this cycled about every 40 minutes in ERCOT
(benchmarks/reference_fleet_error.py: 42 GPUs jumping to 121, SLA-met falling to 0.68-0.80 in the burst).

After a surge, once the stabilization window has run from the scale-up's end, the autoscaler scales down to what
the load needs (`held_share`; placement.py used to hold every existing replica for the whole period, which
predicted the reference's fleet one period late on both edges of a surge).

A surge is a Poisson event at the model's observed surge rate (`FleetSnapshot.surge_rate_per_s`, from the
fleet's own replica starts); each takes every pool of the model to its reach (its ceiling, within the GPUs the
period's placement left free) for the load time plus the stabilization window. The expected GPU-seconds are
added to the period's GPU-hours, nodes and power (at idle: loading, or serving a drained backlog). The burst's
own SLA loss hits a plan whatever its ceiling (the surge's replicas serve nothing until loaded), so no SLA is
credited or charged here.
"""

from __future__ import annotations

import math

from schemas.plan import AUTOSCALER_STABILIZATION_S, AUTOSCALER_TOLERANCE, Plan
from worldmodel.queueing import Pool


def held_share(pools: list[Pool], need: float, kept: float, period_s: float) -> float:
    """Share of a period of `period_s` s (0-1) that one model's autoscaler still holds the `kept` replicas (count)
    above its throughput `need` (count, unrounded) before it scales down to the need.

    The runtime scales down once its utilization has stayed more than 10% under target for the stabilization
    window, which runs from when its last scale-up ended: the newest warm replica's age (`Pool.warm_age_s`); a
    scale-up still loading holds the whole period.

    >>> from schemas.plan import PoolPlan
    >>> from worldmodel.servingmodel import PoolConfig
    >>> pp = PoolPlan("s", "m", "H100", 1, 32, 4, "bf16", 256, 1980)
    >>> cfg = PoolConfig("H100", "m", 4, "bf16", 1980.0)
    >>> surged = Pool(pp, cfg, 30, 0, 332.0, (), 0.1, warm_age_s=120.0)  # ready 120 s ago, need 10 of 30
    >>> held_share([surged], 10.0, 30.0, 300.0), held_share([surged], 28.0, 30.0, 300.0)  # within 10%: kept
    (0.6, 1.0)
    """
    if kept <= 0 or need >= kept * (1.0 - AUTOSCALER_TOLERANCE):
        return 1.0
    if any(p.loading_left_s for p in pools):
        return 1.0
    age = min((p.warm_age_s for p in pools if p.current > 0), default=math.inf)
    return min(max(AUTOSCALER_STABILIZATION_S - age, 0.0) / period_s, 1.0)


def surge_gpu_s(plan: Plan, pools: list[Pool], counts: list[float], free: dict[tuple[str, str], float],
                rate_per_s: float, period_s: float) -> list[float]:
    """Expected GPU-seconds per pool of one model that its surges add over a period of `period_s` s (GPU-s).

    `counts`: the replicas placed per pool (count); `free`: GPUs left per (site, gpu type) after placement
    (count; read, not drawn down); `rate_per_s`: the model's surges per second (1/s). A static plan
    (autoscaling off) has no surge.

    >>> from schemas.plan import PoolPlan
    >>> from worldmodel.servingmodel import PoolConfig
    >>> pp = PoolPlan("s", "m", "H100", 1, 10, 4, "bf16", 256, 1980)
    >>> pool = Pool(pp, PoolConfig("H100", "m", 4, "bf16", 1980.0), 4, 0, 332.0, (), 0.1)
    >>> # 4 replicas fit the 16 GPUs left: 1/12 surge in 300 s x 632 s held x 16 GPUs
    >>> surge_gpu_s(Plan((pp,)), [pool], [4.0], {("s", "H100"): 16.0}, 1 / 3600, 300.0)
    [842.6666666666666]
    """
    if not plan.autoscale or rate_per_s <= 0.0:
        return [0.0] * len(pools)
    held_s = rate_per_s * period_s  # expected surges in the period
    out = []
    for p, n in zip(pools, counts, strict=True):
        tp = max(p.plan.tp, 1)
        room = free.get((p.plan.site, p.plan.gpu), math.inf) // tp
        reach = max(min(p.plan.replica_ceiling - n, room), 0.0)
        out.append(min(held_s * (p.load_s + AUTOSCALER_STABILIZATION_S), period_s) * reach * tp)
    return out
