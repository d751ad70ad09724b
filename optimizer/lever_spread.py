"""The lever spread: plans around a base plan, one lever moved at a time, both directions of capacity.

The same spread serves the planner's candidates (optimizer/candidates.py: capacity released as well as added)
and the ruler's hindsight arm and lever-error measurement (streams/replay/branching.py, benchmarks/
lever_error.py), so what the planner may propose and what the ruler branches are the same plans. The label
before the colon says who proposed it ("spread", "hindsight"); the name after it is the lever family's key in
optimizer/margins.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from schemas.fleet import PRECISIONS_BY_GPU, SM_CLOCK_RANGE_MHZ, GpuType
from schemas.plan import BatchAdmission, Plan, PoolPlan

#: plans of a spread (at least)
SPREAD_K = 16


def _pools(plan: Plan, f: Callable[[PoolPlan], PoolPlan]) -> Plan:
    return plan.with_pools(tuple(f(p) for p in plan.pools))


def _clock(p: PoolPlan, share: float) -> PoolPlan:
    lo, hi = SM_CLOCK_RANGE_MHZ[GpuType(p.gpu)]
    return replace(p, sm_clock_mhz=int(max(lo, round(hi * share))))


def _fp8(p: PoolPlan, kv: str) -> PoolPlan:
    if "fp8" not in PRECISIONS_BY_GPU[GpuType(p.gpu)]:
        return p
    return replace(p, precision="fp8", kv_dtype=kv)


def _same(a: Plan, b: Plan) -> bool:
    return replace(a, label="", notes=()) == replace(b, label="", notes=())


def lever_spread(
    base: Plan,
    references: dict[str, Plan],
    previous: Plan | None,
    live: dict[tuple[str, str, str], int],
    k_min: int = SPREAD_K,
    prefix: str = "spread",
) -> list[tuple[str, Plan]]:
    """The lever spread at one period: the references' plans, the previous committed plan, and a
    spread around `base` (production's plan for the period) over capacity floors and ceilings (relative to
    the live fleet), the autoscaler target, the batch cap, precision with KV dtype (fp8 on H100 only), the SM
    clock, deferral (batch admission) and the chunked-prefill token budget (a restart). Duplicates (equal but
    for the label) are dropped; at least k_min."""

    def n(p: PoolPlan) -> int:
        return live.get(p.key, 0)

    def cap(p: PoolPlan, v: int) -> int:
        return max(0, min(v, p.replica_ceiling))

    spread: list[tuple[str, Plan]] = [
        ("hold-fleet", _pools(base, lambda p: replace(p, replica_floor=cap(p, n(p))))),
        ("scale-out-25", _pools(base, lambda p: replace(p, replica_floor=cap(p, math.ceil(n(p) * 1.25))))),
        ("scale-out-50", _pools(base, lambda p: replace(p, replica_floor=cap(p, math.ceil(n(p) * 1.5))))),
        ("ceiling-live", _pools(base, lambda p: replace(p, replica_ceiling=max(p.replica_floor, n(p), 1)))),
        (
            "ceiling-75",
            _pools(base, lambda p: replace(p, replica_ceiling=max(p.replica_floor, math.floor(n(p) * 0.75), 1))),
        ),
        (
            "static-live",
            replace(_pools(base, lambda p: replace(p, replica_floor=n(p), replica_ceiling=n(p))), autoscale=False),
        ),
        ("target-0.6", replace(base, autoscale_target=0.6)),
        ("target-0.95", replace(base, autoscale_target=0.95)),
        ("batch-128", _pools(base, lambda p: replace(p, max_batch=128))),
        ("batch-512", _pools(base, lambda p: replace(p, max_batch=512))),
        ("fp8", _pools(base, lambda p: _fp8(p, "auto"))),
        ("fp8-kv-fp8", _pools(base, lambda p: _fp8(p, "fp8"))),
        ("clock-0.85", _pools(base, lambda p: _clock(p, 0.85))),
        ("clock-0.7", _pools(base, lambda p: _clock(p, 0.7))),
        ("defer-batch", replace(base, batch_admission=BatchAdmission.HOLD)),
        ("admit-batch", replace(base, batch_admission=BatchAdmission.IMMEDIATE)),
        ("tokens-2048", _pools(base, lambda p: replace(p, max_num_batched_tokens=2048))),
    ]
    pad: list[tuple[str, Plan]] = [
        ("target-0.7", replace(base, autoscale_target=0.7)),
        ("scale-out-100", _pools(base, lambda p: replace(p, replica_floor=cap(p, 2 * n(p))))),
        ("fp8-batch-512", _pools(base, lambda p: replace(_fp8(p, "auto"), max_batch=512))),
        ("clock-0.85-batch-512", _pools(base, lambda p: replace(_clock(p, 0.85), max_batch=512))),
        ("tokens-4096", _pools(base, lambda p: replace(p, max_num_batched_tokens=4096))),
    ]
    named = [(f"ref:{k}", v) for k, v in references.items()]
    if previous is not None:
        named.append(("previous", previous))
    out: list[tuple[str, Plan]] = []
    for label, plan in [*named, *spread, *pad]:
        if len(out) >= k_min and label in dict(pad):
            break
        if not any(_same(plan, q) for _, q in out):
            out.append((label, replace(plan, label=f"{prefix}: {label}")))
    return out
