"""One pool's queueing and serving over a control period (steps 2-3 and the GPU power of step 5 in
worldmodel/forward.py): its static figures under a plan, a replica's throughput, the batch by Little's law, the
prompt-chunk and batch-slot waits before the first token, and the GPUs' power."""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.fleet import default_max_num_batched_tokens
from schemas.plan import Ordering, Plan, PoolPlan
from worldmodel.servingmodel import PoolConfig, ServingModel, clock_or_max
from worldmodel.snapshot import FleetSnapshot
from worldmodel.tails import chunk_mix

_RHO_MAX = 0.98


@dataclass(frozen=True)
class Pool:
    """Static per-pool figures of one plan against one snapshot."""

    plan: PoolPlan
    cfg: PoolConfig
    current: int  # warm + loading replicas now (count)
    reloads: int  # replicas reloading for a precision change (count)
    load_s: float
    loading_left_s: tuple[float, ...]
    chunk_s: float  # compute time of one full chunked-prefill budget (s)
    released: int = 0  # replicas held only by the in-force plan's floor that this plan's floor lets go (count)
    power_clock_mhz: float = 0.0  # the clock its power is drawn at: the plan's, capped by the observed (MHz)
    warm_age_s: float = math.inf  # since its last scale-up ended (s; snapshot.PoolState.warm_age_s)


@dataclass
class Load:
    """Demand offered to one model's pools: rates (req/s), mean sizes (tokens), size CV, backlog."""

    lam_i: float
    lam_b: float
    n_in: float
    n_out: float
    size_cv: float
    q0: float
    n_in_i: float = 0.0  # interactive prompts only: mean uncached tokens
    size_cv_i: float = 0.0  # and their size CV


@dataclass
class PoolResult:
    """One pool's period: replicas (count), rates (req/s), times (s), shares (0-1), batch (count), power (W)."""

    replicas: float
    serving: float
    mu: float
    lam: float
    tpot_s: float
    t_pf: float
    p_wait: float
    theta: float
    busy: float
    batch: float
    power_w: float
    fluid: tuple[float, float]  # (initial backlog, net growth rate) of the fluid queue (req, req/s)
    mixed: tuple[float, float, float] = (0.0, 0.0, 0.0)  # decode step (s), share of iterations carrying a
    # prefill chunk (0-1), the chunk's compute (s): per-request TPOT spread from chunked-prefill interference
    slot_wait: tuple[float, float] = (0.0, 1.0)  # P(waiting for a batch slot) (0-1), its mean wait if so (s)


def pool_static(sm: ServingModel, snap: FleetSnapshot, p: PoolPlan) -> Pool:
    """The static figures of pool plan `p` against `snap`: replicas now, reloads, load times (s), clock (MHz)."""
    cfg = PoolConfig(p.gpu, p.model, p.tp, p.precision, clock_or_max(p.gpu, p.sm_clock_mhz), p.kv_dtype)
    state = snap.pool(p.key)
    load_s = sm.load_s(cfg)
    chunk_s = sm.prefill_s(cfg, chunk_tokens_of(sm, p))
    if state is None:
        # no fleet state at all (nothing observed yet): the plan's floors are taken to be in place
        current = p.replica_floor if not snap.pools else 0
        return Pool(p, cfg, current, 0, load_s, (), chunk_s)
    left = tuple(max(load_s - e, 0.0) for e in state.loading_elapsed_s)
    args = snap.engine_args.get(p.key)
    restart = state.precision != p.precision or (args is not None and args != (p.kv_dtype, p.max_num_batched_tokens))
    reloads = state.warm + state.loading if restart else 0
    current = state.warm + state.loading
    released = max(min(current, snap.floors.get(p.key, 0)) - p.replica_floor, 0)
    # the power cap and heat hold the clock below the applied one; a lower plan clock runs cooler (untouched)
    throttled = state.clock_eff_mhz if state.clock_eff_mhz > 0 else cfg.sm_clock_mhz
    return Pool(p, cfg, current, reloads, load_s, left, chunk_s, released, min(cfg.sm_clock_mhz, throttled),
                state.warm_age_s)


def batch_cap(sm: ServingModel, p: Pool, ctx: float) -> float:
    """Sequences a replica of the pool can batch (count): its max_batch, at most what the KV cache holds at a
    resident context of `ctx` tokens, at least 1."""
    return max(min(p.plan.max_batch, sm.kv_capacity_tokens(p.cfg) / max(ctx, 1.0)), 1.0)


def util_per_request(sm: ServingModel, p: Pool, load: Load) -> float:
    """Replica-seconds of the autoscaler's metric one request adds (s): the runtime's utilization is batch
    slots held (running / max_batch) plus the share of time in prefill, so a request holds a slot for
    T_prefill + n_out x TPOT and the replica's compute for T_prefill (TPOT at the batch the target implies)."""
    ctx = load.n_in + load.n_out / 2.0
    t_pf = sm.prefill_s(p.cfg, load.n_in)
    t_dec = sm.decode_step_s(p.cfg, 0.8 * batch_cap(sm, p, ctx), ctx)
    return (t_pf + load.n_out * t_dec) / max(p.plan.max_batch, 1) + t_pf


def mu_replica(sm: ServingModel, p: Pool, load: Load) -> float:
    """Throughput of one replica at its full batch (req/s)."""
    ctx = load.n_in + load.n_out / 2.0
    b_cap = batch_cap(sm, p, ctx)
    t_pf = sm.prefill_s(p.cfg, load.n_in)
    return 1.0 / (t_pf + load.n_out * sm.decode_step_s(p.cfg, b_cap, ctx) / b_cap)


def serve_pool(
    sm: ServingModel,
    plan: Plan,
    p: Pool,
    n: float,
    serving: float,
    mu_r: float,
    lam: float,
    load: Load,
    q0: float,
    T: float,
) -> PoolResult:
    """One pool's period: n replicas of which `serving` serve on average (count; see
    `placement.serving_replicas`), `mu_r` a replica's throughput (req/s), `lam` its arrivals (req/s), `q0` its
    initial backlog (req), over a period of `T` s."""
    pp = p.plan
    if p.reloads > 0:  # the runtime reloads the whole pool at once: what arrives meanwhile queues
        q0 += lam * min(p.load_s, T) * min(p.reloads, n) / max(n, 1.0)
    loading = n - serving
    ctx = load.n_in + load.n_out / 2.0
    t_pf = sm.prefill_s(p.cfg, load.n_in)
    b_cap = batch_cap(sm, p, ctx)
    mu = serving * mu_r
    lam_r = min(lam, _RHO_MAX * mu) / serving if serving > 0 else 0.0
    rho_pf = min(lam_r * t_pf, _RHO_MAX)
    b = 1.0
    for _ in range(6):
        t_dec = sm.decode_step_s(p.cfg, b, ctx)
        b = min(max(lam_r * (t_pf + load.n_out * t_dec / (1.0 - rho_pf)), 1.0), b_cap)
    t_dec = sm.decode_step_s(p.cfg, b, ctx)
    chunk = chunk_tokens_of(sm, pp)
    chunks = load.n_in / chunk
    s = _prompt_service(sm, p.cfg, load.n_in, t_dec, chunk)
    # two places a request waits before its first token: the prompt-chunk queue of its replica, and, once
    # the batches are full, a batch slot (lam_r x residence / b_cap of them held; M/G/c with Sakasegawa's
    # P(wait) over the b_cap x replicas slots).
    # The chunk queue is one M/G/1 per replica: the router balances running sequences, which do not show a
    # replica's queued prompt chunks. As M/G/c over the pool's replicas (before) it put code's p99 TTFT at
    # 0.65x the realized on the 1 h imposed-action test once prompt sizes were gamma; per replica 0.94-1.04
    # (fp8, min clock, batch cap 32, observational PJM and ERCOT). Under EDF the batch prompts yield to
    # interactive deadlines at every chunk, so interactive prompts queue behind interactive prompts only.
    c = max(serving, 1.0)
    edf_on = plan.ordering == Ordering.EDF and load.lam_b > 0
    edf = (load.lam_i + 0.5 * load.lam_b) / (load.lam_i + load.lam_b) if edf_on else 1.0
    if edf_on:
        lam_q = lam_r * load.lam_i / (load.lam_i + load.lam_b)
        s_q = _prompt_service(sm, p.cfg, load.n_in_i, t_dec, chunk)
        cv_q = load.size_cv_i
    else:
        lam_q, s_q, cv_q = lam_r, s, load.size_cv
    rho = min(lam_q * s_q, _RHO_MAX)
    p_wait = rho
    theta = s_q * (1.0 + cv_q**2) / 2.0 / (1.0 - rho)
    residence = t_pf + load.n_out * t_dec / (1.0 - rho_pf)
    slots = b_cap * c
    rho_slot = min(lam_r * residence / b_cap * edf, _RHO_MAX)
    slot_wait = (_p_wait(rho_slot, slots), residence / (slots * (1.0 - rho_slot)))
    in_flight = lam_r * residence
    busy = 1.0 - math.exp(-in_flight)  # P(at least one sequence in flight), Poisson occupancy
    act = sm.activity_from_util(100.0 * busy)  # the proxy power is calibrated against (DCGM GPU_UTIL)
    clock = p.power_clock_mhz or p.cfg.sm_clock_mhz
    power = pp.tp * (serving * sm.gpu_power_w(pp.gpu, clock, act) + loading * sm.gpu_power_w(pp.gpu, clock, 0.1))
    # chunked prefill: lam_r x chunks/s iterations carry a chunk of compute c; the rest decode only
    mixed = chunk_mix(lam_r, t_pf, chunks, t_dec)
    return PoolResult(
        n,
        serving,
        mu,
        lam,
        t_dec + mixed[1] * mixed[2],
        s,
        p_wait,
        theta,
        busy,
        b,
        power,
        (q0, lam - mu),
        mixed,
        slot_wait,
    )


def _p_wait(rho: float, servers: float) -> float:
    """P(an arrival waits) in an M/G/c queue at utilization rho (0-1) with c servers (Sakasegawa 1977)."""
    return min(rho ** (math.sqrt(2.0 * (servers + 1.0)) - 1.0), 1.0) if rho > 0.0 else 0.0


def _prompt_service(sm: ServingModel, cfg: PoolConfig, n_in: float, t_dec: float, chunk: float) -> float:
    """A prompt's time in the chunk queue (s): its compute, and one decode step per chunk of `chunk` tokens
    (prefill is served in chunks that share iterations with decode)."""
    return sm.prefill_s(cfg, n_in) + max(1.0, n_in / chunk) * t_dec


def chunk_tokens_of(sm: ServingModel, p: PoolPlan) -> int:
    """Prefill tokens per iteration of pool plan `p` (tokens): the plan's budget, else the serving model's
    prior, else the engine's default on the GPU type (the operator's own serving configuration)."""
    if p.max_num_batched_tokens is not None:
        return p.max_num_batched_tokens
    return sm.priors.chunk_tokens or default_max_num_batched_tokens(p.gpu)
