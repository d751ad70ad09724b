"""The forward model's placement of one model's replicas over its pools (worldmodel/placement.py)."""

from __future__ import annotations

import pytest

from schemas.plan import Plan, PoolPlan
from worldmodel.placement import place
from worldmodel.queueing import Pool
from worldmodel.servingmodel import PoolConfig


def _pool(gpu: str, current: int, ceiling: int) -> Pool:
    pp = PoolPlan("s", "llama-3.1-70b", gpu, 1 if gpu == "H100" else 0, ceiling, 4, "bf16", 256, 1410)
    return Pool(pp, PoolConfig(gpu, "llama-3.1-70b", 4, "bf16", 1410.0), current, 0, 332.0, (), 0.1)


@pytest.mark.parametrize(("mu_a100", "a100"), [(2.0, 4.0), (1.0, 8.0), (0.5, 8.0)])
def test_a_slower_pool_gets_the_replicas_its_throughput_asks_for(mu_a100: float, a100: float):
    """16 req/s at target 0.8 asks for 10 H100 replicas of 2 req/s; the H100 pool holds 6, so 4 H100s' worth
    spills to A100s: 4 at an H100's speed, 8 at half of it, and still 8 (the inventory's 32 GPUs at TP 4) at a
    quarter."""
    pools = [_pool("H100", 6, 6), _pool("A100", 0, 16)]
    plan = Plan(tuple(p.plan for p in pools), autoscale_target=0.8)
    counts = place(plan, pools, [2.0, mu_a100], 16.0, {("s", "H100"): 24, ("s", "A100"): 32})
    assert counts == pytest.approx([6.0, a100])
