"""The planner's horizon: the one-period forward model stepped from period to period over the forecast.

`rollout` scores a plan held over the horizon (move blocking: the committed period's plan, re-planned at the next
decision): the first `fine` periods one at a time, then blocks of `block` periods each scored as one period of
that length at the block's middle forecast. Between steps the snapshot advances to what the step predicted:

- replicas per pool become the step's predicted count (the forward model's autoscaler within the plan's floor
  and ceiling, its scale-down held by the 300 s stabilization, new replicas loading for the cold start), all
  warm at the next step's start, and the plan's precision, KV dtype, clock and batch cap are in force (a precision
  change reloads once, in the first step, never again);
- the deferrable backlog becomes the step's carried work, carried on the next step's forecast (it used to
  ride on the snapshot's queue and vanished when the snapshot had none); its deadline sample keeps the latest
  share the runtime's earliest-deadline-first order leaves, moved on by the step's length (new arrivals carried
  have deadlines beyond the sample); the interactive queues start empty (what the step could not serve it
  counted as violations);
- once the carried work is done and no later period of the forecast has arrivals (the replay's drain), the
  rollout ends: the fleet's bill ends with the work, as the ground truth's does. Before, the fleet stayed on the
  bill for the rest of the 3 h horizon with nothing to serve, so the plan with the fewest replicas won every
  drain decision (one cause of the ablation's batch class 40-45 % late at 31b4ba3);
- after the first step deferrable work is admitted as the decisions to come will (the policy's `continuation`:
  held in periods where the deferral LP releases none, else under pressure), for every plan alike: a hold is
  committed for one period. Held for the whole horizon (move blocking), the reference's hold ran its work only
  as deadlines forced it, so any plan that released work out-scored it by tens of percent and carried its other
  levers past the Pareto gate (floors cut to 0 on the 70B pools: chat 17.9 % in PJM at feaa2ee);
- the published price of each step stays as the forecast carries it (day-ahead prices once published, the
  price forecast with its interval where not).

The horizon's outcome is one `PredictedOutcome` (sums of requests, GPU-hours, energy and cost; per-class
violation rates weighted by offered requests; the worst step's p99 times and peak power) with a terminal value:
deferrable work still carried at the horizon's end counts as served (its deadlines lie beyond the horizon),
at the marginal cost per request of the last step. gp/$_lo is the SLA-met requests over the cost each step's
worst demand scenario implies; the policy scores the steps after the first at their point forecast alone (no
spread there, 4x cheaper), so the spread is the first step's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from schemas.forecast import ClassOutcome, DisturbanceForecast, PredictedOutcome
from schemas.plan import BatchAdmission, Plan
from worldmodel.demand import deferred_waiting
from worldmodel.snapshot import FleetSnapshot, PoolState

Evaluate = Callable[[FleetSnapshot, Plan, DisturbanceForecast], PredictedOutcome]


@dataclass(frozen=True)
class HorizonSpec:
    """fine : leading periods stepped one at a time (count); block : periods per coarse block after them
    (count); periods : the horizon's length (count; the forecast's length when shorter)."""

    fine: int = 2
    block: int = 6
    periods: int = 36


def steps(n_forecasts: int, spec: HorizonSpec) -> list[tuple[int, int]]:
    """The horizon's steps as (first forecast index, periods).

    >>> steps(12, HorizonSpec(fine=3, block=3, periods=36))
    [(0, 1), (1, 1), (2, 1), (3, 3), (6, 3), (9, 3)]
    >>> steps(36, HorizonSpec())
    [(0, 1), (1, 1), (2, 6), (8, 6), (14, 6), (20, 6), (26, 6), (32, 4)]
    """
    n = min(n_forecasts, spec.periods)
    out = [(i, 1) for i in range(min(spec.fine, n))]
    i = spec.fine
    while i < n:
        out.append((i, min(spec.block, n - i)))
        i += spec.block
    return out


def _block_forecast(forecasts: Sequence[DisturbanceForecast], first: int, length: int) -> DisturbanceForecast:
    """The forecast of a block: its middle period's, stretched to the block's length."""
    f = forecasts[first + length // 2]
    return replace(f, period_start=forecasts[first].period_start, period_s=f.period_s * length)


def advance(snap: FleetSnapshot, plan: Plan, out: PredictedOutcome, period_s: float) -> FleetSnapshot:
    """The snapshot one step of `period_s` (s) later, as the step predicted it (module docstring): its queues
    empty, the deferrable work the step carried riding on the next step's forecast (`rollout`)."""
    pools = []
    for p in plan.pools:
        prev = snap.pool(p.key)
        n = round(out.pool_replicas.get(p.key, prev.warm + prev.loading if prev else p.replica_floor))
        pools.append(PoolState(
            p.site, p.model, p.gpu, n, 0, 0, p.tp, p.precision, float(p.sm_clock_mhz or 0), p.max_batch,
            running=prev.running if prev else 0.0, waiting=0.0,
            clock_eff_mhz=prev.clock_eff_mhz if prev else 0.0, kv_dtype=p.kv_dtype,
        ))  # fmt: skip
    queues = [replace(q, outstanding=0, oldest_wait_s=0.0, deadlines_s=()) for q in snap.queues]
    return replace(snap, as_of=snap.as_of + timedelta(seconds=period_s), pools=tuple(pools), queues=tuple(queues),
                   floors={p.key: p.replica_floor for p in plan.pools},
                   engine_args={p.key: (p.kv_dtype, p.max_num_batched_tokens) for p in plan.pools})  # fmt: skip


def _carried_deadlines(deadlines_s: tuple[float, ...], waiting: float, arrived: float, carried: float,
                       period_s: float) -> tuple[float, ...]:
    """The deadline sample (s from the step's end) of the deferrable work a step of `period_s` s carried: of the
    `waiting` requests it started with (their deadlines sampled by `deadlines_s`) and the `arrived` ones, the runtime
    serves the earliest deadlines first (EDF), so what is carried is the newest arrivals (deadlines beyond the
    sample: none listed) and the latest share of the waiting work.

    >>> _carried_deadlines((600.0, 1200.0, 3600.0, 7200.0), 400, 0, 200, 300.0)
    (3300.0, 6900.0)
    >>> _carried_deadlines((600.0, 7200.0), 400, 100, 500, 300.0), _carried_deadlines((600.0,), 400, 0, 0.2, 300.0)
    ((300.0, 6900.0), ())
    >>> _carried_deadlines((600.0, 7200.0), 400, 300, 300, 300.0)  # only new arrivals carried
    ()
    """
    left = min(carried - arrived, waiting)  # waiting requests still carried (count)
    if not deadlines_s or left < 0.5:
        return ()
    kept = sorted(deadlines_s)[-max(round(len(deadlines_s) * left / max(waiting, 1.0)), 1):]
    return tuple(d - period_s for d in kept)


@dataclass(frozen=True)
class Horizon:
    """A plan's predicted path: each step's (first period index, periods, outcome) and the whole horizon's."""

    steps: tuple[tuple[int, int, PredictedOutcome], ...]
    total: PredictedOutcome

    def path(self) -> list[dict[str, float]]:
        """Per step the audit record's predicted path: period offset, periods, replicas (count), GPU-hours,
        cost ($), SLA-met requests, carried deferrable requests."""
        return [{"period": i, "periods": n, "replicas": sum(o.pool_replicas.values()), "gpu_hours": o.gpu_hours,
                 "cost_usd": o.cost_usd, "sla_met": o.sla_met, "carried": o.deferred_carryover}
                for i, n, o in self.steps]  # fmt: skip


def continued(admissions: Sequence[BatchAdmission]) -> BatchAdmission:
    """The admission of a step that spans periods with `admissions`: deferrable work runs under pressure as soon
    as one of them releases any, else it is held.

    >>> continued((BatchAdmission.HOLD, BatchAdmission.IMMEDIATE)).value, continued((BatchAdmission.HOLD,)).value
    ('pressure', 'hold')
    """
    return BatchAdmission.HOLD if all(a == BatchAdmission.HOLD for a in admissions) else BatchAdmission.PRESSURE


def rollout(evaluate: Evaluate, snap: FleetSnapshot, plan: Plan, forecasts: Sequence[DisturbanceForecast],
            spec: HorizonSpec, deferrable: frozenset[str] = frozenset({"batch"}),
            later: Evaluate | None = None, continuation: Sequence[BatchAdmission] = ()) -> Horizon:
    """Score `plan` held over the horizon from `snap` (module docstring); `later` scores the steps after the
    first (default `evaluate`; the policy passes the point scenario alone there, 4x cheaper); `continuation`
    (per forecast period) admits deferrable work after the first step, as the decisions to come will re-plan it,
    for every plan alike (`continued`; empty: the plan's own admission throughout)."""
    outs: list[tuple[int, int, PredictedOutcome]] = []
    s = snap
    queue = next((q for q in snap.queues if q.request_class in deferrable), None)
    waiting, deadlines = deferred_waiting(forecasts[0], queue) if forecasts else (0.0, ())
    for i, n in steps(len(forecasts), spec):
        f = forecasts[i] if n == 1 else _block_forecast(forecasts, i, n)
        p = plan
        if outs:  # the carried deferrable work, as the previous step left it
            f = replace(f, deferred_backlog_requests=round(waiting), deferred_deadlines_s=deadlines)
            if continuation[i:i + n]:
                p = replace(plan, batch_admission=continued(continuation[i:i + n]))
        o = (evaluate if not outs or later is None else later)(s, p, f)
        outs.append((i, n, o))
        arrived = sum(c.offered for c in o.classes if c.request_class in deferrable)
        deadlines = _carried_deadlines(deadlines, waiting, arrived, o.deferred_carryover, f.period_s)
        waiting = o.deferred_carryover
        if o.deferred_carryover < 0.5 and all(g.drain for g in forecasts[i + n:spec.periods]):
            break  # the work is done and no more arrives: the drain ends, and the fleet's bill with it
        s = advance(s, plan, o, f.period_s)
    return Horizon(tuple(outs), total([o for _, _, o in outs]))


def total(outs: list[PredictedOutcome]) -> PredictedOutcome:
    """One outcome for the horizon: sums, offered-weighted violation rates, the worst tails, the terminal value."""
    classes: dict[str, list[ClassOutcome]] = {}
    for o in outs:
        for c in o.classes:
            classes.setdefault(c.request_class, []).append(c)

    def merged(cs: list[ClassOutcome]) -> ClassOutcome:
        offered = sum(c.offered for c in cs)
        w = [c.offered / offered if offered > 0 else 1.0 / len(cs) for c in cs]
        return ClassOutcome(cs[0].request_class, offered, sum(c.served for c in cs),
                            sum(x * c.violation_rate for x, c in zip(w, cs, strict=True)),
                            sum(x * c.violation_rate_hi for x, c in zip(w, cs, strict=True)),
                            max(c.ttft_p99_ms for c in cs), max(c.tpot_p99_ms for c in cs))  # fmt: skip

    last = outs[-1]
    carried = last.deferred_carryover
    per_request = last.cost_usd / max(last.sla_met, 1.0)  # marginal cost of carried work ($/request)
    per_request_owned = last.cost_usd_owned / max(last.sla_met, 1.0)
    sla_met = sum(o.sla_met for o in outs) + carried
    cost_usd = sum(o.cost_usd for o in outs) + carried * per_request
    cost_lo = sum(o.sla_met / o.gp_per_dollar_lo if o.gp_per_dollar_lo > 0 else o.cost_usd for o in outs)
    cost_lo += carried * per_request
    return PredictedOutcome(
        classes=tuple(merged(cs) for cs in classes.values()),
        gpu_hours=sum(o.gpu_hours for o in outs),
        energy_kwh=sum(o.energy_kwh for o in outs),
        energy_cost_usd=sum(o.energy_cost_usd for o in outs),
        cost_usd=cost_usd,
        cost_usd_owned=sum(o.cost_usd_owned for o in outs) + carried * per_request_owned,
        reloads=sum(o.reloads for o in outs),
        deferred_carryover=carried,
        peak_power_w=max(o.peak_power_w for o in outs),
        sla_met=sla_met,
        gp_per_dollar=sla_met / cost_usd if cost_usd > 0 else 0.0,
        gp_per_dollar_lo=sla_met / cost_lo if cost_lo > 0 else 0.0,
        notes=(f"horizon_steps={len(outs)}",),
        pool_replicas=outs[0].pool_replicas,
    )
