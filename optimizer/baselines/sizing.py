"""Operator-side sizing helpers shared by the reference policies: demand from history aggregates and the
pools of a site. Uses only what an operator knows (history, SLAs, inventory), never the simulator."""

from __future__ import annotations

import math
from datetime import timedelta

import polars as pl

from schemas.fleet import DEFAULT_TP, SM_CLOCK_RANGE_MHZ, GpuType, Site, default_max_num_seqs
from schemas.plan import PoolPlan
from schemas.policy import PolicyContext
from worldmodel.servingmodel import PoolConfig, ServingModel

MODEL_OF_CLASS = {"code": "llama-3.1-8b", "chat": "llama-3.1-70b", "batch": "llama-3.1-70b"}
#: Preferred GPU type per model when scaling up (the deployed layout): H100 first (cheaper per token), A100 overflow.
PREFERRED_GPU = {"llama-3.1-8b": ("H100", "A100"), "llama-3.1-70b": ("H100", "A100")}


def rate_per_class(arrivals_per_minute: pl.DataFrame, last: timedelta | None = None) -> dict[str, float]:
    """Mean arrival rate per class (requests/s) over the whole history or its last `last`."""
    df = arrivals_per_minute
    if last is not None and df.height:
        cutoff = df["minute_at"].max() - last
        df = df.filter(pl.col("minute_at") > cutoff)
    if df.height == 0:
        return {}
    minutes = df["minute_at"].n_unique()
    out = df.group_by("request_class").agg(pl.col("requests").sum())
    return {r["request_class"]: r["requests"] / (60.0 * minutes) for r in out.iter_rows(named=True)}


def mean_sizes(size_quantiles: pl.DataFrame) -> dict[str, tuple[float, float]]:
    """Approximate mean (input, output) tokens per class over the history: mean of p50 and p90."""
    if size_quantiles.height == 0:
        return {}
    out = size_quantiles.group_by("request_class").agg(
        ((pl.col("input_tokens_p50") + pl.col("input_tokens_p90")) / 2).mean().alias("inp"),
        ((pl.col("output_tokens_p50") + pl.col("output_tokens_p90")) / 2).mean().alias("out"),
    )
    return {r["request_class"]: (float(r["inp"]), float(r["out"])) for r in out.iter_rows(named=True)}


def replicas_for(
    rates: dict[str, float],
    sizes: dict[str, tuple[float, float]],
    site: Site,
    *,
    max_batch: int | None,
    utilization: float,
    precision: str = "bf16",
) -> dict[str, int]:
    """Replicas per model on its preferred GPU type so that busy time stays at `utilization`.

    Per request the replica spends prefill_s(input) plus output x step_s(batch) / batch of decode time
    (continuous batching amortizes decode over the batch), from the operator's own serving model, at half
    the batch the replica can hold: the batch cap (None: the engine's default max_num_seqs for the GPU type)
    or the sequences whose KV fits at the class's mean context, whichever is smaller.
    """
    sm = ServingModel()
    busy: dict[str, float] = {}
    for cls, rate in rates.items():
        model = MODEL_OF_CLASS[cls]
        gpu = next(g for g in PREFERRED_GPU[model] if site.gpus(GpuType(g)) > 0)
        prec = precision if gpu == "H100" else "bf16"
        cfg = PoolConfig(gpu, model, DEFAULT_TP[(model, GpuType(gpu))], prec, SM_CLOCK_RANGE_MHZ[GpuType(gpu)][1])
        inp, out = sizes.get(cls, (1000.0, 200.0))
        cap = max_batch if max_batch is not None else default_max_num_seqs(gpu)
        batch = max(1.0, min(cap, sm.kv_capacity_tokens(cfg) / (inp + out / 2)) / 2)
        per_req = sm.prefill_s(cfg, inp) + out * sm.decode_step_s(cfg, batch, inp + out / 2) / batch
        busy[model] = busy.get(model, 0.0) + rate * per_req
    return {m: max(1, math.ceil(b / utilization)) for m, b in busy.items()}


def served_sites(ctx: PolicyContext) -> tuple[Site, ...]:
    """The sites of the markets this run serves (the fleet may list more)."""
    return tuple(ctx.fleet.site(m) for m in ctx.markets)


def split_rates(rates: dict[str, float], sites: tuple[Site, ...]) -> dict[str, float]:
    """Each site's even share of the demand (the as-deployed layout spreads load over its sites)."""
    return {c: r / max(1, len(sites)) for c, r in rates.items()}


def site_pools(
    site: Site,
    *,
    floors: dict[str, int],
    max_batch: int | None = None,
    precision: str = "bf16",
    clock: dict[str, int] | None = None,
) -> tuple[PoolPlan, ...]:
    """Pools for both models on every GPU type of the site, preferred type first.

    Each model's floor (replicas) goes on its preferred GPU type as far as that type's free GPUs allow and
    spills onto the next type; the small model (tightest TPOT SLO) is placed first. Ceilings are the whole
    inventory per type. max_batch None: the engine's default max_num_seqs for each pool's GPU type (vLLM V1:
    H100 1024, A100 256; schemas.fleet.VLLM_MAX_NUM_SEQS), the as-deployed batch cap.
    """
    free = {g.gpu: site.gpus(g.gpu) for g in site.groups}
    placed: dict[tuple[str, str], int] = {}
    for model in PREFERRED_GPU:  # the latency-tight small model first: its TPOT SLO needs the fast GPUs
        left = floors.get(model, 1)
        for gpu in (g for g in PREFERRED_GPU[model] if free.get(GpuType(g), 0) > 0):
            tp = DEFAULT_TP[(model, GpuType(gpu))]
            n = min(left, free[GpuType(gpu)] // tp)
            placed[(model, gpu)] = n
            free[GpuType(gpu)] -= n * tp
            left -= n
    pools = []
    for model, prefs in PREFERRED_GPU.items():
        for gpu in (g for g in prefs if site.gpus(GpuType(g)) > 0):
            tp = DEFAULT_TP[(model, GpuType(gpu))]
            mhz = (clock or {}).get(gpu, SM_CLOCK_RANGE_MHZ[GpuType(gpu)][1])
            prec = precision if gpu == "H100" else "bf16"
            floor = placed.get((model, gpu), 0)
            cap = max_batch if max_batch is not None else default_max_num_seqs(gpu)
            pools.append(PoolPlan(site.name, model, gpu, floor, site.gpus(GpuType(gpu)) // tp, tp, prec, cap, int(mhz)))
    return tuple(pools)
