"""The runtime autoscaler's scale-down after a scale-up (part of step 1 of worldmodel/forward.py).

Under load the runtime's autoscaler does not settle on the count placement.py sizes by throughput. A burst fills
the batch slots, requests wait, the backlog trigger (ceil(waiting / 5) replicas) grows the model x2 or +4
replicas per 15 s tick up to its ceilings or the GPUs left; the new replicas load for the cold start (332 s for a
70B replica) and mostly serve a backlog that has drained by then; the idle fleet goes once the 300 s
stabilization window, run from the scale-up's end, has passed. On the reference's plan this cycled about every
40 minutes in ERCOT (benchmarks/reference_fleet_error.py: 42 GPUs jumping to 121 and back). placement.py used to
hold every existing replica for the whole period, which predicted the fleet one period late on the way down;
`held_share` says when the surplus goes.

The surge itself is not predicted: pricing surges at the fleet's observed rate into every plan that leaves the
autoscaler room (tried at 1c365cc-c772c0e) over-predicted what capping the ceilings saves by 7-10 pp of gp/$ on
the week-before hours, and the caps it chose raised chat violations by 1-11 pp (docs/worldmodel.md).
"""

from __future__ import annotations

import math

from worldmodel.queueing import Pool

#: The runtime autoscaler's scale-down stabilization window (s): a scale-down waits until the largest desired
#: count of the last 300 s allows it (Kubernetes HPA's default, as the runtime runs it; the ground truth's own
#: copy is worldmodel/groundtruth/scaler.py, which the planner never imports).
AUTOSCALER_STABILIZATION_S = 300.0
#: The runtime autoscaler's backlog trigger: ceil(waiting / this) replicas (KEDA's threshold on
#: vllm:num_requests_waiting, REFERENCES.md; the ground truth's copy is worldmodel/groundtruth/scaler.py).
AUTOSCALER_WAITING_PER_REPLICA = 5.0
#: The runtime autoscaler's tolerance: it leaves the count alone while its utilization is within +-10% of the
#: target (ratio).
AUTOSCALER_TOLERANCE = 0.1


def held_share(pools: list[Pool], need: float, kept: float, period_s: float) -> float:
    """Share of a period of `period_s` s (0-1) that one model's autoscaler still holds the `kept` replicas (count)
    above its throughput `need` (count, unrounded) before it scales down to the need.

    The runtime scales down once its utilization has stayed more than 10% under target for the stabilization
    window, which runs from when its last scale-up ended: the newest warm replica's age (`Pool.warm_age_s`); a
    scale-up still loading holds the whole period. Replicas that outlived the window are held: the runtime's own
    metric keeps them (releasing every replica above the throughput need predicted the settled reference 20-30%
    under its realized fleet in steady periods, f4d65c0).

    >>> from schemas.plan import PoolPlan
    >>> from worldmodel.servingmodel import PoolConfig
    >>> pp = PoolPlan("s", "m", "H100", 1, 32, 4, "bf16", 256, 1980)
    >>> cfg = PoolConfig("H100", "m", 4, "bf16", 1980.0)
    >>> surged = Pool(pp, cfg, 30, 0, 332.0, (), 0.1, warm_age_s=120.0)  # ready 120 s ago, need 10 of 30
    >>> held_share([surged], 10.0, 30.0, 300.0), held_share([surged], 28.0, 30.0, 300.0)  # within 10%: kept
    (0.6, 1.0)
    >>> from dataclasses import replace
    >>> held_share([replace(surged, warm_age_s=400.0)], 10.0, 30.0, 300.0)  # settled: the runtime keeps them
    1.0
    """
    if kept <= 0 or need >= kept * (1.0 - AUTOSCALER_TOLERANCE):
        return 1.0
    if any(p.loading_left_s for p in pools):
        return 1.0
    age = min((p.warm_age_s for p in pools if p.current > 0), default=math.inf)
    if age >= AUTOSCALER_STABILIZATION_S:  # the window has run and the replicas stayed: the runtime's own metric
        return 1.0  # (slots held, prefill share, KV) holds them, whatever the throughput need says
    return min((AUTOSCALER_STABILIZATION_S - age) / period_s, 1.0)
