"""Per-replica throughput, power and KV capacity of a pool plan, from the planner's serving model.

Candidate generation and the capacity gate need cheap per-replica figures; they come from the world
model's own analytical serving model (worldmodel/servingmodel.py, with the correction factors its
self-calibration fits), never from the ground truth. Scoring is the forward model's job, not this module's.
"""

from __future__ import annotations

from schemas.plan import PoolPlan
from worldmodel.servingmodel import GPU_SPECS, PoolConfig, ServingModel

#: Share of busy time spent in prefill assumed for power at load (modeled).
PREFILL_SHARE = 0.2
#: The decode batch may only run as long as TPOT stays under this share of the SLO (modeled headroom).
TPOT_HEADROOM = 0.8


def pool_config(p: PoolPlan) -> PoolConfig:
    """The serving model's view of a pool plan."""
    return PoolConfig(p.gpu, p.model, p.tp, p.precision, float(p.sm_clock_mhz), p.kv_dtype)


def kv_sequences(sm: ServingModel, p: PoolPlan, context_tokens: float) -> float:
    """Sequences of `context_tokens` (tokens) whose KV cache fits beside the weights (count, 0 if the
    weights alone do not fit)."""
    return sm.kv_capacity_tokens(pool_config(p)) / max(context_tokens, 1.0)


def replica_rps(sm: ServingModel, p: PoolPlan, input_tokens: float, output_tokens: float,
                tpot_slo_s: float | None = None) -> float:
    """Sustainable requests/s of one replica.

    The decode batch is the largest <= max_batch that fits the KV cache at the mean resident context
    (input + half the output, tokens) and keeps TPOT under TPOT_HEADROOM x the SLO (s); each request costs
    its prefill plus its share of the decode iterations.
    """
    cfg = pool_config(p)
    ctx = input_tokens + 0.5 * output_tokens
    batch = float(min(p.max_batch, max(kv_sequences(sm, p, ctx), 1.0)))
    if tpot_slo_s is not None:
        while batch > 1.0 and sm.decode_step_s(cfg, batch, ctx) > TPOT_HEADROOM * tpot_slo_s:
            batch = max(1.0, batch * 0.8)
    decode_s = output_tokens * sm.decode_step_s(cfg, batch, ctx) / batch
    return 1.0 / (sm.prefill_s(cfg, input_tokens) + decode_s)


def replica_power_w(sm: ServingModel, p: PoolPlan, utilization: float) -> float:
    """IT power of one replica's GPUs (W) when busy `utilization` (0-1) of the time at a full batch."""
    act = sm.activity(utilization, PREFILL_SHARE, p.max_batch, p.max_batch)
    return p.tp * sm.gpu_power_w(p.gpu, p.sm_clock_mhz, act)


def idle_power_w(gpu: str) -> float:
    """Idle board power of one GPU (W)."""
    return GPU_SPECS[gpu].idle_w
