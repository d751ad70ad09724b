"""One replay: a workload at one site under one policy, period by period, through the drain.

At each period close the policy receives only the observations that arrived in that period and returns
the next plan; the runtime serves every request under it. Nothing is dropped: every offered request ends
completed or unfinished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import polars as pl

from schemas.fleet import FleetSpec
from schemas.plan import Plan
from schemas.policy import Policy, PolicyContext
from schemas.protocol import CLASSES
from streams.datasets.prices import load_prices
from streams.workload.builder import Workload
from streams.workload.history import history_prices
from worldmodel.groundtruth.observe import ObservationStream
from worldmodel.groundtruth.runtime import Physics, SiteRuntime


@dataclass
class RunResult:
    """Raw outcome of one replay, before costing (metrics.summarize turns it into results.json figures)."""

    market: str
    policy: str
    seed: int
    workload: Workload
    runtime: SiteRuntime
    end_s: float
    periods: int
    site_prices: tuple[pl.DataFrame, ...]
    decisions: list[dict[str, Any]] = field(default_factory=list)
    decision_ms: list[float] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    #: the Plan applied at each period boundary (period index -> plan; 0 is the start plan)
    plan_by_period: dict[int, Plan] = field(default_factory=dict)
    observations: dict[str, list[pl.DataFrame]] | None = None
    wall_s: float = 0.0


def _market_prices(workload: Workload, market: str) -> pl.DataFrame:
    """Price records of a market over the workload's span (its own market's are in the workload)."""
    if market == workload.window.market:
        return workload.prices
    lo, hi = workload.prices["interval_start"].min(), workload.prices["interval_end"].max()
    years = sorted({lo.year, hi.year})
    return load_prices(market, years).filter((pl.col("interval_start") >= lo) & (pl.col("interval_end") <= hi))


def drain_limit_s(workload: Workload, window_s: float, grace_s: float) -> float:
    """Latest end of the drain: every deadline (the window end for interactive work) passed by grace_s."""
    dl = workload.requests["deadline_s"].drop_nulls()
    latest = max(window_s, float(dl.max()) if dl.len() else window_s)
    return latest + grace_s


def run_replay(
    workload: Workload,
    policy: Policy,
    fleet: FleetSpec,
    *,
    period_s: float = 300.0,
    window_s: float | None = None,
    grace_s: float = 3600.0,
    physics: Physics | None = None,
    keep_observations: bool = False,
    on_period: Callable[[int], None] | None = None,
    all_sites: bool = False,
    initial_replicas: dict[tuple[str, str, str], int] | None = None,
    stop_at_s: float | None = None,
    intercept: Callable[[int, RunResult, Plan], Plan] | None = None,
) -> RunResult:
    """Replay `workload` under `policy` at its market's site, or with all_sites at every site of the fleet
    (the three-site mode: one shared workload, residency by tenant); return the raw run.

    initial_replicas : the fleet running at window start per (site, model, gpu), handed to the policy's
    context (see tuning.lead_in_fleet); stop_at_s : stop there instead of draining (s since window start);
    intercept : called at each period boundary k >= 1 after the policy decided and before the plan is applied,
    with the run (its runtime at the boundary, its decisions holding the policy's record of this one) and the
    policy's plan; the plan it returns is the one applied and recorded (streams/replay/branching.py: the
    realized-regret audit returns it unchanged, the hindsight arm replaces it)."""
    t_wall = time.perf_counter()
    market = workload.window.market
    sites = fleet.sites if all_sites else (fleet.site(market),)
    window_s = (
        window_s if window_s is not None else (workload.window.end - workload.window.start).total_seconds()
    )
    start = workload.window.start
    rt = SiteRuntime(sites, workload.requests, physics)
    site_prices = tuple(_market_prices(workload, s.market) for s in sites)
    prices = pl.concat(site_prices, how="vertical_relaxed")
    stream = ObservationStream(rt, start, sites[0].name if len(sites) == 1 else "router", prices)
    periods = int(round(window_s / period_s))
    ctx = PolicyContext(
        fleet=fleet if all_sites else FleetSpec(sites),  # the sites served: a market's run sees no other's inventory
        markets=tuple(s.market for s in sites),
        window_start=start,
        period_s=period_s,
        periods=periods,
        seed=workload.seed,
        sla=workload_sla(workload),
        initial_replicas=dict(initial_replicas or {}),
    )
    run = RunResult(market, policy.name, workload.seed, workload, rt, 0.0, 0, site_prices)
    t0 = time.perf_counter()
    history = workload.history
    if len(sites) > 1:  # every site's market: the prices each had published by the window start
        since = start - timedelta(days=7)
        history = replace(history, prices=pl.concat([history_prices(p, since, start) for p in site_prices],
                                                    how="vertical_relaxed"))
    plan = policy.start(ctx, history)
    run.decision_ms.append((time.perf_counter() - t0) * 1000.0)
    _record_decision(run, policy)
    _record_plan(run, plan, 0)
    rt.apply_plan(plan, prewarm=True)
    limit = drain_limit_s(workload, window_s, grace_s)
    if stop_at_s is not None:
        limit = min(limit, stop_at_s)
    n_req = workload.requests.height
    k = 0
    prev_as_of = start
    kept: dict[str, list[pl.DataFrame]] = {
        "arrivals": [],
        "completions": [],
        "telemetry": [],
        "fleet_events": [],
        "prices": [],
    }
    while True:
        t_end = (k + 1) * period_s
        rt.advance(t_end)
        k += 1
        if on_period:
            on_period(k)
        done_all = int(rt.logs.n_completed[0]) == n_req
        if (t_end >= window_s and done_all) or t_end >= limit:
            break
        as_of = start + timedelta(seconds=t_end)
        # frames built when the policy reads them (the reference policies read the prices at most)
        obs = stream.observe(as_of, k, t_end, prev_as_of if k > 1 else None)
        if keep_observations:
            for name in kept:
                kept[name].append(getattr(obs, name))
        prev_as_of = as_of
        t0 = time.perf_counter()
        plan = policy.plan(obs)
        run.decision_ms.append((time.perf_counter() - t0) * 1000.0)
        _record_decision(run, policy)  # before the intercept, which may read it (the regret audit's refused plan)
        if intercept is not None:
            plan = intercept(k, run, plan)
        _record_plan(run, plan, k)
        rt.apply_plan(plan)
    run.end_s = rt.now
    run.periods = k
    if keep_observations:
        kept["arrivals"].append(stream.arrivals(rt.now))
        kept["completions"].append(stream.completions())
        kept["telemetry"].append(stream.telemetry())
        kept["fleet_events"].append(stream.fleet_events())
        run.observations = kept
    run.wall_s = time.perf_counter() - t_wall
    return run


def _record_decision(run: RunResult, policy: Policy) -> None:
    rec = policy.last_decision()
    if rec is not None:
        run.decisions.append(rec)


def _record_plan(run: RunResult, plan: Plan, k: int) -> None:
    run.plans.append({"period": k, "label": plan.label})
    run.plan_by_period[k] = plan


def workload_sla(workload: Workload) -> dict[str, dict[str, float | None]]:
    """The SLA of each class the workload holds, as the policies' context carries it (ms; None: deferrable)."""
    req = workload.requests
    out: dict[str, dict[str, float | None]] = {}
    for cls in CLASSES:
        sub = req.filter(pl.col("request_class") == cls).head(1)
        if sub.height:
            out[cls] = {"ttft_ms": sub["sla_ttft_ms"][0], "tpot_ms": sub["sla_tpot_ms"][0]}
    return out
