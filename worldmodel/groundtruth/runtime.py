"""The Python side of the ground truth: build the site's arrays, apply a plan at each period boundary,
advance the compiled engine, and hand back what telemetry actually delivered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from optimizer.plan import BatchAdmission, Ordering, Plan, Routing
from worldmodel.fleet import DEFAULT_TP, GPU_INDEX, GPUS_PER_NODE, PRECISION_INDEX, GpuType, Site
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.engine import empty_heap, run_until
from worldmodel.groundtruth.reconfigure import reload_replica
from worldmodel.physics import COEFF_FIELDS, node_overhead_w, step_coefficients

MODELS = ("llama-3.1-8b", "llama-3.1-70b")
CLASSES = ("code", "chat", "batch")
_COEF_NAMES = (
    "base_s",
    "per_seq_s",
    "per_kv_token_s",
    "per_prefill_token_s",
    "per_prefill_attn_s",
    "kv_capacity_tokens",
    "weights_load_s",
    "idle_power_w",
    "max_power_w",
)
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


@dataclass(frozen=True)
class Physics:
    """Sensitivity knobs on the modeled figures (DESIGN.md: rerun with them varied)."""

    fp8_speedup_scale: float = 1.0
    clock_power_exponent: float = 2.2
    token_budget: int = 2048  # vLLM max_num_batched_tokens default for the OpenAI server (chunked prefill)
    release_margin_s: float = 1200.0
    load_power_frac: float = 0.3


def coef_row(model: str, gpu: str, tp: int, precision: str, clock_mhz: float, physics: Physics) -> np.ndarray:
    """Coefficient row in the engine's order (state.C_*), by field name from worldmodel.physics."""
    c = step_coefficients(model, gpu, tp, precision, clock_mhz, fp8_speedup_scale=physics.fp8_speedup_scale)
    arr = c.as_array()
    return np.array([arr[COEFF_FIELDS.index(name)] for name in _COEF_NAMES], dtype=np.float64)


def _hardware(site: Site, fleet_seed: int) -> st.Hardware:
    g_type, g_node, node_type = [], [], []
    node = 0
    for grp in site.groups:
        for _ in range(grp.nodes):
            node_type.append(GPU_INDEX[GpuType(grp.gpu)])
            for _g in range(GPUS_PER_NODE):
                g_type.append(GPU_INDEX[GpuType(grp.gpu)])
                g_node.append(node)
            node += 1
    rng = np.random.default_rng(fleet_seed)
    speed = np.clip(rng.normal(1.0, 0.06, node), 0.85, 1.15)
    n_gpu = len(g_type)
    return st.Hardware(
        np.array(g_type, np.int64),
        np.array(g_node, np.int64),
        np.full(n_gpu, -1, np.int64),
        speed,
        np.array(node_type, np.int64),
    )


class SiteRuntime:
    """One site serving one request array under successive plans.

    Parameters
    ----------
    site : the site inventory (GPU nodes, power cap in W).
    requests : the workload frame (workload builder columns; output_tokens is ground truth only).
    physics : sensitivity knobs.
    fleet_seed : seed of the hidden per-node speed variation (the same hardware for every policy).
    """

    def __init__(
        self, site: Site, requests: pl.DataFrame, physics: Physics | None = None, fleet_seed: int = 7
    ):
        self.site = site
        self.physics = physics or Physics()
        self.requests = requests
        n = requests.height
        cls_idx = {c: i for i, c in enumerate(CLASSES)}
        mdl_idx = {m: i for i, m in enumerate(MODELS)}
        arrival = requests["arrival_s"].to_numpy().astype(np.float64)
        cls = requests["request_class"].replace_strict(cls_idx, return_dtype=pl.Int64).to_numpy()
        model = requests["model"].replace_strict(mdl_idx, return_dtype=pl.Int64).to_numpy()
        ttft = requests["sla_ttft_ms"].fill_null(0.0).to_numpy() / 1000.0
        deadline = np.where(cls == 2, requests["deadline_s"].fill_null(0.0).to_numpy(), arrival + ttft)
        pfx_len = requests["prefix_block_ids"].list.len().to_numpy().astype(np.int64)
        pfx_off = np.concatenate([[0], np.cumsum(pfx_len)[:-1]]).astype(np.int64)
        blocks = requests["prefix_block_ids"].explode().drop_nulls().to_numpy().astype(np.int64)
        i8 = np.int64
        self.req = st.Requests(
            arrival,
            cls.astype(i8),
            model.astype(i8),
            requests["input_tokens"].to_numpy().astype(i8),
            requests["output_tokens"].to_numpy().astype(i8),
            deadline.astype(np.float64),
            pfx_off,
            pfx_len,
            blocks if blocks.size else np.zeros(1, i8),
            np.full(n, -1, i8),
            np.full(n, np.nan),
            np.full(n, np.nan),
            np.full(n, np.nan),
            np.zeros(n, i8),
            np.zeros(n, i8),
            np.zeros(n, i8),
            np.zeros(n, i8),
        )
        self.hw = _hardware(site, fleet_seed)
        self.pool_keys: list[tuple[str, str]] = [(m, g.gpu) for m in MODELS for g in site.groups]
        n_pool = len(self.pool_keys)
        slot_lo, slot_hi, lo = [], [], 0
        for m, g in self.pool_keys:
            tp = DEFAULT_TP[(m, GpuType(g))]
            cap = site.gpus(GpuType(g)) // tp
            slot_lo.append(lo)
            slot_hi.append(lo + cap)
            lo += cap
        n_rep = lo
        self.pools = st.Pools(
            np.array([mdl_idx[m] for m, _ in self.pool_keys], i8),
            np.array([GPU_INDEX[GpuType(g)] for _, g in self.pool_keys], i8),
            np.array([DEFAULT_TP[(m, GpuType(g))] for m, g in self.pool_keys], i8),
            np.zeros(n_pool, i8),
            np.zeros(n_pool, i8),
            np.full(n_pool, 256, i8),
            np.zeros(n_pool),
            np.zeros(n_pool),
            np.zeros(n_pool, i8),
            np.zeros((n_pool, st.N_COEF)),
            np.arange(n_pool, dtype=i8),
            np.array(slot_lo, i8),
            np.array(slot_hi, i8),
            np.zeros((n_pool, 20), i8),
        )
        rep_pool = np.zeros(n_rep, i8)
        for p in range(n_pool):
            rep_pool[slot_lo[p] : slot_hi[p]] = p
        mb = st.MAX_BATCH
        self.rep = st.Replicas(
            rep_pool,
            np.zeros(n_rep, i8),
            np.zeros(n_rep),
            np.zeros(n_rep, i8),
            np.ones(n_rep),
            np.zeros(n_rep),
            np.zeros((n_rep, st.N_COEF)),
            np.zeros(n_rep, i8),
            np.zeros(n_rep, i8),
            np.zeros((n_rep, mb), i8),
            np.zeros((n_rep, mb), i8),
            np.zeros((n_rep, mb), i8),
            np.zeros(n_rep, i8),
            np.zeros(n_rep, i8),
            np.zeros(n_rep),
            np.zeros(n_rep),
            np.zeros(n_rep, i8),
            np.zeros(n_rep, i8),
            np.zeros(n_rep),
            np.zeros(n_rep),
            np.full((n_rep, st.CACHE_SLOTS), -1, i8),
            np.zeros(n_rep),
            np.full(n_rep, -1, i8),
            np.zeros(n_rep),
            np.zeros(n_rep),
            np.zeros(n_rep),
        )
        n_models = len(MODELS)
        cap = max(n, 1) * 2
        self.q = st.Queues(
            np.zeros((n_models, cap), i8),
            np.full(n_models, n, i8),
            np.full(n_models, n, i8),
            np.zeros((n_models, max(n, 1)), i8),
            np.zeros((n_models, max(n, 1))),
            np.zeros(n_models, i8),
        )
        self.heap = empty_heap(1 << 21)
        self.logs = st.alloc_logs(n, n_rep * 64, 1 << 16, 4096)
        self.sf = np.zeros(st.N_FSCALARS)
        self.si = np.zeros(st.N_ISCALARS, i8)
        self.sf[st.S_NEXT_TEL] = 10.0
        self.sf[st.S_NEXT_AS] = 15.0
        self.sf[st.S_THROTTLE] = 1.0
        self.sf[st.S_POWER_CAP] = site.power_cap_w
        self.sf[st.S_NODE_OVERHEAD_H100] = node_overhead_w("H100")
        self.sf[st.S_NODE_OVERHEAD_A100] = node_overhead_w("A100")
        self.sf[st.S_GAMMA] = self.physics.clock_power_exponent
        self.sf[st.S_TOKEN_BUDGET] = self.physics.token_budget
        self.sf[st.S_RELEASE_MARGIN] = self.physics.release_margin_s
        self.sf[st.S_LOAD_POWER_FRAC] = self.physics.load_power_frac
        self.plan: Plan | None = None

    @property
    def now(self) -> float:
        return float(self.sf[st.S_NOW])

    def apply_plan(self, plan: Plan, prewarm: bool = False) -> None:
        """Set the runtime's bounds from a plan. Clock and batch cap change at once; a precision change
        reloads the pool's replicas (their sequences are requeued). With prewarm, floors start warm."""
        t = self.now
        self.si[st.S_ROUTING] = _ROUTING[Routing(plan.routing)]
        self.si[st.S_ADMISSION] = _ADMISSION[BatchAdmission(plan.batch_admission)]
        self.si[st.S_EDF] = 1 if Ordering(plan.ordering) == Ordering.EDF else 0
        self.si[st.S_AUTOSCALE] = 1 if plan.autoscale else 0
        self.sf[st.S_AS_TARGET] = plan.autoscale_target
        for p, (m, g) in enumerate(self.pool_keys):
            try:
                pp = plan.pool(self.site.name, m, g)
            except KeyError:
                self.pools.floor[p] = 0
                self.pools.ceil[p] = 0
                continue
            prec = PRECISION_INDEX[pp.precision]
            self.pools.floor[p] = pp.replica_floor
            self.pools.ceil[p] = pp.replica_ceiling
            self.pools.max_batch[p] = min(pp.max_batch, st.MAX_BATCH)
            self.pools.clock[p] = pp.sm_clock_mhz
            self.pools.clock_max[p] = float(max_clock(g))
            row = coef_row(m, g, int(self.pools.tp[p]), pp.precision, pp.sm_clock_mhz, self.physics)
            reload = self.plan is not None and prec != self.pools.prec[p]
            self.pools.prec[p] = prec
            self.pools.coef[p, :] = row
            for r in range(self.pools.slot_lo[p], self.pools.slot_hi[p]):
                if self.rep.state[r] == st.OFF:
                    continue
                if reload and self.rep.prec[r] != prec:
                    reload_replica(self.rep, self.pools, self.req, self.q, self.logs, self.si, r, t)
                else:
                    self.rep.coef[r, :] = row
        self._rank_priorities(plan)
        if prewarm:
            from worldmodel.groundtruth.scaler import start_replica

            for p in range(len(self.pool_keys)):
                for _ in range(int(self.pools.floor[p])):
                    start_replica(self.rep, self.pools, self.hw, self.logs, p, t)
            warm = self.rep.state == st.LOADING
            self.rep.state[warm] = st.WARM
            self.rep.ready_at[warm] = t
        self.plan = plan

    def _rank_priorities(self, plan: Plan) -> None:
        """Scale-up preference within a model: the plan's pool order (first listed first)."""
        listed = [(pp.model, pp.gpu) for pp in plan.pools if pp.site == self.site.name]
        rank = {k: i for i, k in enumerate(listed)}
        per_model: dict[str, int] = {}
        for p, key in sorted(enumerate(self.pool_keys), key=lambda e: rank.get(e[1], 99)):
            self.pools.priority[p] = per_model.get(key[0], 0)
            per_model[key[0]] = self.pools.priority[p] + 1

    def advance(self, t_end: float) -> None:
        """Run the compiled engine to t_end (s since window start)."""
        ht, hr, hv = self.heap
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
            hr,
            hv,
            float(t_end),
        )

    def pending(self) -> int:
        """Requests arrived but not done."""
        ptr = int(self.si[st.S_ARR_PTR])
        return ptr - int(self.logs.n_completed[0])


def max_clock(gpu: str) -> int:
    from worldmodel.fleet import SM_CLOCK_RANGE_MHZ

    return SM_CLOCK_RANGE_MHZ[GpuType(gpu)][1]
