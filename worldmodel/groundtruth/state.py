"""Array state of the simulator (numba-friendly named tuples of arrays).

Layout follows Vidur's split: requests and replicas are entities, the engine holds the event loop, the
dispatcher and autoscaler are the scheduler. Units: times in s since window start, tokens, W, MHz.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from schemas.fleet import GPU_INDEX, PRECISION_INDEX, KvCacheDtype, Precision, kv_cache_dtype
from worldmodel.physics import COEFF_FIELDS

#: Telemetry sample and power-accounting step (s): the engine samples every TEL_DT, the scaler averages over it.
TEL_DT = 10.0
#: Hard cap on sequences per replica (array width): vLLM V1's largest default max_num_seqs (1024, H100-class;
#: schemas.fleet.VLLM_MAX_NUM_SEQS), so the as-deployed engine is never truncated by the array.
MAX_BATCH = 1024
CACHE_SLOTS = 2048  # direct-mapped prefix-cache slots per replica (512-token blocks)
# Coefficient columns, in worldmodel.physics.COEFF_FIELDS order (StepCoefficients.as_array()).
N_COEF = len(COEFF_FIELDS)
C_BASE, C_SEQ, C_KV, C_PTOK, C_PATTN, C_KVCAP, C_LOAD, C_IDLE, C_MAXP, C_TOKENS = (
    COEFF_FIELDS.index(f)
    for f in ("base_s", "per_seq_s", "per_kv_token_s", "per_prefill_token_s", "per_prefill_attn_s",
              "kv_capacity_tokens", "weights_load_s", "idle_power_w", "max_power_w", "token_budget")
)  # fmt: skip

#: The KV-cache dtype's digit in a precision code (code = weights index + N_PRECISIONS x KV index).
KV_INDEX: dict[KvCacheDtype, int] = {KvCacheDtype.AUTO: 0, KvCacheDtype.FP8: 1}
N_PRECISIONS = len(PRECISION_INDEX)


def precision_code(precision: str, kv_dtype: str = "auto") -> int:
    """One integer per (weights, KV dtype) a replica is loaded with; a change of either reloads it.

    bf16 + auto = 0, fp8 + auto = 1 (the weight index, as before KV dtypes), fp8 + fp8 KV = 3.

    >>> precision_code("bf16"), precision_code("fp8"), precision_code("fp8", "fp8")
    (0, 1, 3)
    """
    return PRECISION_INDEX[Precision(precision)] + N_PRECISIONS * KV_INDEX[kv_cache_dtype(kv_dtype)]


def decode_precision(code: int) -> tuple[str, str]:
    """(weight precision, KV dtype) of a precision code.

    >>> decode_precision(3)
    ('fp8', 'fp8')
    """
    weights = next(str(p) for p, i in PRECISION_INDEX.items() if i == code % N_PRECISIONS)
    kv = next(str(k) for k, i in KV_INDEX.items() if i == code // N_PRECISIONS)
    return weights, kv


# replica states
OFF, LOADING, WARM, DRAINING = 0, 1, 2, 3
# fleet event kinds
EV_STARTED, EV_READY, EV_STOPPED, EV_RECONFIGURED = 0, 1, 2, 3
# batch admission
ADM_IMMEDIATE, ADM_PRESSURE, ADM_HOLD = 0, 1, 2
# routing
RT_PREFIX_LOAD, RT_LEAST_LOAD, RT_ROUND_ROBIN = 0, 1, 2


class Requests(NamedTuple):
    arrival: np.ndarray  # f8 s
    cls: np.ndarray  # i8 class index (0 code, 1 chat, 2 batch)
    model: np.ndarray  # i8 model index
    inp: np.ndarray  # i8 input tokens
    out: np.ndarray  # i8 output tokens (ground truth; the runtime never reads it before completion)
    deadline: np.ndarray  # f8 s (batch: deadline; interactive: arrival + TTFT SLO)
    pfx_off: np.ndarray  # i8 offset into pfx_blocks
    pfx_len: np.ndarray  # i8 number of prefix blocks
    pfx_blocks: np.ndarray  # i8 flat block ids
    allowed: np.ndarray  # i8 bitmask of the sites the tenant may run in (residency)
    # outcomes
    rep: np.ndarray  # i8 replica that served it (-1)
    dispatched: np.ndarray  # f8 s
    first: np.ndarray  # f8 s (nan)
    done: np.ndarray  # f8 s (nan)
    cached: np.ndarray  # i8 prefix tokens served from cache
    gen: np.ndarray  # i8 tokens generated so far
    prefill_left: np.ndarray  # i8 prompt tokens still to prefill
    preempted: np.ndarray  # i8 times preempted


class Replicas(NamedTuple):
    pool: np.ndarray  # i8
    state: np.ndarray  # i8
    ready_at: np.ndarray  # f8
    node: np.ndarray  # i8 first node index
    speed: np.ndarray  # f8 hidden per-node step-time multiplier
    thr_cmp: np.ndarray  # f8 compute-clock share under the site cap: min(f x thr, f_pl) / min(f, f_pl) (0-1]
    coef: np.ndarray  # f8 [R, N_COEF] at the replica's precision and clock
    prec: np.ndarray  # i8 precision code loaded (weights and KV dtype, `precision_code`)
    n: np.ndarray  # i8 sequences in the running set
    seqs: np.ndarray  # i8 [R, MAX_BATCH] request ids
    active: np.ndarray  # i8 [R, MAX_BATCH] 1 if part of the current iteration
    chunk: np.ndarray  # i8 [R, MAX_BATCH] prefill tokens scheduled this iteration
    kv: np.ndarray  # i8 KV tokens in use
    stepping: np.ndarray  # i8 1 while an iteration/jump is in flight
    step_start: np.ndarray  # f8
    step_end: np.ndarray  # f8
    jump_k: np.ndarray  # i8 decode steps in the current jump (0 = one mixed iteration)
    version: np.ndarray  # i8 invalidates stale heap events
    busy_mark: np.ndarray  # f8 busy time credited up to here
    busy_acc: np.ndarray  # f8 busy seconds in the current telemetry tick
    cache: np.ndarray  # i8 [R, CACHE_SLOTS] prefix block ids (-1 empty)
    started_at: np.ndarray  # f8
    gpu0: np.ndarray  # i8 first physical GPU index (-1 when off)
    step_cmp: np.ndarray  # f8 compute-bound (prefill) part of the current iteration (s)
    pfill_acc: np.ndarray  # f8 prefill compute seconds in the current telemetry tick
    pfill_util: np.ndarray  # f8 prefill compute share of the last tick (0-1)
    thr: np.ndarray  # f8 power-cap clock share of the replica's site (0.5-1)


class Hardware(NamedTuple):
    """Physical GPUs (node-major) and nodes of the site."""

    g_type: np.ndarray  # i8 GPU type index per GPU
    g_node: np.ndarray  # i8 node per GPU
    g_owner: np.ndarray  # i8 replica using the GPU (-1 free)
    g_site: np.ndarray  # i8 site per GPU
    node_speed: np.ndarray  # f8 hidden step-time multiplier per node (0.85-1.15)
    node_type: np.ndarray  # i8
    node_site: np.ndarray  # i8
    site_cap_w: np.ndarray  # f8 IT power cap per site (W)
    site_throttle: np.ndarray  # f8 clock share the site's power-cap controller allows (0.5-1)


class Pools(NamedTuple):
    model: np.ndarray  # i8
    gpu: np.ndarray  # i8
    tp: np.ndarray  # i8
    floor: np.ndarray  # i8
    ceil: np.ndarray  # i8
    max_batch: np.ndarray  # i8
    clock: np.ndarray  # f8 MHz planned
    clock_max: np.ndarray  # f8 MHz
    prec: np.ndarray  # i8 planned precision code (weights and KV dtype, `precision_code`)
    coef: np.ndarray  # f8 [P, N_COEF] at planned precision, KV dtype and clock
    priority: np.ndarray  # i8 lower = scaled up first
    slot_lo: np.ndarray  # i8 replica slot range [lo, hi)
    slot_hi: np.ndarray  # i8
    desired_hist: np.ndarray  # i8 [M x sites, 20] desired replicas per (model, site) over the last 300 s (15 s ticks)
    site: np.ndarray  # i8 site index
    clock_pl: np.ndarray  # f8 MHz clock the pool's GPU holds in compute-bound work under its power limit
    w_read_s: np.ndarray  # f8 s weight bytes per GPU / datasheet HBM bandwidth, at the planned precision


class Queues(NamedTuple):
    # interactive FIFO deques per model (ring buffers)
    iq: np.ndarray  # i8 [M, cap]
    ihead: np.ndarray  # i8 [M]
    itail: np.ndarray  # i8 [M]
    # deferrable heap per model keyed by deadline (EDF) or arrival (FCFS)
    bq: np.ndarray  # i8 [M, cap]
    bkey: np.ndarray  # f8 [M, cap]
    bn: np.ndarray  # i8 [M]


class Logs(NamedTuple):
    completed: np.ndarray  # i8 request ids in completion order
    n_completed: np.ndarray  # i8 [1]
    # telemetry per replica per 10 s tick
    tel_t: np.ndarray  # f8
    tel_rep: np.ndarray  # i8
    tel_power_w: np.ndarray  # f8 per GPU
    tel_util: np.ndarray  # f8 0-1
    tel_clock: np.ndarray  # f8 MHz effective
    tel_kv: np.ndarray  # f8 0-1
    tel_running: np.ndarray  # i8
    tel_waiting: np.ndarray  # i8
    tel_temp: np.ndarray  # f8 C
    tel_state: np.ndarray  # i8
    tel_gpu0: np.ndarray  # i8 first GPU of the replica when sampled (a replica may stop or move before it is read)
    n_tel: np.ndarray  # i8 [1]
    # fleet events
    ev_t: np.ndarray  # f8
    ev_rep: np.ndarray  # i8
    ev_kind: np.ndarray  # i8
    ev_gpu0: np.ndarray  # i8 first GPU of the replica at the event (-1 none)
    n_ev: np.ndarray  # i8 [1]
    # site accounting per telemetry tick
    site_t: np.ndarray  # f8
    site_it_w: np.ndarray  # f8 site IT power (W)
    site_gpus: np.ndarray  # f8 GPUs warm or loading
    site_gpus_loading: np.ndarray  # f8
    site_idx: np.ndarray  # i8 which site the row is for
    n_site: np.ndarray  # i8 [1]


# Mutable scalars live in two arrays, sf (float64) and si (int64), indexed by these constants.
MAX_MODELS = 8
# float scalars
S_NOW, S_NEXT_TEL, S_NEXT_AS, S_NODE_OVERHEAD_H100, S_NODE_OVERHEAD_A100 = range(5)
# S_TOKEN_BUDGET is unused: the token budget is per pool, by GPU type (coefficient column C_TOKENS)
S_GAMMA, S_TOKEN_BUDGET, S_RELEASE_MARGIN, S_AS_TARGET, S_LOAD_POWER_FRAC = range(5, 10)
# completed deferrable requests of model m: output tokens summed at S_DOUT_SUM + m, count at S_DOUT_N + m (the
# autoscaler's running mean of deferrable output length; read only after completion)
S_DOUT_SUM = 10
S_DOUT_N = S_DOUT_SUM + MAX_MODELS
# decode power activity = sf[S_DEC_0] + sf[S_DEC_SHIFT + g] + sf[S_DEC_BW] x HBM utilization + sf[S_DEC_BATCH] x batch
# feature, g the pool's GPU type index (worldmodel.physics.power.DECODE_POWER_FITS, by Physics.decode_power_fit)
S_DEC_0 = S_DOUT_N + MAX_MODELS
S_DEC_BW, S_DEC_BATCH, S_DEC_SHIFT = S_DEC_0 + 1, S_DEC_0 + 2, S_DEC_0 + 3
N_FSCALARS = S_DEC_SHIFT + len(GPU_INDEX)
# int scalars
S_ARR_PTR, S_ADMISSION, S_ROUTING, S_EDF, S_AUTOSCALE, S_HEAP_N, S_AS_TICK, S_N_SITES = range(8)
S_RR = 8  # round-robin pointer of model m at S_RR + m (one per model: a shared one skews the rotation)
S_SCALER_TRIGGER = S_RR + MAX_MODELS  # SCALER_V1 or SCALER_LEGACY (Physics.scaler_trigger)
S_DONE_PTR = S_SCALER_TRIGGER + 1  # completions already folded into the S_DOUT_* running mean
N_ISCALARS = S_DONE_PTR + 1
# autoscaler trigger semantics: vLLM V1 waiting gauge + deferrable slack trigger, or the old backlog trigger
SCALER_V1, SCALER_LEGACY = 0, 1


#: Logs fields holding integers (the rest are float64).
_INT_LOG_FIELDS = frozenset({
    "completed", "tel_rep", "tel_running", "tel_waiting", "tel_state", "tel_gpu0", "ev_rep", "ev_kind", "ev_gpu0",
    "site_idx",
})  # fmt: skip


def alloc_logs(n_requests: int, tel_cap: int, ev_cap: int, site_cap: int) -> Logs:
    """Empty logs: counters n_* of one element, the rest sized by their prefix's capacity."""
    size = {"tel_": tel_cap, "ev_": ev_cap, "site_": site_cap, "completed": n_requests, "n_": 1}
    arrays = {}
    for name in Logs._fields:
        n = next(v for k, v in size.items() if name.startswith(k))
        is_int = name.startswith("n_") or name in _INT_LOG_FIELDS
        arrays[name] = np.zeros(n, np.int64 if is_int else np.float64)
    return Logs(**arrays)
