"""The load a scenario offers one model's pools (worldmodel/forward.py): arrival rates, mean sizes, the
interactive backlog, and the deferrable work the plan's admission releases this period, carries or misses."""

from __future__ import annotations

from schemas.forecast import ClassDemand, DisturbanceForecast
from schemas.plan import BatchAdmission, Plan
from schemas.protocol import Protocol
from worldmodel.queueing import Load, Pool, mu_replica
from worldmodel.servingmodel import ServingModel, prompt_cv_from_p90
from worldmodel.snapshot import FleetSnapshot, QueueState


def scenario_rate(d: ClassDemand, scenario: str) -> float:
    """The class's arrival rate in a demand scenario ("point", "lo80", "hi80", "hi95") (req/s, at least 0)."""
    return max(getattr(d.arrivals_per_s, scenario), 0.0)


def deferred_waiting(fc: DisturbanceForecast, queue: QueueState | None) -> tuple[float, tuple[float, ...]]:
    """Deferrable requests waiting at the period's start (count) and their deadline sample (s from then): the
    forecast's where it carries them, else the snapshot's `queue`."""
    return (float(fc.deferred_backlog_requests or (queue.outstanding if queue else 0)),
            fc.deferred_deadlines_s or (queue.deadlines_s if queue else ()))  # fmt: skip


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
    """Offered load of one model and the batch work's (released, carried, missed) counts (requests).

    The load's mean sizes (tokens) are those of the work it serves: the interactive classes' arrivals and the
    deferrable work the admission releases this period (arrivals and backlog alike), so a backlog served after
    arrivals stop keeps its prompts' and outputs' sizes (weighting by arrivals alone gave it size 0 there, and
    one replica "served" any backlog in a period)."""
    T = fc.period_s
    lam_i = lam_b = 0.0
    q0 = 0.0
    batch_backlog = 0.0
    deadlines: tuple[float, ...] = ()
    inter: list[tuple[float, float, float, float]] = []  # (rate req/s, uncached prompt, output, CV) per class
    deferred: list[tuple[float, float, float, float]] = []
    for d in demands:
        lam = scenario_rate(d, scenario)
        spec = protocol.spec(d.request_class)
        n_in = d.input_tokens_mean * (1.0 - d.prefix_hit_rate)
        sizes = (n_in, d.output_tokens_mean, prompt_cv_from_p90(d.input_tokens_mean, d.input_tokens_p90))
        queue = snap.queue(d.request_class)
        if spec.deferrable:
            lam_b += lam
            batch_backlog, deadlines = deferred_waiting(fc, queue)
            deferred.append((lam + batch_backlog / T, *sizes))
        else:
            lam_i += lam
            inter.append((lam, *sizes))
            running = sum(p.running * p.warm for p in snap.pools if p.model == d.model)
            q0 += max((queue.outstanding if queue else 0) - running, 0.0)
    if lam_b <= 0.0 and batch_backlog <= 0.0:
        return _load(q0, inter, []), (0.0, 0.0, 0.0)
    waiting = lam_b * T + batch_backlog
    urgent = _urgent_share(deadlines, T) * batch_backlog
    offered = _load(q0, inter, deferred)  # every waiting request's sizes: what the ceiling could serve
    mu_ceiling = sum(mu_replica(sm, p, offered) * p.plan.replica_ceiling for p in pools)
    spare = max(plan.autoscale_target * mu_ceiling - lam_i, 0.0) * T
    if plan.batch_admission == BatchAdmission.IMMEDIATE:
        released = waiting
    elif plan.batch_admission == BatchAdmission.PRESSURE:
        released = max(min(waiting, spare), urgent)
    else:
        released = urgent
    servable = max(mu_ceiling - lam_i, 0.0) * T
    released = min(released, max(servable, urgent))  # what the ceiling cannot run waits (urgent excess: missed)
    missed = max(urgent - servable, 0.0) + sum(1.0 for x in deadlines if x < 0.0) * (
        batch_backlog / max(len(deadlines), 1)
    )
    share = released / waiting if waiting > 0.0 else 0.0
    load = _load(q0, inter, [(w * share, *sizes) for w, *sizes in deferred])
    load.lam_b = released / T
    return load, (released, waiting - released, missed)


def _load(q0: float, inter: list[tuple[float, float, float, float]],
          deferred: list[tuple[float, float, float, float]]) -> Load:
    """The interactive load (the `inter` classes' rates, req/s; backlog `q0` req) with mean sizes (tokens) and size
    CV weighted by each class's rate, `inter` and `deferred` as (rate req/s, uncached prompt, output, CV); lam_b
    left 0."""
    every = inter + deferred
    lam_i = sum(w for w, *_ in inter)
    total = max(sum(w for w, *_ in every), 1e-12)
    li = max(lam_i, 1e-12)

    def mean(rows: list[tuple[float, float, float, float]], k: int, norm: float) -> float:
        return sum(r[0] * r[k] for r in rows) / norm

    return Load(lam_i, 0.0, mean(every, 1, total), mean(every, 2, total), mean(every, 3, total), q0,
                mean(inter, 1, li), mean(inter, 3, li))


def _urgent_share(deadlines_s: tuple[float, ...], T: float) -> float:
    """Share of waiting deferrable work whose deadline falls before the next period ends (0-1)."""
    if not deadlines_s:
        return 0.0
    return sum(1.0 for x in deadlines_s if x <= 2.0 * T) / len(deadlines_s)
