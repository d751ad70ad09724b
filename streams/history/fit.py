"""The as-deployed policies: the recorded fleet imposed, and a reactive policy fitted to the recorded scaling.

`fit_autoscaler` fits the HPA target and the scale-down stabilization window to the recorded replica counts
by a grid search of least squares: at each telemetry instant, per model, the HPA rule of the bundled runtime
(desired = ceil(replicas x utilization / target) outside a +-10% band, the KEDA backlog trigger on
num_requests_waiting / 5, growth at most x2 or +4, scale-down to the largest desired count within the
stabilization window) predicts the replicas reporting at the next instant. Utilization is max(running /
batch slots, KV-cache use) of the model's replicas, from telemetry. The fitted target drives the runtime's
autoscaler (`ProductionPolicy(target=...)`); the runtime's stabilization is fixed at its compiled 300 s, so
a fitted window that differs is reported, not applied.

The records do not show everything the runtime's trigger reads (the prefill share of a replica's time), so
`refine_target` then replays up to `FIT_HOURS` of the range under `production` at each target of
`REFINE_GRID`, smooths the replayed GPU-hours (non-increasing in the target) and violation rate
(non-decreasing) by least squares (pool adjacent violators: pooling averages out the ground truth's
run-to-run sensitivity, which makes a single replay a noisy measure), and applies the target, on a 0.005
grid between them, that brings both closest to the recorded figures, each error in units of the estimate's
bounds (`GPU_HOURS_SCALE`, `VIOLATION_SCALE`). GPU-hours alone can be flat over a range of targets; the
violation rate tells them apart. The fidelity table judges the whole range, of which that span is in-sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from optimizer.baselines.production import ProductionPolicy
from schemas.fleet import default_max_num_seqs
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan, Routing
from schemas.policy import History, Observations, Policy, PolicyContext
from streams.history.checks import Records
from streams.history.recorded import Spans
from worldmodel.transients import AUTOSCALER_STABILIZATION_S, AUTOSCALER_TOLERANCE

TARGETS = np.round(np.arange(0.30, 0.951, 0.01), 2)
STABILIZATION_S = (0.0, 60.0, 150.0, 300.0, 600.0, 900.0)
#: The runtime's autoscaler constants the fit mirrors (worldmodel/groundtruth/scaler.py).
WAITING_PER_REPLICA = 5.0  # the tolerance and stabilization window: worldmodel/transients.py
DEFAULT_TARGET = 0.8
#: Hours at the start of the range replayed to refine the target, and the bisection's steps.
FIT_HOURS = 24.0
REFINE_GRID = np.round(np.arange(0.50, 0.951, 0.05), 2)
#: Units of the refinement's two errors: GPU-hours relative (5%) and violation rate absolute (0.5 pp).
GPU_HOURS_SCALE, VIOLATION_SCALE = 0.05, 0.005


@dataclass(frozen=True)
class Scaling:
    """What a replay, or the records, show over the fit's span: gpu_hours (h) and violation_rate (0-1) of the
    requests judged."""

    gpu_hours: float
    violation_rate: float


@dataclass(frozen=True)
class AutoscalerFit:
    """The fitted autoscaler: target (0-1), stabilization_s (s), rmse (replicas) over samples (count) at the
    fit, and the rmse of the bundled production defaults (target 0.8, 300 s) on the same samples."""

    target: float
    stabilization_s: float
    rmse: float
    samples: int
    default_rmse: float
    #: the target applied after `refine_target` (None before), and per grid target what its replay showed
    refined_target: float | None = None
    refine_grid: tuple[tuple[float, Scaling], ...] = ()

    @property
    def applied_target(self) -> float:
        """The target the as-deployed policy runs: the refined one where refined."""
        return self.refined_target if self.refined_target is not None else self.target


def _series(records: Records, spans: Spans) -> list[dict[str, np.ndarray]]:
    """Per model: replicas, utilization, waiting at each telemetry instant (time order), and the step (s)."""
    batch = {k[1:]: p.max_batch for k, p in spans.pools.items()}  # (model, gpu) -> max_batch
    tel = records.telemetry.filter(pl.col("replica_id").is_not_null() & pl.col("model_name").is_not_null())
    per_rep = tel.group_by("event_at", "model_name", "replica_id").agg(
        pl.col("gpu_type").first(),
        pl.col("num_requests_running").first().fill_null(0),
        pl.col("num_requests_waiting").first().fill_null(0),
        pl.col("kv_cache_usage_perc").first().fill_null(0.0),
    )
    slots = [batch.get((m, g), default_max_num_seqs(g)) for m, g in per_rep.select("model_name", "gpu_type").rows()]
    per_rep = per_rep.with_columns(pl.Series("slots", slots, dtype=pl.Float64))
    out = []
    for (model,), g in per_rep.group_by("model_name"):
        agg = (
            g.group_by("event_at")
            .agg(
                pl.len().alias("n"),
                pl.col("num_requests_running").sum(),
                pl.col("slots").sum(),
                pl.col("kv_cache_usage_perc").mean(),
                pl.col("num_requests_waiting").max(),
            )
            .sort("event_at")
        )
        if agg.height < 3:
            continue
        t = agg["event_at"].dt.epoch("us").to_numpy() / 1e6
        u = np.maximum(
            agg["num_requests_running"].to_numpy() / agg["slots"].to_numpy(), agg["kv_cache_usage_perc"].to_numpy()
        )
        out.append(
            {
                "model": model,
                "n": agg["n"].to_numpy().astype(np.float64),
                "u": u,
                "w": agg["num_requests_waiting"].to_numpy().astype(np.float64),
                "dt": float(np.median(np.diff(t))),
            }
        )
    return out


def _predict(s: dict[str, np.ndarray], target: float, stab_s: float) -> np.ndarray:
    n, u, w = s["n"], s["u"], s["w"]
    ratio = u / target
    desired = np.where(np.abs(ratio - 1.0) <= AUTOSCALER_TOLERANCE, n, np.ceil(n * ratio))
    backlog = np.ceil(w / WAITING_PER_REPLICA)
    desired = np.where(backlog > n, np.maximum(desired, backlog), desired)
    desired = np.minimum(desired, np.maximum(2 * n, n + 4))
    k = max(1, int(round(stab_s / s["dt"])))
    if k > 1:
        recent = pl.Series(desired).rolling_max(k, min_samples=1).to_numpy()
        desired = np.where(desired < n, np.minimum(n, recent), desired)
    return np.maximum(desired, 1.0)


def _sse(series: list[dict[str, np.ndarray]], target: float, stab_s: float) -> tuple[float, int]:
    err, m = 0.0, 0
    for s in series:
        d = _predict(s, target, stab_s)[:-1] - s["n"][1:]
        err += float((d * d).sum())
        m += d.size
    return err, m


def fit_autoscaler(records: Records, spans: Spans) -> AutoscalerFit | None:
    """Grid least-squares fit (module docstring); None when telemetry holds too few samples to fit."""
    series = _series(records, spans)
    if not series:
        return None
    grid = [(t, s, *_sse(series, float(t), s)) for t in TARGETS for s in STABILIZATION_S]
    t, s, err, m = min(grid, key=lambda g: (g[2], abs(g[0] - DEFAULT_TARGET), abs(g[1] - AUTOSCALER_STABILIZATION_S)))
    d_err, _ = _sse(series, DEFAULT_TARGET, AUTOSCALER_STABILIZATION_S)
    return AutoscalerFit(float(t), float(s), float(np.sqrt(err / m)), m, float(np.sqrt(d_err / m)))


def non_increasing(y: np.ndarray) -> np.ndarray:
    """The least-squares non-increasing fit of `y` (pool adjacent violators).

    >>> non_increasing(np.array([5.0, 3.0, 4.0, 1.0])).tolist()
    [5.0, 3.5, 3.5, 1.0]
    """
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


def refine_target(fit: AutoscalerFit, replay_at: Callable[[float], Scaling], recorded: Scaling) -> AutoscalerFit:
    """The target (module docstring) whose smoothed replayed GPU-hours and violation rate come closest to
    `recorded`; `replay_at(target)` replays the fit's span at that target.

    >>> f = AutoscalerFit(0.6, 300.0, 1.0, 10, 1.0)
    >>> round(refine_target(f, lambda t: Scaling(40.0 + 80.0 / t, 0.1 * t), Scaling(140.0, 0.08)).applied_target, 3)
    0.8
    """
    grid = tuple((float(t), replay_at(float(t))) for t in REFINE_GRID)
    t = np.array([x for x, _ in grid])
    g = non_increasing(np.array([r.gpu_hours for _, r in grid]))
    v = -non_increasing(-np.array([r.violation_rate for _, r in grid]))
    fine = np.round(np.arange(t[0], t[-1] + 1e-9, 0.005), 3)
    loss = ((np.interp(fine, t, g) / recorded.gpu_hours - 1.0) / GPU_HOURS_SCALE) ** 2
    loss += ((np.interp(fine, t, v) - recorded.violation_rate) / VIOLATION_SCALE) ** 2
    return replace(fit, refined_target=float(fine[int(np.argmin(loss))]), refine_grid=grid)


def fitted_policy(fit: AutoscalerFit | None) -> Policy:
    """`production` with the fitted target (the defaults when there is no fit), named "as-deployed"."""
    policy = ProductionPolicy(target=fit.applied_target if fit else DEFAULT_TARGET)
    policy.name = "as-deployed"
    return policy


class RecordedFleetPolicy(Policy):
    """The recorded fleet imposed: in period k each pool's autoscaler moves between the fewest and the most
    replicas recorded in that period (past the records: the last recorded period's bounds), with the
    recorded tp, precision, KV-cache dtype, batch cap and clock, production's routing, ordering and admission.

    Parameters
    ----------
    templates : every pool of the fleet with its recorded settings (`recorded.pool_templates`).
    bounds : pool -> (fewest, most) replicas per period (`Spans.per_period`).
    target : the autoscaler target within the bounds (the fitted one).
    """

    name = "as-deployed-imposed"

    def __init__(
        self,
        templates: dict[tuple[str, str, str], PoolPlan],
        bounds: dict[tuple[str, str, str], list[tuple[int, int]]],
        target: float,
    ) -> None:
        self.templates, self.bounds, self.target = templates, bounds, target

    def _at(self, k: int) -> Plan:
        pools = []
        for key, p in self.templates.items():
            b = self.bounds.get(key)
            lo, hi = b[min(k, len(b) - 1)] if b else (0, 0)
            pools.append(replace(p, replica_floor=lo, replica_ceiling=hi))
        return Plan(
            tuple(pools),
            Routing.PREFIX_LOAD,
            Ordering.EDF,
            BatchAdmission.PRESSURE,
            True,
            self.target,
            label=f"recorded fleet, period {k}",
        )

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return self._at(0)

    def plan(self, obs: Observations) -> Plan:
        return self._at(obs.period_index)
