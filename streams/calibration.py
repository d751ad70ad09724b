"""Operator calibration: fit the ground truth's coefficient corrections to an operator's recorded completions
and telemetry, starting from the bundled (cited) calibration.

Step times. Every record below is an interval over which one replica was busy with iterations whose count
and contents the records fix, so its duration is linear in the two corrections (decode_scale a on the
memory-bound terms, prefill_scale b on the compute-bound ones; worldmodel.physics):

* decode interval of request i, [first token, completion] = (out_i - 1) iterations, each with the replica's
  decoding sequences and the prefill chunks that ran meanwhile:
      D_i = a x [(out_i - 1) x (base + per_seq x n_i + per_kv x K_i) + per_kv x sum_j C_j]
          + b x sum_j (per_prefill_token x P_j + per_prefill_attn x (P_j C_j + P_j^2 / 2))
  with n_i, K_i the time-mean decoding sequences and their context tokens on the replica over the interval
  (from every completion's [first token, completion] on it, the context growing linearly from the prompt),
  and j the requests whose prefill (P_j = prompt - cached tokens, on C_j cached tokens) finished inside it;
* first-token interval of a request that found its replica idle, [queued, first token] = its own prefill
  iterations alone: TTFT_i = a x (base + per_kv x C_i) x chunks + b x (its prefill term).

(a, b) per (model, GPU type) come from a Huber-robust regression on relative residuals (every record weighs
alike whatever its length). What they absorb: the fleet's hidden per-node speed (so a and b are the
corrections times the fleet's mean node speed) and any power-cap slowdown.

Power. GPU telemetry of warm replicas (DCGM power, utilization, SM clock, running sequences, KV usage) against
the physics' power at the sample's state (worldmodel.physics.power.gpu_power_w; the prefill share of the busy
time read from the clock dip to the power-limited clock, the decode HBM utilization from the step time with
the fitted decode correction): P = s_idle x idle + s_active x (max - idle) x activity, by the same regression.

A quantity the records do not identify (no records of a pool, a relative standard error above
`MAX_REL_STD_ERR`, no clock dip to read the prefill share from) stays at its cited default, tagged so; so do
the quantities no record here bears on (`UNFITTED`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from schemas.fleet import Site, power_limited_clock_mhz
from schemas.records import reported_kv_cache_dtype
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.runtime import CoefficientCorrections, Physics, coef_row, node_order, weight_read_s
from worldmodel.physics.power import gpu_power_w
from worldmodel.physics.tables import HBM_EFFICIENCY

FITTED = "fitted"
DEFAULT = "cited default"
#: a fit whose standard error exceeds this share of its value does not identify the factor (it stays default)
MAX_REL_STD_ERR = 0.02
#: fewest records a fit takes
MIN_RECORDS = 30
HUBER_K = 1.345
#: quantities of the ground truth no completion or telemetry record here is fitted to (they stay cited defaults)
UNFITTED: tuple[tuple[str, str], ...] = (
    ("kv_capacity_tokens", "no record reports the engine's KV block count; cited memory model kept"),
    ("weights_load_s", "cold-start time kept at its cited default (fleet_events carry start and ready times)"),
    ("token_budget", "the engine's max_num_batched_tokens is not in the records; vLLM default per GPU type kept"),
    ("clock_power_exponent", "clocks do not vary in the records enough to fit it; modeled 2.2 kept"),
    ("per_node_speed", "the pool factors hold the fleet's mean node; per-node fits are reported, not applied"),
)
#: order of a replica's fleet events at one instant (a prewarmed replica starts and is ready at once)
_LIFECYCLE = {"replica_started": 0, "replica_reconfigured": 1, "replica_ready": 2, "replica_stopped": 3}
_CONFIG = ("model", "gpu_type", "tp", "precision", "kv_cache_dtype", "sm_clock_mhz")


@dataclass(frozen=True)
class Factor:
    """One correction factor of one pool: its value, whether fitted or the cited default, and the fit's error.

    name : the CoefficientCorrections field; value : the factor (1.0 = cited default); tag : FITTED or DEFAULT;
    n : records the fit used; std_err : the factor's standard error; residual_rms : RMS of the fit's residuals
    in `residual_unit` ("1": relative to the recorded duration; "W": per GPU); source : the records used, or
    why the factor stays at its default.
    """

    name: str
    value: float
    tag: str
    n: int
    std_err: float
    residual_rms: float
    residual_unit: str
    source: str


@dataclass(frozen=True)
class NodeFit:
    """A diagnostic: the step-time fit on one node's records alone (its replicas' first GPU on `hostname`).

    decode_scale and prefill_scale are the pool's factors times the node's own speed (the spread across
    nodes is the fleet's per-node variation; the pool's factors hold the fleet's mean); n records."""

    hostname: str
    decode_scale: float
    prefill_scale: float
    n: int


@dataclass(frozen=True)
class PoolCalibration:
    """The corrections of one (model, GPU type): prefill_scale, decode_scale, idle_power_scale, active_power_scale,
    and the per-node step-time fits (`NodeFit`, a diagnostic not applied)."""

    model: str
    gpu: str
    factors: tuple[Factor, ...]
    nodes: tuple[NodeFit, ...] = ()

    def factor(self, name: str) -> Factor:
        return next(f for f in self.factors if f.name == name)

    def corrections(self) -> CoefficientCorrections:
        """The fitted factors as ground-truth corrections (defaults at 1.0)."""
        return CoefficientCorrections(model=self.model, gpu=self.gpu, **{f.name: f.value for f in self.factors})


@dataclass(frozen=True)
class Calibration:
    """An operator calibration: per-pool corrections, the records dropped and the quantities left at default."""

    pools: tuple[PoolCalibration, ...]
    dropped: tuple[tuple[str, int], ...]
    unfitted: tuple[tuple[str, str], ...] = UNFITTED

    def pool(self, model: str, gpu: str) -> PoolCalibration:
        return next(p for p in self.pools if (p.model, p.gpu) == (model, gpu))

    def physics(self, base: Physics | None = None, sites: tuple[Site, ...] = ()) -> Physics:
        """`base` (default Physics()) with these corrections in place of its own and the recorded nodes' speeds:
        the pool factors hold the recorded fleet's mean node speed, so the simulator's hidden per-node variation
        gives way to `node_speeds` on the replayed `sites` (every node at 1.0 without them)."""
        speeds = self.node_speeds(sites) if sites else 1.0
        return replace(base or Physics(), corrections=tuple(p.corrections() for p in self.pools), node_speed=speeds)

    def node_speeds(self, sites: tuple[Site, ...]) -> tuple[float, ...]:
        """Per node of `sites` (the runtime's node order), its fitted step-time speed relative to its pools'
        factors (ratio: the n-weighted mean over the pools and the decode and prefill fits of the node's
        records); per GPU type the recorded hostnames, sorted, take that type's nodes in order (a history is one
        site); a node without records runs at 1.0."""
        rel: dict[tuple[str, str], tuple[float, float]] = {}  # (gpu, hostname) -> (sum of n x speed, sum of n)
        for p in self.pools:
            d, f = p.factor("decode_scale").value, p.factor("prefill_scale").value
            for nd in p.nodes:
                s = 0.5 * (nd.decode_scale / d + nd.prefill_scale / f)
                a, b = rel.get((p.gpu, nd.hostname), (0.0, 0.0))
                rel[(p.gpu, nd.hostname)] = (a + nd.n * s, b + nd.n)
        order = [gpu for _, gpu in node_order(sites)]
        out = [1.0] * len(order)
        for gpu in dict.fromkeys(order):
            slots = [i for i, g in enumerate(order) if g == gpu]
            for i, key in zip(slots, sorted(k for k in rel if k[0] == gpu), strict=False):
                a, b = rel[key]
                out[i] = a / b
        return tuple(out)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able report: per pool the factors with tag, n, standard error and residual RMS."""
        return {
            "pools": [
                {
                    "model": p.model,
                    "gpu": p.gpu,
                    "factors": [f.__dict__ for f in p.factors],
                    "nodes": [n.__dict__ for n in p.nodes],
                }
                for p in self.pools
            ],
            "dropped": dict(self.dropped),
            "cited_defaults": dict(self.unfitted),
        }


@dataclass(frozen=True)
class _Fit:
    theta: np.ndarray
    std_err: np.ndarray
    rms: float
    n: int


def _robust_fit(x: np.ndarray, y: np.ndarray, scale: np.ndarray) -> _Fit:
    """Huber IRLS of y ~ x @ theta (no intercept) on residuals divided by `scale`; theta, standard errors,
    RMS of the scaled residuals and n."""
    w_base = 1.0 / scale**2
    w = w_base.copy()
    theta = np.zeros(x.shape[1])
    for _ in range(50):
        xw = x * w[:, None]
        new = np.linalg.solve(x.T @ xw, xw.T @ y)
        r = (y - x @ new) / scale
        s = 1.4826 * float(np.median(np.abs(r - np.median(r)))) or 1e-12
        u = np.abs(r) / (HUBER_K * s)
        w = w_base * np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        if np.allclose(new, theta, rtol=1e-10, atol=0.0):
            theta = new
            break
        theta = new
    r = (y - x @ theta) / scale
    # sandwich covariance of the weighted estimator (heteroscedasticity-robust)
    bread = np.linalg.inv(x.T @ (x * w[:, None]))
    meat = (x * (w * r * scale)[:, None]).T @ (x * (w * r * scale)[:, None])
    cov = bread @ meat @ bread
    return _Fit(theta, np.sqrt(np.maximum(np.diag(cov), 0.0)), float(np.sqrt(np.mean(r**2))), len(y))


def _seconds(col: str) -> pl.Expr:
    return pl.col(col).dt.epoch("us").cast(pl.Float64) / 1e6


def _with_config(frame: pl.DataFrame, events: pl.DataFrame, at: str) -> pl.DataFrame:
    """Each record with the configuration (tp, precision, KV-cache dtype, clock) and lifecycle state of its replica
    at `at` (the replica's latest fleet event strictly before; a KV dtype it does not report is the replica's last
    reported one: `events` have been through `schemas.records.reported_kv_cache_dtype`)."""
    ev = events.select(
        "replica_id", _seconds("event_at").alias("_ev_t"), pl.col("kind").alias("_kind"), "tp", "precision",
        "kv_cache_dtype", "sm_clock_mhz",
        pl.col("kind").replace_strict(_LIFECYCLE, default=len(_LIFECYCLE)).alias("_order"),
        pl.col("hostnames").list.first().alias("_node"),
    ).sort("_ev_t", "_order")  # fmt: skip
    return (
        frame.sort(at)
        .join_asof(
            ev,
            left_on=at,
            right_on="_ev_t",
            by="replica_id",
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .filter(pl.col("tp").is_not_null())
    )


def _ramps(points: np.ndarray, weights: np.ndarray, t: np.ndarray, power: int) -> np.ndarray:
    """sum_j weights_j x max(0, t - points_j) ** power (power 1 or 2) at each t, by prefix sums over sorted points."""
    order = np.argsort(points, kind="stable")
    pts, w = points[order], weights[order]
    k = np.searchsorted(pts, t, side="right")
    c0, c1 = np.r_[0.0, np.cumsum(w)][k], np.r_[0.0, np.cumsum(w * pts)][k]
    if power == 1:
        return t * c0 - c1
    c2 = np.r_[0.0, np.cumsum(w * pts**2)][k]
    return t**2 * c0 - 2.0 * t * c1 + c2


def _integrals(f: np.ndarray, d: np.ndarray, c0: np.ndarray, rate: np.ndarray, t: np.ndarray) -> tuple:
    """Integrals from the start up to each t of N(x) = decoding sequences (s) and K(x) = their context tokens
    (token-s), sequence j decoding over [f_j, d_j) from c0_j tokens on, at `rate`_j tokens/s."""
    ones = np.ones_like(f)
    n_int = _ramps(f, ones, t, 1) - _ramps(d, ones, t, 1)
    k_int = (
        _ramps(f, c0, t, 1)
        - _ramps(d, c0, t, 1)
        + 0.5 * (_ramps(f, rate, t, 2) - _ramps(d, rate, t, 2))
        - _ramps(d, rate * (d - f), t, 1)
    )
    return n_int, k_int


def _step_rows(rep: pl.DataFrame, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Regressors (decode-term s, prefill-term s) and recorded durations (s) of one replica's records."""
    t0 = float(rep["_queued"].min())  # times from the replica's first record: the prefix sums stay exact
    q, f, d = (rep[c].to_numpy() - t0 for c in ("_queued", "_first", "_done"))
    inp, out, cached = (rep[c].to_numpy().astype(np.float64) for c in ("input_tokens", "output_tokens",
                                                                        "cached_input_tokens"))  # fmt: skip
    base, per_seq, per_kv, per_tok, per_attn = row[[st.C_BASE, st.C_SEQ, st.C_KV, st.C_PTOK, st.C_PATTN]]
    budget = row[st.C_TOKENS]
    p = np.maximum(inp - cached, 1.0)
    chunks = np.ceil(p / budget)
    pre_kv = per_kv * (chunks * cached + budget * chunks * (chunks - 1.0) * 0.5)
    pre_cmp = per_tok * p + per_attn * (p * cached + 0.5 * p**2)
    dec = (out >= 2) & (d > f)
    span = np.where(dec, d - f, 1.0)
    rate = np.where(dec, (out - 1.0) / span, 0.0)
    fd, dd = np.where(dec, f, 0.0), np.where(dec, d, 0.0)
    # decode intervals
    idx = np.flatnonzero(dec)
    n_hi, k_hi = _integrals(fd, dd, inp + 1.0, rate, d[idx])
    n_lo, k_lo = _integrals(fd, dd, inp + 1.0, rate, f[idx])
    n_bar, k_bar = (n_hi - n_lo) / span[idx], (k_hi - k_lo) / span[idx]
    order = np.argsort(f, kind="stable")
    cs_kv, cs_cmp = np.r_[0.0, np.cumsum(pre_kv[order])], np.r_[0.0, np.cumsum(pre_cmp[order])]
    lo = np.searchsorted(f[order], f[idx], side="right")
    hi = np.searchsorted(f[order], d[idx], side="right")
    x_dec = (out[idx] - 1.0) * (base + per_seq * n_bar + per_kv * k_bar) + (cs_kv[hi] - cs_kv[lo])
    x_pre = cs_cmp[hi] - cs_cmp[lo]
    # first-token intervals of requests that found the replica idle (nothing queued or running on it)
    by_q = np.argsort(q, kind="stable")
    latest_done = np.maximum.accumulate(d[by_q])  # of the requests queued up to each one, the latest completion
    idle = np.zeros(len(q), bool)
    idle[by_q[1:]] = latest_done[:-1] <= q[by_q[1:]]
    idle[by_q[0]] = True
    idle &= f > q
    x = np.vstack([np.c_[x_dec, x_pre], np.c_[chunks[idle] * base + pre_kv[idle], pre_cmp[idle]]])
    y = np.r_[d[idx] - f[idx], f[idle] - q[idle]]
    return x[:, 0], x[:, 1], y


def _coef(key: tuple, physics: Physics) -> np.ndarray:
    model, gpu, tp, precision, kv_dtype, clock = key
    return coef_row(model, gpu, int(tp), precision, float(clock), physics, kv_dtype=kv_dtype)


def _factor(name: str, fit: _Fit | None, i: int, unit: str, source: str, why_default: str) -> Factor:
    if fit is None:
        return Factor(name, 1.0, DEFAULT, 0, float("nan"), float("nan"), unit, why_default)
    value, se = float(fit.theta[i]), float(fit.std_err[i])
    if not value > 0.0 or se > MAX_REL_STD_ERR * value:
        return Factor(name, 1.0, DEFAULT, fit.n, se, fit.rms, unit,
                      f"not identified by {source}: {value:.3f} +- {se:.3f}")  # fmt: skip
    return Factor(name, value, FITTED, fit.n, se, fit.rms, unit, source)


def _power_rows(tel: pl.DataFrame, physics: Physics, decode_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(idle W, dynamic W at the cited max) per warm sample whose prefill share the clock reveals, and power W."""
    x_rows, y = [], []
    for key, grp in tel.group_by(*_CONFIG, maintain_order=True):
        model, gpu, tp, precision, _, clock = key
        row = _coef(key, physics)
        f_pl = power_limited_clock_mhz(gpu)
        if clock <= f_pl:
            continue  # a busy GPU's clock shows no prefill dip: the prefill share is not in the records
        w_read = weight_read_s(model, gpu, int(tp), precision)
        idle, peak = float(row[st.C_IDLE]), float(row[st.C_MAXP])
        util = grp["DCGM_FI_DEV_GPU_UTIL"].to_numpy() / 100.0
        pf = np.clip((clock - grp["DCGM_FI_DEV_SM_CLOCK"].to_numpy()) / (clock - f_pl), 0.0, util)
        n = np.maximum(grp["num_requests_running"].to_numpy().astype(np.float64), 1.0)
        kv = grp["kv_cache_usage_perc"].to_numpy() * row[st.C_KVCAP]
        t_step = decode_scale * (row[st.C_BASE] + row[st.C_SEQ] * n + row[st.C_KV] * kv)
        u = np.minimum(1.0, (w_read + HBM_EFFICIENCY * decode_scale * row[st.C_KV] * kv) / t_step)
        act = np.array([
            (gpu_power_w(gpu, ui, clock, clock_power_exponent=physics.clock_power_exponent, prefill_share=pi,
                         hbm_util=hi, batch=ni) - gpu_power_w(gpu, 0.0, clock)) / (peak - idle)
            for ui, pi, hi, ni in zip(util, pf, u, n, strict=True)
        ])  # fmt: skip
        x_rows.append(np.c_[np.full(len(act), idle), (peak - idle) * act])
        y.append(grp["DCGM_FI_DEV_POWER_USAGE"].to_numpy())
    if not x_rows:
        return np.zeros((0, 2)), np.zeros(0)
    return np.vstack(x_rows), np.concatenate(y)


def calibrate(
    completions: pl.DataFrame, telemetry: pl.DataFrame, fleet_events: pl.DataFrame, physics: Physics | None = None
) -> Calibration:
    """Fit each (model, GPU type)'s coefficient corrections to the records (wire-schema frames: request
    completions, GPU telemetry, fleet events), starting from `physics` without its corrections (default:
    the cited calibration). Records of replicas without a fleet event before them are dropped (counted)."""
    physics = replace(physics or Physics(), corrections=())
    fleet_events = reported_kv_cache_dtype(fleet_events)  # once, for both joins below
    dropped: dict[str, int] = {}
    comp = completions.with_columns(
        _seconds("queued_at").alias("_queued"), _seconds("first_token_at").alias("_first"),
        _seconds("event_at").alias("_done"),
    ).drop("model", "gpu_type")  # fmt: skip
    n0 = comp.height
    comp = comp.filter(pl.col("_first").is_not_null())
    dropped["completions without a first token"] = n0 - comp.height
    n0 = comp.height
    comp = _with_config(comp, fleet_events, "_first")
    dropped["completions without a fleet event of their replica before the first token"] = n0 - comp.height
    ev_pool = fleet_events.select("replica_id", "model", "gpu_type").unique("replica_id")
    comp = comp.join(ev_pool, on="replica_id").sort("replica_id", "_first", "request_id")  # a fixed order: the
    # fit's sums, and so its figures, do not depend on the order the records came in
    tel = telemetry.unique(["event_at", "replica_id"]).filter(pl.col("replica_id").is_not_null())
    tel = tel.with_columns(_seconds("event_at").alias("_t")).drop("model_name")
    n0 = tel.height
    tel = _with_config(tel, fleet_events, "_t").join(ev_pool, on="replica_id").sort("replica_id", "_t")
    dropped["replica telemetry samples without a fleet event of their replica before them"] = n0 - tel.height
    n0 = tel.height
    tel = tel.filter(pl.col("_kind") == "replica_ready")
    dropped["replica telemetry samples of replicas loading (started, not ready)"] = n0 - tel.height
    pools = []
    for model, gpu in sorted(set(comp.select("model", "gpu_type").iter_rows()) | set(
            tel.select("model", "gpu_type").iter_rows())):  # fmt: skip
        by_node: dict[str, list[np.ndarray]] = {}
        for key, rep in comp.filter((pl.col("model") == model) & (pl.col("gpu_type") == gpu)).group_by(
            "replica_id", "_node", *_CONFIG[2:], maintain_order=True
        ):
            xd, xp, y = _step_rows(rep, _coef((model, gpu, *key[2:]), physics))
            by_node.setdefault(str(key[1]), []).append(np.c_[xd, xp, y][y > 0.0])
        node_rows = {k: np.vstack(v) for k, v in sorted(by_node.items())}
        rows = np.vstack(list(node_rows.values())) if node_rows else np.zeros((0, 3))
        nodes = tuple(
            NodeFit(k, *map(float, _robust_fit(r[:, :2], r[:, 2], r[:, 2]).theta), len(r))
            for k, r in node_rows.items()
            if len(r) >= MIN_RECORDS
        )
        step = _robust_fit(rows[:, :2], rows[:, 2], rows[:, 2]) if len(rows) >= MIN_RECORDS else None
        src = f"{len(rows)} decode and idle first-token intervals of request completions"
        none = "fewer than MIN_RECORDS completions"
        decode = _factor("decode_scale", step, 0, "1", src, none)
        prefill = _factor("prefill_scale", step, 1, "1", src, none)
        xw, yw = _power_rows(tel.filter((pl.col("model") == model) & (pl.col("gpu_type") == gpu)), physics,
                             decode.value)  # fmt: skip
        power = _robust_fit(xw, yw, np.ones_like(yw)) if len(yw) >= MIN_RECORDS else None
        psrc = f"{len(yw)} GPU telemetry samples of warm replicas"
        pnone = "fewer than MIN_RECORDS warm telemetry samples with a readable prefill share"
        factors = (
            prefill, decode, _factor("idle_power_scale", power, 0, "W", psrc, pnone),
            _factor("active_power_scale", power, 1, "W", psrc, pnone),
        )  # fmt: skip
        pools.append(PoolCalibration(model, gpu, factors, nodes))
    return Calibration(tuple(pools), tuple(dropped.items()))
