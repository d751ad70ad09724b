"""The Python side of the ground truth: build the site's arrays, apply a plan at each period boundary,
advance the compiled engine, and hand back what telemetry actually delivered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from schemas.fleet import (
    DEFAULT_TP,
    GPU_INDEX,
    GPUS_PER_NODE,
    SM_CLOCK_RANGE_MHZ,
    GpuType,
    Precision,
    Site,
    power_limited_clock_mhz,
)  # fmt: skip
from schemas.models import model_spec
from schemas.plan import BatchAdmission, Ordering, Plan, Routing
from schemas.protocol import CLASSES
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.engine import empty_heap, run_until
from worldmodel.groundtruth.reconfigure import reload_replica
from worldmodel.groundtruth.scaler import log_event, start_replica
from worldmodel.groundtruth.state import TEL_DT
from worldmodel.physics import node_overhead_w, step_coefficients
from worldmodel.physics.power import decode_power_fit
from worldmodel.physics.tables import gpu_spec

MODELS = ("llama-3.1-8b", "llama-3.1-70b")
_ROUTING = {
    Routing.PREFIX_LOAD: st.RT_PREFIX_LOAD,
    Routing.LEAST_LOAD: st.RT_LEAST_LOAD,
    Routing.ROUND_ROBIN: st.RT_ROUND_ROBIN,
}
_ADMISSION = {
    BatchAdmission.IMMEDIATE: st.ADM_IMMEDIATE,
    BatchAdmission.PRESSURE: st.ADM_PRESSURE,
    BatchAdmission.HOLD: st.ADM_HOLD,
}
#: Physics.scaler_trigger -> the compiled state's si[S_SCALER_TRIGGER]
SCALER_TRIGGERS = {"v1": st.SCALER_V1, "legacy": st.SCALER_LEGACY}


@dataclass(frozen=True)
class CoefficientCorrections:
    """Multiplicative corrections on the cited coefficients of the pools they match (1.0: the cited default).

    An operator calibration (streams/calibration.py) fits them to recorded completions and telemetry.
    prefill_scale multiplies the compute-bound step terms (per_prefill_token_s, per_prefill_attn_s; s),
    decode_scale the memory-bound ones (base_s, per_seq_s, per_kv_token_s; s), idle_power_scale the idle
    power (idle_power_w; W) and active_power_scale the dynamic range above idle (max_power_w - idle_power_w;
    W). model and gpu select the pools (None: every model, every GPU type).
    """

    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    idle_power_scale: float = 1.0
    active_power_scale: float = 1.0
    model: str | None = None
    gpu: str | None = None

    def matches(self, model: str, gpu: str) -> bool:
        """Whether these corrections apply to the pools of `model` on `gpu`."""
        return self.model in (None, model) and self.gpu in (None, gpu)

    def apply(self, row: np.ndarray) -> None:
        """Correct a coefficient row (worldmodel.physics.COEFF_FIELDS order) in place."""
        scales = (self.prefill_scale, self.decode_scale, self.idle_power_scale, self.active_power_scale)
        if min(scales) <= 0.0:
            raise ValueError(f"coefficient corrections must be > 0, got {scales}")
        row[[st.C_PTOK, st.C_PATTN]] *= self.prefill_scale
        row[[st.C_BASE, st.C_SEQ, st.C_KV]] *= self.decode_scale
        idle = row[st.C_IDLE]
        row[st.C_IDLE] = idle * self.idle_power_scale
        row[st.C_MAXP] = row[st.C_IDLE] + (row[st.C_MAXP] - idle) * self.active_power_scale


@dataclass(frozen=True)
class Physics:
    """Sensitivity knobs on the modeled figures (DESIGN.md: rerun with them varied)."""

    fp8_speedup_scale: float = 1.0
    clock_power_exponent: float = 2.2
    #: chunked-prefill tokens per iteration for every pool; None: vLLM V1's default per GPU type
    #: (schemas.fleet.VLLM_MAX_NUM_BATCHED_TOKENS: H100 8192, A100 2048)
    token_budget: int | None = None
    release_margin_s: float = 1200.0
    load_power_frac: float = 0.3
    cold_start_s: float | None = None  # replica start to ready (s); None: the cited default of the physics
    scaler_trigger: str = "v1"  # "v1": vLLM V1 waiting semantics + deferrable slack; "legacy": the old trigger
    #: decode power activity fit (worldmodel.physics.power.DECODE_POWER_FITS): "record", or "h100-measured" (the
    #: H100's intercept fitted to its measured batch-64 decode power; a sensitivity, docs/physics.md)
    decode_power_fit: str = "record"
    #: coefficient corrections fitted to an operator's records, applied in order to the pools each matches;
    #: empty: the cited coefficients
    corrections: tuple[CoefficientCorrections, ...] = ()
    #: every node's step-time multiplier (ratio), in node order (`node_order`): a float for all of them, a tuple
    #: per node, None for the hidden per-node variation (normal, sd 0.06, clipped to 0.85-1.15, by fleet seed).
    #: An operator's calibrated history sets its fitted per-node speeds relative to the pool factors, which hold
    #: the recorded fleet's mean (the hidden variation on top would count it twice).
    node_speed: float | tuple[float, ...] | None = None


def coef_row(
    model: str, gpu: str, tp: int, precision: str, clock_mhz: float, physics: Physics, kv_dtype: str = "auto",
    token_budget: int | None = None,
) -> np.ndarray:
    """Coefficient row in worldmodel.physics.COEFF_FIELDS order (the engine's state.C_* columns).

    With `physics.cold_start_s` set, every replica start (and precision reload) takes that many seconds instead
    of the cited default (worldmodel.physics.tables.weights_load_s). The token budget per iteration is the plan's
    `token_budget` where set, else `physics.token_budget` where set, else the GPU type's vLLM default. Each of
    `physics.corrections` matching (model, gpu) scales the step and power terms (`CoefficientCorrections`)."""
    c = step_coefficients(
        model, gpu, tp, precision, clock_mhz, kv_dtype=kv_dtype, fp8_speedup_scale=physics.fp8_speedup_scale
    )
    row = c.as_array()
    if physics.cold_start_s is not None:
        if physics.cold_start_s < 0:
            raise ValueError(f"cold_start_s must be >= 0, got {physics.cold_start_s}")
        row[st.C_LOAD] = physics.cold_start_s
    budget = token_budget if token_budget is not None else physics.token_budget
    if budget is not None:
        if budget < 1:
            raise ValueError(f"token budget must be >= 1 token, got {budget}")
        row[st.C_TOKENS] = budget
    for corr in physics.corrections:
        if corr.matches(model, gpu):
            corr.apply(row)
    return row


def weight_read_s(model: str, gpu: str, tp: int, precision: str) -> float:
    """Seconds to read one GPU's weight shard at the datasheet HBM bandwidth (the decode power model's u)."""
    return model_spec(model).weight_bytes(Precision(precision)) / tp / (gpu_spec(gpu).hbm_tb_s * 1e12)


def node_order(sites: tuple[Site, ...]) -> list[tuple[str, str]]:
    """(site name, GPU type) of every node, in the runtime's node order (sites, their groups, their nodes)."""
    return [(site.name, str(grp.gpu)) for site in sites for grp in site.groups for _ in range(grp.nodes)]


def _hardware(sites: tuple[Site, ...], fleet_seed: int,
              node_speed: float | tuple[float, ...] | None = None) -> st.Hardware:  # fmt: skip
    g_type, g_node, g_site, node_type, node_site = [], [], [], [], []
    node = 0
    for s, site in enumerate(sites):
        for grp in site.groups:
            for _ in range(grp.nodes):
                node_type.append(GPU_INDEX[GpuType(grp.gpu)])
                node_site.append(s)
                for _g in range(GPUS_PER_NODE):
                    g_type.append(GPU_INDEX[GpuType(grp.gpu)])
                    g_node.append(node)
                    g_site.append(s)
                node += 1
    rng = np.random.default_rng(fleet_seed)
    if node_speed is None:
        speed = np.clip(rng.normal(1.0, 0.06, node), 0.85, 1.15)
    elif isinstance(node_speed, tuple):
        if len(node_speed) != node:
            raise ValueError(f"node_speed has {len(node_speed)} speeds for {node} nodes")
        speed = np.array(node_speed, dtype=float)
    else:
        speed = np.full(node, float(node_speed))
    i8 = np.int64
    return st.Hardware(
        np.array(g_type, i8),
        np.array(g_node, i8),
        np.full(len(g_type), -1, i8),
        np.array(g_site, i8),
        speed,
        np.array(node_type, i8),
        np.array(node_site, i8),
        np.array([site.power_cap_w for site in sites]),
        np.ones(len(sites)),
    )


def _requests(requests: pl.DataFrame, sites: tuple[Site, ...]) -> st.Requests:
    n = requests.height
    i8 = np.int64
    arrival = requests["arrival_s"].to_numpy().astype(np.float64)
    cls = requests["request_class"].replace_strict({c: i for i, c in enumerate(CLASSES)}, return_dtype=pl.Int64)
    model = requests["model"].replace_strict({m: i for i, m in enumerate(MODELS)}, return_dtype=pl.Int64)
    cls, model = cls.to_numpy().astype(i8), model.to_numpy().astype(i8)
    ttft = requests["sla_ttft_ms"].fill_null(0.0).to_numpy() / 1000.0
    deadline = np.where(cls == 2, requests["deadline_s"].fill_null(0.0).to_numpy(), arrival + ttft)
    pfx_len = requests["prefix_block_ids"].list.len().to_numpy().astype(i8)
    pfx_off = np.concatenate([[0], np.cumsum(pfx_len)[:-1]]).astype(i8)
    blocks = requests["prefix_block_ids"].explode().drop_nulls().to_numpy().astype(i8)
    allowed = np.zeros(n, i8)
    for s, site in enumerate(sites):
        allowed |= requests["allowed_regions"].list.contains(site.region).to_numpy().astype(i8) << s
    return st.Requests(
        arrival, cls, model, requests["input_tokens"].to_numpy().astype(i8),
        requests["output_tokens"].to_numpy().astype(i8), deadline.astype(np.float64), pfx_off, pfx_len,
        blocks if blocks.size else np.zeros(1, i8), allowed,
        np.full(n, -1, i8), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan),
        np.zeros(n, i8), np.zeros(n, i8), np.zeros(n, i8), np.zeros(n, i8),
    )  # fmt: skip


class SiteRuntime:
    """One or more sites serving one request array under successive plans.

    With several sites (the three-site mode) every request may run at any site its tenant's allowed
    regions include; each site has its own power cap and is priced at its own market.

    Parameters
    ----------
    sites : the site inventory (GPU nodes, power cap in W), one Site or a tuple of them.
    requests : the workload frame (workload builder columns; output_tokens is ground truth only).
    physics : sensitivity knobs.
    fleet_seed : seed of the hidden per-node speed variation (the same hardware for every policy).
    """

    def __init__(
        self, sites: Site | tuple[Site, ...], requests: pl.DataFrame, physics: Physics | None = None,
        fleet_seed: int = 7,
    ):  # fmt: skip
        self.sites: tuple[Site, ...] = (sites,) if isinstance(sites, Site) else tuple(sites)
        self.physics = physics or Physics()
        self.requests = requests
        n = requests.height
        i8 = np.int64
        self.req = _requests(requests, self.sites)
        #: SLOs per request (s); inf where the class has none
        self.slo_ttft_s = requests["sla_ttft_ms"].fill_null(np.inf).to_numpy() / 1000.0
        self.slo_tpot_s = requests["sla_tpot_ms"].fill_null(np.inf).to_numpy() / 1000.0
        self.hw = _hardware(self.sites, fleet_seed, self.physics.node_speed)
        mdl_idx = {m: i for i, m in enumerate(MODELS)}
        #: pools as (site name, model, gpu type)
        self.pool_keys: list[tuple[str, str, str]] = [
            (site.name, m, g.gpu) for site in self.sites for m in MODELS for g in site.groups
        ]
        site_idx = {site.name: s for s, site in enumerate(self.sites)}
        n_pool = len(self.pool_keys)
        slot_lo, slot_hi, lo = [], [], 0
        for site_name, m, g in self.pool_keys:
            cap = self.sites[site_idx[site_name]].gpus(GpuType(g)) // DEFAULT_TP[(m, GpuType(g))]
            slot_lo.append(lo)
            slot_hi.append(lo + cap)
            lo += cap
        n_rep = lo
        self.pools = st.Pools(
            np.array([mdl_idx[m] for _, m, _ in self.pool_keys], i8),
            np.array([GPU_INDEX[GpuType(g)] for _, _, g in self.pool_keys], i8),
            np.array([DEFAULT_TP[(m, GpuType(g))] for _, m, g in self.pool_keys], i8),
            np.zeros(n_pool, i8), np.zeros(n_pool, i8), np.full(n_pool, 256, i8), np.zeros(n_pool),
            np.zeros(n_pool), np.zeros(n_pool, i8), np.zeros((n_pool, st.N_COEF)), np.arange(n_pool, dtype=i8),
            np.array(slot_lo, i8), np.array(slot_hi, i8), np.zeros((len(MODELS) * len(self.sites), 20), i8),
            np.array([site_idx[s] for s, _, _ in self.pool_keys], i8),
            np.array([power_limited_clock_mhz(g) for _, _, g in self.pool_keys]), np.zeros(n_pool),
        )  # fmt: skip
        rep_pool = np.zeros(n_rep, i8)
        for p in range(n_pool):
            rep_pool[slot_lo[p] : slot_hi[p]] = p
        mb = st.MAX_BATCH
        f8z, i8z = (lambda: np.zeros(n_rep)), (lambda: np.zeros(n_rep, i8))
        self.rep = st.Replicas(
            rep_pool, i8z(), f8z(), i8z(), np.ones(n_rep), np.ones(n_rep), np.zeros((n_rep, st.N_COEF)), i8z(), i8z(),
            np.zeros((n_rep, mb), i8), np.zeros((n_rep, mb), i8), np.zeros((n_rep, mb), i8), i8z(), i8z(),
            f8z(), f8z(), i8z(), i8z(), f8z(), f8z(), np.full((n_rep, st.CACHE_SLOTS), -1, i8), f8z(),
            np.full(n_rep, -1, i8), f8z(), f8z(), f8z(), np.ones(n_rep),
        )  # fmt: skip
        n_models = len(MODELS)
        self.q = st.Queues(
            np.zeros((n_models, max(n, 1) * 2), i8), np.full(n_models, n, i8), np.full(n_models, n, i8),
            np.zeros((n_models, max(n, 1)), i8), np.zeros((n_models, max(n, 1))), np.zeros(n_models, i8),
        )  # fmt: skip
        self.heap = empty_heap(1 << 21)
        self.logs = st.alloc_logs(n, n_rep * 64, 1 << 16, 4096)
        self.sf = np.zeros(st.N_FSCALARS)
        self.si = np.zeros(st.N_ISCALARS, i8)
        self.si[st.S_N_SITES] = len(self.sites)
        if self.physics.scaler_trigger not in SCALER_TRIGGERS:
            raise ValueError(f"scaler_trigger {self.physics.scaler_trigger!r}: one of {sorted(SCALER_TRIGGERS)}")
        self.si[st.S_SCALER_TRIGGER] = SCALER_TRIGGERS[self.physics.scaler_trigger]
        self.sf[st.S_NEXT_TEL] = 10.0
        self.sf[st.S_NEXT_AS] = 15.0
        self.sf[st.S_NODE_OVERHEAD_H100] = node_overhead_w("H100")
        self.sf[st.S_NODE_OVERHEAD_A100] = node_overhead_w("A100")
        self.sf[st.S_GAMMA] = self.physics.clock_power_exponent
        fit = decode_power_fit(self.physics.decode_power_fit)
        self.sf[[st.S_DEC_0, st.S_DEC_BW, st.S_DEC_BATCH]] = fit.c0, fit.c_bw, fit.c_batch
        self.sf[st.S_DEC_SHIFT : st.S_DEC_SHIFT + len(fit.shift)] = fit.shift
        self.sf[st.S_RELEASE_MARGIN] = self.physics.release_margin_s
        self.sf[st.S_LOAD_POWER_FRAC] = self.physics.load_power_frac
        self.plan: Plan | None = None

    @property
    def now(self) -> float:
        return float(self.sf[st.S_NOW])

    def apply_plan(self, plan: Plan, prewarm: bool = False) -> None:
        """Set the runtime's bounds from a plan. Clock and batch cap change at once; a change of weight
        precision, KV-cache dtype or token budget restarts the pool's replicas (engine arguments taken at start-up;
        their sequences are requeued; the precision code `state.precision_code` carries weights and KV). With
        prewarm, floors start warm."""
        t = self.now
        self.si[st.S_ROUTING] = _ROUTING[Routing(plan.routing)]
        self.si[st.S_ADMISSION] = _ADMISSION[BatchAdmission(plan.batch_admission)]
        self.si[st.S_EDF] = 1 if Ordering(plan.ordering) == Ordering.EDF else 0
        self.si[st.S_AUTOSCALE] = 1 if plan.autoscale else 0
        self.sf[st.S_AS_TARGET] = plan.autoscale_target
        for p, (site_name, m, g) in enumerate(self.pool_keys):
            try:
                pp = plan.pool(site_name, m, g)
            except KeyError:
                self.pools.floor[p] = 0
                self.pools.ceil[p] = 0
                continue
            prec = st.precision_code(pp.precision, pp.kv_dtype)
            self.pools.floor[p] = pp.replica_floor
            self.pools.ceil[p] = pp.replica_ceiling
            self.pools.max_batch[p] = min(pp.max_batch, st.MAX_BATCH)
            self.pools.clock[p] = pp.sm_clock_mhz
            self.pools.clock_max[p] = float(SM_CLOCK_RANGE_MHZ[GpuType(g)][1])
            row = coef_row(m, g, int(self.pools.tp[p]), pp.precision, pp.sm_clock_mhz, self.physics, pp.kv_dtype,
                           pp.max_num_batched_tokens)  # fmt: skip
            budget = row[st.C_TOKENS]
            reload = self.plan is not None and (prec != self.pools.prec[p] or budget != self.pools.coef[p, st.C_TOKENS])
            self.pools.prec[p] = prec
            self.pools.coef[p, :] = row
            self.pools.w_read_s[p] = weight_read_s(m, g, int(self.pools.tp[p]), pp.precision)
            for r in range(self.pools.slot_lo[p], self.pools.slot_hi[p]):
                if self.rep.state[r] == st.OFF:
                    continue
                if reload and (self.rep.prec[r] != prec or self.rep.coef[r, st.C_TOKENS] != budget):
                    reload_replica(self.rep, self.pools, self.req, self.q, self.logs, self.si, r, t)
                else:
                    self.rep.coef[r, :] = row
        self._rank_priorities(plan)
        if prewarm:
            for p in range(len(self.pool_keys)):
                for _ in range(int(self.pools.floor[p])):
                    start_replica(self.rep, self.pools, self.hw, self.logs, p, t)
            for r in np.flatnonzero(self.rep.state == st.LOADING):  # the fleet was running before the window
                self.rep.state[r] = st.WARM
                self.rep.ready_at[r] = t
                log_event(self.logs, t, int(r), st.EV_READY, int(self.rep.gpu0[r]))
        self.plan = plan

    def _rank_priorities(self, plan: Plan) -> None:
        """Scale-up preference within a model: the plan's pool order (first listed first)."""
        rank = {pp.key: i for i, pp in enumerate(plan.pools)}
        per_model: dict[str, int] = {}
        for p, key in sorted(enumerate(self.pool_keys), key=lambda e: rank.get(e[1], 1 << 20)):
            self.pools.priority[p] = per_model.get(key[1], 0)
            per_model[key[1]] = self.pools.priority[p] + 1

    def advance(self, t_end: float) -> None:
        """Run the compiled engine to t_end (s since window start)."""
        self._log_room(t_end)
        ht, hi = self.heap
        run_until(
            self.rep,
            self.pools,
            self.req,
            self.q,
            self.hw,
            self.logs,
            self.sf,
            self.si,
            ht,
            hi,
            float(t_end),
        )

    def _log_room(self, t_end: float) -> None:
        """Grow the telemetry, event and site logs so advancing to t_end cannot fill them (the engine stops
        logging at capacity, which would truncate the observation stream and the GPU-hours derived from it)."""
        logs = self.logs
        ticks = int(max(0.0, t_end - self.now) // TEL_DT) + 2
        n_rep = self.rep.n.shape[0]
        need = {
            "tel_": int(logs.n_tel[0]) + ticks * n_rep,  # one row per live replica per tick
            "ev_": int(logs.n_ev[0]) + 3 * ticks * n_rep,  # start, ready, stop per replica per tick, at most
            "site_": int(logs.n_site[0]) + ticks * len(self.sites),
        }
        grown: dict[str, np.ndarray] = {}
        for name in st.Logs._fields:
            prefix = next((p for p in need if name.startswith(p)), None)
            arr = getattr(logs, name)
            if prefix is not None and need[prefix] > arr.shape[0]:
                out = np.zeros(max(need[prefix], 2 * arr.shape[0]), arr.dtype)
                out[: arr.shape[0]] = arr
                grown[name] = out
        if grown:
            self.logs = logs._replace(**grown)

    def fork(self) -> SiteRuntime:
        """An independent copy of the runtime, to be taken at a period boundary (between `advance` calls).

        Every array is copied (requests with their outcomes, replicas, pools, queues, hardware, logs, scalars,
        event heap), so the copy runs forward under another plan without touching this one; the sites,
        physics, request frame and current plan are immutable and shared. The engine draws no random numbers,
        so a fork advanced under the same plans reproduces this runtime exactly (the same future arrivals and
        sizes: common random numbers); its logs hold the history up to the fork, so a branch is costed from
        the fork point on."""

        def dup(v: object) -> object:
            if isinstance(v, np.ndarray):
                return v.copy()
            if isinstance(v, tuple) and any(isinstance(x, np.ndarray) for x in v):
                items = [dup(x) for x in v]
                return type(v)(*items) if hasattr(v, "_fields") else tuple(items)
            return v

        new = object.__new__(type(self))
        new.__dict__.update({k: dup(v) for k, v in self.__dict__.items() if k != "heap"})
        n = int(self.si[st.S_HEAP_N])  # the heap's live entries are its first n; the rest is never read
        new.heap = tuple(np.zeros(a.shape, a.dtype) for a in self.heap)
        for a, b in zip(new.heap, self.heap, strict=True):
            a[:n] = b[:n]
        return new
