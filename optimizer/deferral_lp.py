"""Deferral LP: when to run deferrable (batch-class) work over the next K control periods.

Cohorts (the waiting backlog and each period's forecast arrivals) are released into periods between their
arrival and their deadline, at most the spare capacity of each period, so as to minimise the energy bill at
a risk-adjusted price plus the GPU time the work adds: work that fits the headroom the autoscaler keeps for
the interactive load of its model costs energy only; beyond it (and after the arrivals stop, in the drain)
every request also pays its GPU-seconds at the rental rate. Only this period's release matters for the plan:
it maps to the batch admission lever (HOLD / PRESSURE / IMMEDIATE).

Formulation (x[c, k] >= 0 requests of cohort c released in period k; late[c] >= 0 requests missing their
deadline inside the horizon; tail[c] >= 0 requests left for after the horizon, allowed only when the
cohort's deadline lies beyond it):

    min   sum_{c,k} (e * p_k + eps * k) * x[c,k] + g * sum_k paid_k
          + sum_c (e * p_tail + g) * tail[c] + M * sum_c late[c]
    s.t.  sum_k x[c,k] + tail[c] + late[c] = n_c
          x[c,k] = 0 unless arrival_c <= k <= deadline_c;  tail[c] = 0 unless deadline_c >= K
          sum_c x[c,k] <= spare_k;  paid_k >= sum_c x[c,k] - free_k;  paid_k >= 0

with p_k = point_k + risk_aversion * (hi80_k - point_k) ($/MWh), e the energy per request (MWh), g the GPU
cost per request ($), free_k the requests the interactive fleet's headroom absorbs and p_tail the mean
risk-adjusted price over the horizon. The eps term releases earlier when prices tie.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optimizer.replica_capacity import replica_power_w, replica_rps
from optimizer.solver import solve_highs
from schemas.forecast import DisturbanceForecast, Interval
from schemas.plan import BatchAdmission, Plan
from worldmodel.servingmodel import ServingModel

#: Penalty for a request missing its deadline ($/request), far above any energy cost.
LATE_PENALTY_USD = 1.0e3


@dataclass(frozen=True)
class Cohort:
    """requests (count) that can start in period `arrival` and must be done in period `deadline` (indices)."""

    requests: float
    arrival: int
    deadline: int


@dataclass(frozen=True)
class DeferralSchedule:
    """The LP's answer.

    release : per period, requests released (count).
    release_now_share : released this period / available this period (0-1; 1 when nothing is available).
    late : requests the LP could not fit before their deadlines (count).
    status : solver status string.
    carry_usd_per_request : what one request held past this period costs when it runs later: its energy at the
        mean risk-adjusted price of the horizon plus its GPU time ($; the objective charges carried work so).
    """

    release: tuple[float, ...]
    release_now_share: float
    late: float
    status: str
    carry_usd_per_request: float = 0.0

    def admission(self, hold_below: float = 0.05, immediate_above: float = 0.95) -> BatchAdmission:
        """HOLD when (almost) nothing is released now, IMMEDIATE when (almost) all is, else PRESSURE
        (deferrable work fills the spare capacity the interactive classes leave)."""
        if self.release_now_share <= hold_below:
            return BatchAdmission.HOLD
        if self.release_now_share >= immediate_above:
            return BatchAdmission.IMMEDIATE
        return BatchAdmission.PRESSURE


def risk_adjusted_price(price: Interval, risk_aversion: float) -> float:
    """point + risk_aversion * (hi80 - point) ($/MWh)."""
    return price.point + risk_aversion * (price.hi80 - price.point)


def schedule_deferral(
    cohorts: Sequence[Cohort],
    prices: Sequence[Interval],
    spare_requests: Sequence[float],
    energy_mwh_per_request: float,
    risk_aversion: float = 0.5,
    free_requests: Sequence[float] | None = None,
    gpu_usd_per_request: float = 0.0,
) -> DeferralSchedule:
    """Solve the deferral LP (see the module docstring).

    Parameters
    ----------
    cohorts : waiting and forecast deferrable work; deadlines may lie beyond the horizon.
    prices : forecast price per period ($/MWh with intervals); K = len(prices).
    spare_requests : deferrable requests each period can absorb beside interactive load (count).
    energy_mwh_per_request : marginal energy of one deferrable request (MWh, incl. PUE).
    risk_aversion : weight of the 80% upper interval in the price (0-1).
    free_requests : per period, deferrable requests the headroom kept for interactive load absorbs without
        adding GPUs (count); None: all spare capacity is free.
    gpu_usd_per_request : rented GPU time of one deferrable request served on GPUs added for it ($).

    Examples
    --------
    >>> from schemas.forecast import Interval
    >>> p = [Interval(v, v, v, v, v) for v in (100.0, 10.0)]
    >>> s = schedule_deferral([Cohort(10, 0, 1)], p, [100, 100], 1e-4)
    >>> s.admission().value, round(s.release[1], 3)
    ('hold', 10.0)
    """
    import cvxpy as cp  # lazy: cvxpy takes ~1 s to import; only the planner's solves need it

    k_n, c_n = len(prices), len(cohorts)
    if k_n != len(spare_requests):
        raise ValueError("prices and spare_requests need one entry per period")
    if c_n == 0 or sum(c.requests for c in cohorts) <= 0:
        return DeferralSchedule(tuple(0.0 for _ in range(k_n)), 1.0, 0.0, "empty",
                                energy_mwh_per_request * p_mean(prices, risk_aversion) + gpu_usd_per_request)
    p = np.array([risk_adjusted_price(x, risk_aversion) for x in prices])
    p_tail = p_mean(prices, risk_aversion)
    n = np.array([c.requests for c in cohorts], dtype=float)
    window = np.array([[c.arrival <= k <= c.deadline for k in range(k_n)] for c in cohorts], dtype=float)
    open_end = np.array([c.deadline >= k_n for c in cohorts], dtype=float)

    free = np.asarray(spare_requests if free_requests is None else free_requests, dtype=float)
    if free.shape != (k_n,):
        raise ValueError("free_requests needs one entry per period")
    x = cp.Variable((c_n, k_n), nonneg=True)
    paid = cp.Variable(k_n, nonneg=True)
    tail = cp.Variable(c_n, nonneg=True)
    late = cp.Variable(c_n, nonneg=True)
    eps = 1e-6 * max(abs(p_tail), 1.0) * energy_mwh_per_request
    cost = (cp.sum(x @ (energy_mwh_per_request * p + eps * np.arange(k_n))) + gpu_usd_per_request * cp.sum(paid)
            + (energy_mwh_per_request * p_tail + gpu_usd_per_request) * cp.sum(tail)
            + LATE_PENALTY_USD * cp.sum(late))
    cons = [
        cp.sum(x, axis=1) + tail + late == n,
        cp.multiply(x, 1.0 - window) == 0,
        cp.multiply(tail, 1.0 - open_end) == 0,
        cp.sum(x, axis=0) <= np.asarray(spare_requests, dtype=float),
        paid >= cp.sum(x, axis=0) - free,
    ]
    prob = cp.Problem(cp.Minimize(cost), cons)
    solve_highs(prob)
    if x.value is None:
        raise RuntimeError(f"deferral LP failed: {prob.status}")
    release = np.clip(x.value.sum(axis=0), 0.0, None)
    available_now = float(sum(c.requests for c in cohorts if c.arrival <= 0))
    share = 1.0 if available_now <= 0 else min(float(release[0]) / available_now, 1.0)
    return DeferralSchedule(tuple(float(r) for r in release), share, float(late.value.sum()),
                            str(prob.status), energy_mwh_per_request * p_tail + gpu_usd_per_request)


def p_mean(prices: Sequence[Interval], risk_aversion: float) -> float:
    """Mean risk-adjusted price over the periods ($/MWh; 0 for none)."""
    return sum(risk_adjusted_price(x, risk_aversion) for x in prices) / len(prices) if prices else 0.0


def plan_deferral(
    forecasts: Sequence[DisturbanceForecast],
    plan: Plan,
    serving: ServingModel,
    slack_s: Sequence[float],
    deferrable_class: str = "batch",
    risk_aversion: float = 0.5,
    target_utilization: float = 0.8,
    pue: float = 1.3,
    gpu_usd_per_gpu_h: dict[str, float] | None = None,
) -> DeferralSchedule | None:
    """Build the LP from the forecasts and solve it; None when no deferrable class is forecast.

    Cohorts: the waiting backlog (deadlines from the forecast, s from period start) and each period's
    forecast arrivals, split evenly over the observed deadline-slack quantiles `slack_s` (s). Spare capacity
    per period: the ceilings of `plan`'s pools serving the class's model at `target_utilization`, less the
    forecast interactive demand of that model. Energy per request: busy replica power / throughput x pue.
    Free capacity per period: the headroom an autoscaler at `target_utilization` keeps above the interactive
    load of the model, (1 / target - 1) x that load, in deferrable requests. GPU cost per request: the
    replica's GPUs at `gpu_usd_per_gpu_h` ($/GPU-h; None: no GPU term) over its throughput.
    """
    first = next((d for d in forecasts[0].demand if d.request_class == deferrable_class), None) \
        if forecasts else None
    if first is None:
        return None
    period_s = forecasts[0].period_s
    pools = [p for p in plan.pools if p.model == first.model and p.replica_ceiling > 0]
    if not pools:
        return None
    rps = [replica_rps(serving, p, first.input_tokens_mean, first.output_tokens_mean) for p in pools]
    cap_rps = target_utilization * sum(p.replica_ceiling * r for p, r in zip(pools, rps, strict=True))
    joules = [replica_power_w(serving, p, 1.0) / r for p, r in zip(pools, rps, strict=True)]
    energy_mwh = sum(joules) / len(joules) / 3.6e9 * pue
    gpu_usd = 0.0
    if gpu_usd_per_gpu_h:
        per_request = [p.tp * gpu_usd_per_gpu_h[p.gpu] / 3600.0 / r for p, r in zip(pools, rps, strict=True)]
        gpu_usd = sum(per_request) / len(per_request)
    headroom = 1.0 / target_utilization - 1.0
    cohorts: list[Cohort] = []
    f0 = forecasts[0]
    if f0.deferred_backlog_requests > 0:
        deadlines = f0.deferred_deadlines_s or (float(slack_s[len(slack_s) // 2]),)
        w = f0.deferred_backlog_requests / len(deadlines)
        cohorts += [Cohort(w, 0, max(int(d // period_s), 0)) for d in deadlines]
    spare, free = [], []
    for k, f in enumerate(forecasts):
        inter = [d for d in f.demand if d.model == first.model and d.request_class != deferrable_class]
        interactive = sum(max(d.arrivals_per_s.point, 0.0) for d in inter)
        spare.append(max(cap_rps - interactive, 0.0) * period_s)
        # the interactive load's headroom, in deferrable requests: its replicas' share of time left idle
        busy_replicas = sum(max(d.arrivals_per_s.point, 0.0) / replica_rps(serving, pools[0], d.input_tokens_mean,
                                                                            d.output_tokens_mean) for d in inter)
        free.append(min(headroom * busy_replicas * rps[0] * period_s, spare[-1]))
        batch = next((d for d in f.demand if d.request_class == deferrable_class), None)
        if batch is not None and batch.arrivals_per_s.point > 0:
            n = batch.arrivals_per_s.point * period_s / len(slack_s)
            cohorts += [Cohort(n, k, k + int(s // period_s)) for s in slack_s]
    return schedule_deferral(cohorts, [f.price_usd_mwh for f in forecasts], spare, energy_mwh, risk_aversion,
                             free_requests=free, gpu_usd_per_request=gpu_usd)
