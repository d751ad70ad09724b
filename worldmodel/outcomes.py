"""A request class's outcome over a control period (steps 3-4 of worldmodel/forward.py): its SLA violation
rate from the pools' TTFT and TPOT tails, their p99s, and the accumulator of one demand scenario's outcome."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

from schemas.forecast import ClassDemand, ClassOutcome
from schemas.protocol import ClassSpec
from worldmodel.queueing import Load, PoolResult
from worldmodel.servingmodel import gamma_exceed, prompt_cv_from_p90, size_cv_from_p90
from worldmodel.tails import empirical_exceed, fluid_share, tpot_tail


class Scenario:
    """Accumulator of one demand scenario's outcome: classes, SLA-met and carried requests, GPU-hours, energy
    (kWh), costs ($), peak power (W), cold starts (count), replicas per pool (count)."""

    def __init__(self) -> None:
        self.classes: list[ClassOutcome] = []
        self.by_class: dict[str, ClassOutcome] = {}
        self.sla_met = self.carryover = self.gpu_hours = self.energy_kwh = 0.0
        self.energy_cost_usd = self.cost_usd = self.cost_owned = self.peak_power_w = 0.0
        self.cold_starts = 0
        self.replicas: dict[tuple[str, str, str], float] = {}  # per pool key (count)

    def add(self, c: ClassOutcome, sla_met: float) -> None:
        """Record a class's outcome and its SLA-met requests (count)."""
        self.classes.append(c)
        self.by_class[c.request_class] = c
        self.sla_met += sla_met


def class_outcome(
    out: Scenario,
    spec: ClassSpec,
    d: ClassDemand,
    lam: float,
    load: Load,
    res: list[PoolResult],
    mu: float,
    T: float,
    cvs: tuple[float, ...],
    batch_info: tuple[float, float, float],
    tails: bool = True,
    learned: tuple[tuple[float, float], ...] = (),
    requeued: float = 0.0,
) -> None:
    """One class's outcome, added to `out`: `lam` its arrivals (req/s), `mu` its model's capacity (req/s), `T`
    the period (s), `cvs` the step-time spreads, `batch_info` the deferrable work's (released, carried, missed)
    requests, `tails` whether to compute the p99s, `learned` the TPOT tail shape from completions.
    `requeued`: requests of the class in flight at the period start on replicas a precision change reloads
    (count); the runtime requeues them mid-stream, so an interactive one misses its SLA (a deferrable one
    recomputes within its deadline): they count as violations, over the period's offered plus in-flight
    requests, and as SLA-met lost against a plan that lets them finish."""
    offered = lam * T
    if spec.deferrable:
        released, carried, missed = batch_info
        viol = min(missed / offered, 1.0) if offered > 0 else 0.0
        out.carryover += carried
        # what runs this period within its deadline is met, backlog included; what is carried is the
        # objective's to credit (at the cost it will run at), so holding and releasing count the same work
        met = max(released - missed, 0.0)
        out.add(ClassOutcome(d.request_class, offered, released, viol, viol, 0.0, 0.0), met)
        return
    if offered <= 0.0:  # nothing offered: no rate to speak of, but the requests a reload requeues
        viol = 1.0 if requeued > 0.0 else 0.0
        out.add(ClassOutcome(d.request_class, 0.0, 0.0, viol, viol, 0.0, 0.0), -requeued)
        return
    lam_tot = sum(r.lam for r in res)
    if not res or mu <= 0.0:
        out.add(ClassOutcome(d.request_class, offered, 0.0, 1.0, 1.0, math.inf, math.inf), 0.0)
        return
    v_ttft = v_tpot = 0.0
    served = 0.0
    n_in = d.input_tokens_mean * (1.0 - d.prefix_hit_rate)
    size_cv = prompt_cv_from_p90(d.input_tokens_mean, d.input_tokens_p90)
    out_cv = size_cv_from_p90(d.output_tokens_mean, d.output_tokens_p90)
    slo, slo_tpot = spec.ttft_slo_ms / 1e3, spec.tpot_slo_ms / 1e3
    ttft_tails: list[tuple[float, Callable[[float], float]]] = []
    tpot_tails: list[tuple[float, Callable[[float], float]]] = []
    for r in res:
        if r.replicas <= 0:  # a pool with no replicas serves none of the class
            continue
        share = r.lam / lam_tot if lam_tot > 0 else 1.0 / len(res)
        s_cls = r.t_pf * max(n_in, 1.0) / max(load.n_in, 1.0)

        def ttft_exceed(x: float, r: PoolResult = r, s_cls: float = s_cls) -> float:
            """P(TTFT > x s): the prompt's own prefill, the chunk-queue and slot waits, the fluid backlog."""
            wait_x = max(x - s_cls, 0.0)
            f_fluid = fluid_share(r.fluid[0], r.fluid[1], r.mu, wait_x, T)
            p_slot, theta_slot = r.slot_wait
            p = (
                gamma_exceed(s_cls, size_cv, x)
                + r.p_wait * math.exp(-wait_x / max(r.theta, 1e-9))
                + p_slot * math.exp(-wait_x / max(theta_slot, 1e-9))
            )
            return f_fluid + (1.0 - f_fluid) * min(p, 1.0)

        by_cv = [tpot_tail(r.mixed, cv, d.output_tokens_mean, out_cv) for cv in cvs]

        def tpot_exceed_x(x: float, r: PoolResult = r, by_cv: list[Callable[[float], float]] = by_cv,
                          all_cvs: bool = True) -> float:
            """P(a request's mean TPOT > x s): chunk interference, at least the tail shape learned from
            completions (TPOT / the replica's median) around the predicted typical TPOT (the mean; the
            interference model's median is within a few % of it)."""
            p = max(f(x) for f in (by_cv if all_cvs else by_cv[:1]))
            return max(p, empirical_exceed(learned, x / r.tpot_s)) if learned and r.tpot_s > 0.0 else p

        v_ttft += share * ttft_exceed(slo)
        v_tpot += share * tpot_exceed_x(slo_tpot)
        ttft_tails.append((share, ttft_exceed))
        tpot_tails.append((share, partial(tpot_exceed_x, all_cvs=False)))
        served += share * min(offered, r.mu * T)
    # the p99s (reported from the point scenario only) are the class's: quantiles of the pools' mixture
    ttft99 = 1e3 * _mixture_q99(ttft_tails, 2.0 * slo) if tails else 0.0
    tpot99 = 1e3 * _mixture_q99(tpot_tails, 2.0 * slo_tpot) if tails else 0.0
    viol = min(1.0 - (1.0 - v_ttft) * (1.0 - v_tpot), 1.0)
    met = offered * (1 - viol)
    if requeued > 0.0:
        viol = min((viol * offered + requeued) / (offered + requeued), 1.0)
        met -= requeued
    out.add(ClassOutcome(d.request_class, offered, served, viol, viol, ttft99, tpot99), met)


def _mixture_q99(tails: list[tuple[float, Callable[[float], float]]], guess: float) -> float:
    """The 99th percentile (s) of a mixture of pools' (share, P(X > x)) tails: the x where the share-weighted
    exceedance is 1 %, by bisection after doubling from `guess` (s); inf past a day."""

    def exceed(x: float) -> float:
        return sum(w * f(x) for w, f in tails)

    if not tails:
        return 0.0
    lo, hi = 0.0, max(guess, 1e-3)
    while exceed(hi) > 0.01:
        lo, hi = hi, 2.0 * hi
        if hi > 86_400.0:
            return math.inf
    for _ in range(10):  # the bracket [x, 2x] to 0.1 %
        mid = 0.5 * (lo + hi)
        if exceed(mid) > 0.01:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
