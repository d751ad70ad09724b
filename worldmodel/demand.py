"""The load a scenario offers one model's pools (worldmodel/forward.py): arrival rates, mean sizes, the
interactive backlog, and the deferrable work the plan's admission releases this period, carries or misses."""

from __future__ import annotations

from schemas.forecast import ClassDemand, DisturbanceForecast
from schemas.plan import BatchAdmission, Plan
from schemas.protocol import Protocol
from worldmodel.queueing import Load, Pool, mu_replica
from worldmodel.servingmodel import ServingModel, prompt_cv_from_p90
from worldmodel.snapshot import FleetSnapshot


def scenario_rate(d: ClassDemand, scenario: str) -> float:
    """The class's arrival rate in a demand scenario ("point", "lo80", "hi80", "hi95") (req/s, at least 0)."""
    return max(getattr(d.arrivals_per_s, scenario), 0.0)


def model_load(
    protocol: Protocol,
    snap: FleetSnapshot,
    plan: Plan,
    fc: DisturbanceForecast,
    demands: list[ClassDemand],
    scenario: str,
    pools: list[Pool],
    sm: ServingModel,
) -> tuple[Load, tuple[float, float, float]]:
    """Offered load of one model and the batch work's (released, carried, missed) counts (requests)."""
    T = fc.period_s
    lam_i = lam_b = w_in = w_out = w_cv = w_in_i = w_cv_i = 0.0
    q0 = 0.0
    batch_backlog = 0.0
    deadlines: tuple[float, ...] = ()
    for d in demands:
        lam = scenario_rate(d, scenario)
        spec = protocol.spec(d.request_class)
        n_in = d.input_tokens_mean * (1.0 - d.prefix_hit_rate)
        w_in += lam * n_in
        w_out += lam * d.output_tokens_mean
        cv = prompt_cv_from_p90(d.input_tokens_mean, d.input_tokens_p90)
        w_cv += lam * cv
        queue = snap.queue(d.request_class)
        if spec.deferrable:
            lam_b += lam
            batch_backlog = float(fc.deferred_backlog_requests or (queue.outstanding if queue else 0))
            deadlines = fc.deferred_deadlines_s or (queue.deadlines_s if queue else ())
        else:
            lam_i += lam
            w_in_i += lam * n_in
            w_cv_i += lam * cv
            running = sum(p.running * p.warm for p in snap.pools if p.model == d.model)
            q0 += max((queue.outstanding if queue else 0) - running, 0.0)
    lam_all = max(lam_i + lam_b, 1e-12)
    li = max(lam_i, 1e-12)
    load = Load(lam_i, 0.0, w_in / lam_all, w_out / lam_all, w_cv / lam_all, q0, w_in_i / li, w_cv_i / li)
    if lam_b <= 0.0 and batch_backlog <= 0.0:
        return load, (0.0, 0.0, 0.0)
    waiting = lam_b * T + batch_backlog
    urgent = _urgent_share(deadlines, T) * batch_backlog
    mu_ceiling = sum(mu_replica(sm, p, load) * p.plan.replica_ceiling for p in pools)
    spare = max(plan.autoscale_target * mu_ceiling - lam_i, 0.0) * T
    if plan.batch_admission == BatchAdmission.IMMEDIATE:
        released = waiting
    elif plan.batch_admission == BatchAdmission.PRESSURE:
        released = max(min(waiting, spare), urgent)
    else:
        released = urgent
    servable = max(mu_ceiling - lam_i, 0.0) * T
    missed = max(urgent - servable, 0.0) + sum(1.0 for x in deadlines if x < 0.0) * (
        batch_backlog / max(len(deadlines), 1)
    )
    load.lam_b = released / T
    return load, (released, waiting - released, missed)


def _urgent_share(deadlines_s: tuple[float, ...], T: float) -> float:
    """Share of waiting deferrable work whose deadline falls before the next period ends (0-1)."""
    if not deadlines_s:
        return 0.0
    return sum(1.0 for x in deadlines_s if x <= 2.0 * T) / len(deadlines_s)
