"""Counterfactual branching on the ground truth: what a plan realizes, against what other plans would have.

A branch forks the run's runtime at a period boundary t0 (`SiteRuntime.fork`: every array copied, the
same future arrivals and sizes, no random numbers in the engine), applies one plan for the decided period
[t0, t0 + period), then the continuation (the production reference's plans, closed loop through the
runtime's autoscaler, at the decided plan's engine restart settings: `keep_engine`) for H more periods, and
then on, in DRAIN_STEP_S steps, until every request that arrived in [t0, t0 + (1 + H) period) has finished or
is past the last instant it could still meet its SLA, at most DRAIN_CAP_S after the H periods (requests still
open then count as unmet; `unresolved` says how many). Its value is

    value = sla_met + served_after - g* x cost

with sla_met over those requests, served_after the SLA-met requests that arrived after them and finished
within the branch, cost (GPU-hours + energy on the run's cost basis, streams/replay/metrics `cost_between`)
over (t0, end of the branch], and g* the strongest reference's gp/$ over the whole window. Arrivals go on
while a branch drains inside the window, so a branch whose requests resolve later (work held for a later
price, a slower fleet) pays its fleet for longer, serving others' requests too: counting what that service
earns makes the extra time cost only what it falls short of g*, where charging it without its service cost
a plan that held batch work for one period 2.5 times the gp/$ of the plan that ran it (ruler at e2c31a7,
PJM seed 0 period 2: 474 against 1,208).
Definitions: docs/metrics.md "Counterfactual branching". This module runs the ground truth and is an
oracle's tool: the planner (optimizer/) never imports it.

Noise replicates: the ground truth is chaotic at the branch's scale. A plan 1 MHz off production's clock (a
0.05 % change of decode speed) realizes gp/$ differences over a branch with a spread (sd) of 14.5 % over 33 decisions
(`benchmarks/branch_noise.py`): which replica a burst lands on, and when the autoscaler fires, turn on
sub-millisecond event order. A single branch therefore ranks plans partly by noise that no record could predict,
and an oracle picking the best of K single branches picks noise too. Replicate r > 0 of a branch shifts every
request not yet arrived at the fork later by under NOISE_S (order kept; arrival timestamps are recorded in ms,
so no record tells replicates apart); replicate 0 is the realization itself. `branch_mean` averages a plan's
replicates 1..R, each paired with the same shifts for every plan it is compared with, and leaves the
realization out: a plan chosen on them is chosen on what the future's records say, not on the realization's own
event order, which the committed plan then meets unselected (R = 0: the realization alone, ruler v2's branch).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from optimizer.lever_spread import SPREAD_K
from optimizer.margins import FAMILY_FIELDS
from schemas.cost import CostConfig
from schemas.fleet import SM_CLOCK_RANGE_MHZ, GpuType
from schemas.plan import Plan, PoolPlan
from schemas.protocol import CLASSES
from streams.replay.driver import RunResult
from streams.replay.metrics import cost_between, request_outcomes
from worldmodel.groundtruth import state as st

#: a pool's engine restart settings (a change reloads its replicas): the continuation keeps the decided plan's
ENGINE_FIELDS = (*FAMILY_FIELDS["precision"][1], *FAMILY_FIELDS["tokens"][1])
#: continuation periods after the decided one (H)
DEFAULT_H = 2
#: the longest a branch runs on after its H continuation periods for its requests to resolve (s)
DRAIN_CAP_S = 3600.0
#: step of that drain (s)
DRAIN_STEP_S = 60.0
#: the per-class SLA gate of the hindsight arm: violation rate within production's + 0.1 pp
SLA_SLACK = 0.001
#: hindsight candidates per period (at least)
DEFAULT_K = SPREAD_K
#: two-stage screening: stage 1 runs every candidate over the decided period only (H = 0, no drain);
#: stage 2 runs the SCREEN_TOP best of stage 1 (and production, the gate's baseline) at full H
SCREEN_TOP = 3
#: and the SCREEN_RESTART_TOP best of stage 1 among the plans that restart an engine (`restarts`): a restart's
#: reload falls inside the screened period, what it buys after it, so the one-period screen ranks them last
SCREEN_RESTART_TOP = 1
#: the largest arrival shift of a noise replicate (s): below the ms resolution of recorded arrival times
NOISE_S = 1e-3
#: noise replicates per branched plan (replicates 1..R; 0: the realization alone)
DEFAULT_REPLICATES = 4
#: sampled decisions per run for realized regret (all of them when the window has fewer)
REGRET_SAMPLES = 30

Continuation = Plan | Sequence[Plan] | Callable[[int], Plan]


@dataclass(frozen=True)
class Branch:
    """One branch's outcome. value = sla_met + served_after - g* x cost (requests); gp_per_dollar =
    (sla_met + served_after) / cost. sla_met, requests and violation are over the branch's set; served_after
    counts the SLA-met requests that arrived after the set and finished within the branch (module docstring)."""

    label: str
    value: float
    sla_met: int
    requests: int
    cost_usd: float
    gp_per_dollar: float
    violation: dict[str, float]
    t0: float
    end_s: float
    unresolved: int
    H: int
    wall_s: float

    replicates: int = 1
    value_sd: float = 0.0
    served_after: int = 0

    def passes(self, baseline: Branch, slack: float = SLA_SLACK) -> bool:
        """Per-class violation rate within the baseline branch's + slack (classes absent from a set pass)."""
        return all(v <= baseline.violation.get(c, 1.0) + slack for c, v in self.violation.items())

    @staticmethod
    def mean(branches: Sequence[Branch]) -> Branch:
        """The replicates of one plan's branch averaged: value, SLA-met, requests, cost, per-class violation
        (means); gp/$ = mean SLA-met / mean cost; value_sd the replicates' spread (requests)."""
        b0 = branches[0]
        if len(branches) == 1:
            return b0
        met = float(np.mean([b.sla_met for b in branches]))
        after = float(np.mean([b.served_after for b in branches]))
        usd = float(np.mean([b.cost_usd for b in branches]))
        classes = {c for b in branches for c in b.violation}
        return replace(
            b0,
            value=float(np.mean([b.value for b in branches])),
            sla_met=round(met),
            requests=round(float(np.mean([b.requests for b in branches]))),
            cost_usd=usd,
            gp_per_dollar=(met + after) / usd if usd > 0 else math.inf,
            violation={c: float(np.mean([b.violation.get(c, 0.0) for b in branches])) for c in sorted(classes)},
            end_s=max(b.end_s for b in branches),
            unresolved=max(b.unresolved for b in branches),
            wall_s=sum(b.wall_s for b in branches),
            replicates=len(branches),
            value_sd=float(np.std([b.value for b in branches])),
            served_after=round(after),
        )


def _continuation(continuation: Continuation, j: int, decided: Plan) -> Plan:
    """The continuation's plan for the j-th period after the decided one (j >= 1), at the decided plan's
    engine settings (`keep_engine`)."""
    if isinstance(continuation, Plan):
        plan = continuation
    elif callable(continuation):
        plan = continuation(j)
    else:
        plan = continuation[min(j - 1, len(continuation) - 1)]
    return keep_engine(plan, decided)


def keep_engine(plan: Plan, decided: Plan) -> Plan:
    """`plan` with each pool's engine restart settings (ENGINE_FIELDS) taken from `decided`'s pool of the same
    key (pools `decided` does not hold unchanged): the continuation schedules capacity, routing, batching and
    clock as its policy would, and does not undo a restart the decision paid for (nor make the branch pay one
    the decision did not choose).

    >>> from schemas.plan import PoolPlan
    >>> cont = Plan((PoolPlan("s", "m", "H100", 1, 8, 4, "bf16", 1024, 1980),), label="production")
    >>> decided = Plan((PoolPlan("s", "m", "H100", 2, 2, 4, "fp8", 256, 1600, "fp8", 2048),))
    >>> q = keep_engine(cont, decided).pools[0]
    >>> (q.precision, q.kv_dtype, q.max_num_batched_tokens), (q.replica_floor, q.max_batch, q.sm_clock_mhz)
    (('fp8', 'fp8', 2048), (1, 1024, 1980))
    """
    by_key = {p.key: p for p in decided.pools}
    pools = tuple(replace(p, **{f: getattr(by_key[p.key], f) for f in ENGINE_FIELDS}) if p.key in by_key else p
                  for p in plan.pools)  # fmt: skip
    return plan.with_pools(pools)


def restarts(plan: Plan, running: Plan) -> bool:
    """Whether `plan` changes an engine restart setting (ENGINE_FIELDS) of a pool `running` holds.

    >>> from schemas.plan import PoolPlan
    >>> bf16 = Plan((PoolPlan("s", "m", "H100", 1, 8, 256, "bf16", 1024, 1980),))
    >>> restarts(bf16, bf16), restarts(keep_engine(bf16, Plan((replace(bf16.pools[0], precision="fp8"),))), bf16)
    (False, True)
    """
    by_key = {p.key: p for p in running.pools}
    return any(getattr(p, f) != getattr(by_key[p.key], f) for p in plan.pools if p.key in by_key
               for f in ENGINE_FIELDS)  # fmt: skip


def sla_dead_s(run: RunResult) -> np.ndarray:
    """Per request, the instant after which, unfinished, it can no longer meet its SLA (s): a batch request's
    deadline; an interactive one's arrival + TTFT SLO + TPOT SLO x (output tokens - 1) (ground truth)."""
    rt = run.runtime
    req = rt.req
    decode = np.where(req.out > 1, rt.slo_tpot_s * np.maximum(req.out - 1, 1), 0.0)
    inter = req.arrival + rt.slo_ttft_s + decode
    return np.where(req.cls == CLASSES.index("batch"), req.deadline, inter)


def branch_value(
    run: RunResult,
    plan: Plan,
    continuation: Continuation,
    t0: float,
    period_s: float,
    H: int,
    g_star: float,
    *,
    cost: CostConfig | None = None,
    basis: str = "rented",
    drain: bool = True,
    cap_s: float = DRAIN_CAP_S,
    label: str | None = None,
    open_at_t0: bool = True,
    noise: int = 0,
) -> Branch:
    """Fork `run`'s runtime (which must stand at the period boundary t0), serve `plan` for the decided period
    and the continuation after it; return the branch's value and gp/$ (module docstring). The run is not
    touched. drain False stops at t0 + (1 + H) period (the short screen). open_at_t0: the requests still open
    at t0 (arrived earlier, unfinished, not yet past their last SLA-meeting instant) belong to the branch's
    set too (the decision serves them); False keeps only the arrivals of the 1 + H periods. noise: the noise
    replicate (module docstring; 0 the realization)."""
    t_wall = time.perf_counter()
    if abs(run.runtime.now - t0) > 1e-6:
        raise ValueError(f"the runtime stands at {run.runtime.now} s, not at the fork point {t0} s")
    rt = run.runtime.fork()
    if noise:
        shift_arrivals(rt.req, int(rt.si[st.S_ARR_PTR]), noise)
    br = replace(run, runtime=rt, policy=label or plan.label, decisions=[], decision_ms=[], plans=[],
                 plan_by_period={}, observations=None)  # fmt: skip
    req = rt.req
    t_h = t0 + (1 + H) * period_s
    in_set = (req.arrival >= t0) & (req.arrival < t_h)
    if open_at_t0:
        in_set |= (req.arrival < t0) & np.isnan(req.done) & (sla_dead_s(br) > t0)
    rt.apply_plan(plan)
    for j in range(1, H + 1):
        rt.advance(t0 + j * period_s)
        rt.apply_plan(_continuation(continuation, j, plan))
    rt.advance(t_h)
    t = t_h
    if drain:
        dead = sla_dead_s(br)[in_set]
        j = H + 1
        while t < t_h + cap_s:
            open_ = np.isnan(req.done[in_set]) & (dead > t)
            if not open_.any():
                break
            t = min(t + DRAIN_STEP_S, t_h + cap_s)
            boundary = t0 + j * period_s
            if t >= boundary:  # the continuation's next period starts: apply its plan there
                rt.advance(boundary)
                rt.apply_plan(_continuation(continuation, j, plan))
                j += 1
            rt.advance(t)
    o = request_outcomes(br)
    met = o["sla_met"][in_set]
    unresolved = int((np.isnan(req.done[in_set]) & (sla_dead_s(br)[in_set] > t)).sum())
    c = cost_between(br, t0, t, cost)
    usd = c["cost_usd_owned"] if basis == "owned" else c["cost_usd"]
    cls = o["cls"][in_set]
    violation = {name: float(1.0 - met[cls == k].mean()) for k, name in enumerate(CLASSES) if (cls == k).any()}
    n_met = int(met.sum())
    n_after = int(o["sla_met"][(req.arrival >= t_h) & (req.done <= t)].sum())
    return Branch(
        label=label or plan.label,
        value=n_met + n_after - g_star * usd,
        sla_met=n_met,
        requests=int(in_set.sum()),
        cost_usd=usd,
        gp_per_dollar=(n_met + n_after) / usd if usd > 0 else math.inf,
        violation=violation,
        t0=t0,
        end_s=t,
        unresolved=unresolved,
        H=H if drain else 0,
        wall_s=time.perf_counter() - t_wall,
        served_after=n_after,
    )


def noise_shifts(n: int, noise: int) -> np.ndarray:
    """The shifts (s) of a noise replicate's `n` not-yet-arrived requests: sorted draws in [0, NOISE_S) of seed
    `noise`, so arrival order is kept.

    >>> s = noise_shifts(5, noise=1)
    >>> bool(np.all(np.diff(s) >= 0) and s.max() < NOISE_S)
    True
    """
    return np.sort(np.random.default_rng(noise).uniform(0.0, NOISE_S, n))


def shift_arrivals(req: st.Requests, first: int, noise: int) -> None:
    """Shift requests first.. (not yet arrived) later by sorted draws in [0, NOISE_S) of seed `noise`, in place:
    arrival order kept, an interactive request's TTFT deadline moved with its arrival.

    >>> import numpy as np
    >>> from worldmodel.groundtruth.state import Requests
    >>> r = Requests(np.array([0.0, 1.0, 1.0, 2.0]), np.array([0, 0, 2, 1]), *([np.zeros(4)] * 16))
    >>> deadline = r.deadline.copy()
    >>> shift_arrivals(r, 1, noise=3)
    >>> bool(r.arrival[0] == 0.0 and np.all(np.diff(r.arrival) >= 0) and np.all(r.arrival[1:] - [1, 1, 2] < 1e-3))
    True
    >>> (r.deadline - deadline)[2] == 0.0, bool((r.deadline - deadline)[1] > 0)
    (np.True_, True)
    """
    n = req.arrival.shape[0] - first
    if n <= 0:
        return
    shift = noise_shifts(n, noise)
    req.arrival[first:] += shift
    inter = req.cls[first:] != CLASSES.index("batch")
    req.deadline[first:] += np.where(inter, shift, 0.0)


def branch_mean(
    run: RunResult,
    plan: Plan,
    continuation: Continuation,
    t0: float,
    period_s: float,
    H: int,
    g_star: float,
    *,
    replicates: int = 0,
    **kw: Any,
) -> Branch:
    """branch_value over noise replicates 1 .. replicates, averaged (Branch.mean); 0: the realization alone."""
    return Branch.mean([branch_value(run, plan, continuation, t0, period_s, H, g_star, noise=r, **kw)
                        for r in noise_seeds(replicates)])  # fmt: skip


def noise_seeds(replicates: int) -> tuple[int, ...]:
    """The noise replicates a branch averages: 1 .. replicates, or the realization (0) alone.

    >>> noise_seeds(3), noise_seeds(0)
    ((1, 2, 3), (0,))
    """
    return tuple(range(1, replicates + 1)) or (0,)


# --- null plans: the noise floor of a comparison ---------------------------------------------------------


def null_variants(plan: Plan) -> list[tuple[str, Plan]]:
    """(label, plan) of plans around `plan` whose true effect is nil or nearly so: every pool's SM clock 1 or 5 MHz
    under its maximum (decode 0.05 % or 0.25 % slower at most) and its batch cap one sequence higher. Branched
    against `plan`, what separates them is the ground truth's noise (benchmarks/branch_noise.py; the regret
    audit's floor, streams/replay/hindsight.py)."""
    def clock_under_max(p: PoolPlan, mhz: int) -> PoolPlan:
        return replace(p, sm_clock_mhz=SM_CLOCK_RANGE_MHZ[GpuType(p.gpu)][1] - mhz)

    pools = plan.with_pools
    return [
        ("null:clock-1mhz", pools(tuple(clock_under_max(p, 1) for p in plan.pools))),
        ("null:clock-5mhz", pools(tuple(clock_under_max(p, 5) for p in plan.pools))),
        ("null:batch+1", pools(tuple(replace(p, max_batch=p.max_batch + 1) for p in plan.pools))),
    ]


# --- the hindsight arm's candidate plans ------------------------------------------------------------------


def live_replicas(run: RunResult) -> dict[tuple[str, str, str], int]:
    """Replicas warm or loading per pool key in the run's runtime now."""
    rt = run.runtime
    live = (rt.rep.state == st.WARM) | (rt.rep.state == st.LOADING)
    counts = np.bincount(rt.rep.pool[live], minlength=len(rt.pool_keys))
    return {key: int(counts[p]) for p, key in enumerate(rt.pool_keys)}


# --- the comparison at one decision ------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Every branch of one decision: stage-1 screens (H = 0) and stage-2 full branches (H, drained)."""

    screened: dict[str, Branch]
    full: dict[str, Branch]

    def best(self, gate: str | None = None) -> tuple[str, Branch]:
        """The full branch of highest value (with gate, among those passing the SLA gate against it)."""
        pool = self.full.items()
        if gate is not None:
            pool = [(k, b) for k, b in pool if b.passes(self.full[gate])]
        return max(pool, key=lambda kb: kb[1].value)


def compare(
    run: RunResult,
    plans: Sequence[tuple[str, Plan]],
    continuation: Continuation,
    t0: float,
    period_s: float,
    H: int,
    g_star: float,
    *,
    always: Sequence[str] = (),
    top: int = SCREEN_TOP,
    restart_top: int = SCREEN_RESTART_TOP,
    cost: CostConfig | None = None,
    basis: str = "rented",
    replicates: int = 0,
    known: Comparison | None = None,
) -> Comparison:
    """Two-stage: every plan over the decided period only; then the `top` best of that screen, the `restart_top`
    best of it among the plans that restart an engine the run ran the period before (`restarts`), and the `always`
    labels at full H with the drain, averaged over `replicates` noise replicates (the screen on the first of them
    alone). `known`: branches already run for some labels, of the same plans at the same decision and settings
    (an earlier comparison's), reused instead of run again."""
    kw: dict[str, Any] = {"cost": cost, "basis": basis}
    done = known or Comparison({}, {})
    screened = {lbl: done.screened.get(lbl) or branch_mean(run, p, continuation, t0, period_s, 0, g_star,
                                                           drain=False, label=lbl, replicates=min(replicates, 1), **kw)
                for lbl, p in plans}  # fmt: skip
    ranked = sorted(screened, key=lambda lbl: screened[lbl].value, reverse=True)
    by_label = dict(plans)
    running = run.plan_by_period.get(round(t0 / period_s) - 1)
    restarting = [lbl for lbl in ranked if running is not None and restarts(by_label[lbl], running)]
    keep = list(dict.fromkeys([*always, *ranked[:top], *restarting[:restart_top]]))
    full = {lbl: done.full.get(lbl) or branch_mean(run, by_label[lbl], continuation, t0, period_s, H, g_star,
                                                   label=lbl, replicates=replicates, **kw)
            for lbl in keep}  # fmt: skip
    return Comparison(screened, full)


def regret(best: float, chosen: float) -> float:
    """(best - chosen) / |best|, 0 when the chosen plan is the best (or best is 0 and chosen is not worse)."""
    if chosen >= best:
        return 0.0
    return (best - chosen) / abs(best) if best != 0 else math.inf


def arrival_periods(arrival_s: np.ndarray, period_s: float) -> int:
    """Periods from the window start through the last arrival's (those whose decisions serve new requests)."""
    return int(np.floor(float(np.max(arrival_s)) / period_s)) + 1 if np.size(arrival_s) else 0


def sample_periods(periods: int, seed: int, n: int = REGRET_SAMPLES) -> list[int]:
    """The decisions audited for realized regret: n of the window's periods 1 .. periods - 1, drawn by the
    workload seed (all of them when there are fewer)."""
    pool = list(range(1, periods))
    if len(pool) <= n:
        return pool
    rng = np.random.default_rng(seed + 0x5EED)
    return sorted(int(k) for k in rng.choice(pool, size=n, replace=False))
