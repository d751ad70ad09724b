"""The reference policies do what DESIGN.md says they do: their plans, and their effect in the ground truth.

production: bf16, vLLM V1's default max_num_seqs per GPU type (H100 1024, A100 256), maximum clock, an HPA-like
autoscaler (target 80%, 300 s scale-down stabilization), prefix-aware routing, EDF, batch deferred only under
pressure. naive: a static fleet, FCFS, round-robin, batch at once. production-tuned: the deployed policy with a
best static configuration and a price rule that holds deferrable work while the price exceeds the past week's
90th percentile.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from optimizer.registry import create
from schemas.fleet import DEFAULT_TP, SM_CLOCK_RANGE_MHZ, GpuType, default_fleet, default_max_num_seqs
from schemas.plan import BatchAdmission, Ordering, Plan, Routing
from schemas.policy import Observations, PolicyContext
from streams.replay.driver import RunResult, run_replay
from streams.replay.tuning import lead_in_fleet
from streams.workload.builder import Workload, build_workload

MARKET = "PJM"
PERIOD_S = 300.0
STEP_UP_S, DROP_S, END_S = 300.0, 600.0, 1500.0  # load doubles at 300 s, stops at 600 s, run to 1500 s


def _ctx(wl: Workload) -> PolicyContext:
    return PolicyContext(
        fleet=default_fleet((MARKET,)),
        markets=(MARKET,),
        window_start=wl.window.start,
        period_s=PERIOD_S,
        periods=3,
        seed=wl.seed,
    )


def _obs(wl: Workload, k: int, prices: pl.DataFrame | None = None) -> Observations:
    empty = pl.DataFrame()
    return Observations(
        as_of=wl.window.start + timedelta(seconds=k * PERIOD_S),
        period_index=k,
        arrivals=empty,
        completions=empty,
        telemetry=empty,
        fleet_events=empty,
        prices=prices if prices is not None else empty,
    )


@pytest.fixture(scope="module")
def wl() -> Workload:
    return build_workload(MARKET, 2023, periods=3, seed=0)


@pytest.fixture(scope="module")
def step_wl() -> Workload:
    """The default window's first 10 minutes with arrivals doubled in the second 5 (each request of
    [300, 600) s cloned 1 ms later), and no arrivals after 600 s."""
    base = build_workload(MARKET, 2023, periods=4, seed=0)
    head = base.requests.filter(pl.col("arrival_s") < DROP_S)
    clones = head.filter(pl.col("arrival_s") >= STEP_UP_S).with_columns(
        pl.col("arrival_s") + 1e-3, pl.col("deadline_s") + 1e-3, pl.col("request_id") + "-clone"
    )
    return replace(base, requests=pl.concat([head, clones]).sort("arrival_s", maintain_order=True))


@pytest.fixture(scope="module")
def step_runs(step_wl: Workload) -> dict[str, RunResult]:
    fleet = default_fleet((MARKET,))
    # start from the fleet the lead-in hour left running, as the replay harness does
    initial = lead_in_fleet(MARKET, step_wl.window.start, fleet, seed=step_wl.seed)
    return {
        name: run_replay(step_wl, create(name), fleet, window_s=END_S, initial_replicas=initial)
        for name in ("production", "naive")
    }


def _site_gpus(run: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """(tick time s, GPUs warm or loading) of the single site."""
    logs = run.runtime.logs
    n = int(logs.n_site[0])
    return logs.site_t[:n], logs.site_gpus[:n]


# --- plans ----------------------------------------------------------------------------------------------


def test_production_plan_is_as_deployed(wl: Workload) -> None:
    policy = create("production")
    first = policy.start(_ctx(wl), wl.history)
    steady = policy.plan(_obs(wl, 1))
    site = default_fleet((MARKET,)).site(MARKET)
    for plan in (first, steady):
        assert plan.autoscale and plan.autoscale_target == pytest.approx(0.8)
        assert (plan.routing, plan.ordering, plan.batch_admission) == (
            Routing.PREFIX_LOAD,
            Ordering.EDF,
            BatchAdmission.PRESSURE,
        )
        for p in plan.pools:
            g = GpuType(p.gpu)
            assert (p.precision, p.kv_dtype, p.sm_clock_mhz) == ("bf16", "auto", SM_CLOCK_RANGE_MHZ[g][1])
            assert p.max_batch == default_max_num_seqs(g) == {"H100": 1024, "A100": 256}[g]  # vLLM V1 default
            assert p.replica_ceiling == site.gpus(g) // DEFAULT_TP[(p.model, g)]  # the autoscaler may use it all
    assert sum(p.replica_floor for p in first.pools) > 2  # starts at the fleet the HPA had reached
    assert all(p.replica_floor <= 1 for p in steady.pools)  # then the HPA decides


def test_naive_plan_is_static(wl: Workload) -> None:
    policy = create("naive")
    first = policy.start(_ctx(wl), wl.history)
    assert not first.autoscale
    assert (first.routing, first.ordering, first.batch_admission) == (
        Routing.ROUND_ROBIN,
        Ordering.FCFS,
        BatchAdmission.IMMEDIATE,
    )
    assert all(p.replica_floor == p.replica_ceiling for p in first.pools)
    assert sum(p.replica_floor for p in first.pools) > 0
    assert all(p.max_batch == default_max_num_seqs(p.gpu) for p in first.pools)  # the engine's default cap
    for k in range(1, 4):
        assert policy.plan(_obs(wl, k)) == first


# --- behaviour in the ground truth ----------------------------------------------------------------------


@pytest.mark.slow  # step_runs: three replays of a 4-period window
def test_production_autoscaler_scales_with_load(step_runs: dict[str, RunResult], step_wl: Workload) -> None:
    """The same start without the doubled arrivals holds fewer GPUs while the step lasts."""
    fleet = default_fleet((MARKET,))
    control_wl = replace(step_wl, requests=step_wl.requests.filter(~pl.col("request_id").str.ends_with("-clone")))
    initial = lead_in_fleet(MARKET, step_wl.window.start, fleet, seed=step_wl.seed)
    control = run_replay(control_wl, create("production"), fleet, window_s=END_S, initial_replicas=initial)
    t, g = _site_gpus(step_runs["production"])
    tc, gc = _site_gpus(control)
    during, during_control = g[(t > STEP_UP_S) & (t <= DROP_S)].mean(), gc[(tc > STEP_UP_S) & (tc <= DROP_S)].mean()
    assert during > during_control, (during, during_control)
    assert g[(t > DROP_S + 600)].mean() < 0.5 * during  # and gives the GPUs back once the load is gone


def _replicas_by_model(run: RunResult) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(tick time s, replicas warm or loading) per model, from the emitted telemetry."""
    rt, logs = run.runtime, run.runtime.logs
    n = int(logs.n_tel[0])
    t, model = logs.tel_t[:n], np.array([k[1] for k in rt.pool_keys])[rt.rep.pool[logs.tel_rep[:n]]]
    ticks = np.unique(logs.site_t[: int(logs.n_site[0])])
    return {m: (ticks, np.array([((t == x) & (model == m)).sum() for x in ticks])) for m in set(model)}


@pytest.mark.slow
def test_production_scale_down_waits_for_the_stabilization_window(step_runs: dict[str, RunResult]) -> None:
    """HPA semantics: a model's replicas never shrink within 300 s of that model last scaling up (the
    scale-up means the recommendation was at least that high inside the stabilization window)."""
    shrinks = 0
    for ticks, count in _replicas_by_model(step_runs["production"]).values():
        last_up = -np.inf
        for k in range(1, len(count)):
            if count[k] > count[k - 1]:
                last_up = ticks[k]
            elif count[k] < count[k - 1]:
                shrinks += 1
                assert ticks[k] >= last_up + 300.0 - 15.0 - 10.0, (ticks[k], last_up)  # 15 s sync, 10 s tick
    assert shrinks, "never scaled down after the load stopped"


@pytest.mark.slow
def test_naive_keeps_a_static_fleet(step_runs: dict[str, RunResult]) -> None:
    run = step_runs["naive"]
    t, g = _site_gpus(run)
    assert g.size and (g == g[0]).all() and g[0] > 0  # same GPUs through the load step and the idle tail
    logs = run.runtime.logs
    n_ev = int(logs.n_ev[0])
    assert (logs.ev_t[:n_ev] == 0.0).all()  # replicas started at t=0 (prewarmed), none since


def test_naive_round_robin_spreads_load(wl: Workload) -> None:
    run = run_replay(wl, create("naive"), default_fleet((MARKET,)))
    req = run.runtime.req
    for m in np.unique(req.model):
        served = np.bincount(req.rep[(req.model == m) & (req.rep >= 0)])
        served = served[served > 0]
        assert served.size >= 2
        assert served.max() <= 1.25 * served.min(), (m, served)


def test_tuned_price_rule_holds_batch_above_p90(wl: Workload) -> None:
    policy = create("production-tuned")
    first = policy.start(_ctx(wl), wl.history)
    week = wl.history.prices.filter(pl.col("interval_start") >= wl.window.start - timedelta(days=7))
    p90 = float(week["lmp_usd_mwh"].quantile(0.9))
    start = wl.window.start

    cols = week.select("interval_start", "lmp_usd_mwh", "published_at").schema

    def priced(lmp: float, k: int) -> Plan:
        """The plan after a price record for the current hour, published at the period's close."""
        as_of = start + timedelta(seconds=k * PERIOD_S)
        rec = pl.DataFrame(
            {"interval_start": [as_of - timedelta(minutes=1)], "lmp_usd_mwh": [lmp], "published_at": [as_of]},
            schema=cols,
        )
        return policy.plan(_obs(wl, k, rec))

    assert priced(p90 * 1.5 + 10.0, 1).batch_admission == BatchAdmission.HOLD
    assert priced(p90 * 0.5 - 10.0, 2).batch_admission != BatchAdmission.HOLD
    # the window is the year's most expensive 3 h, so the first plan already holds
    assert wl.window.mean_price_usd_mwh > p90
    assert first.batch_admission == BatchAdmission.HOLD


@pytest.mark.slow  # two replays
def test_tuned_price_rule_defers_batch_work(wl: Workload) -> None:
    """In the year's most expensive window, production-tuned dispatches batch work only near its deadline
    (within the release margin); production as deployed dispatches it at once."""
    fleet = default_fleet((MARKET,))
    waits = {}
    slack = {}
    for name in ("production", "production-tuned"):
        run = run_replay(wl, create(name), fleet)
        req = run.runtime.req
        b = req.cls == 2
        assert np.isfinite(req.done[b]).all()
        waits[name] = float(np.median(req.dispatched[b] - req.arrival[b]))
        slack[name] = float(np.median(req.deadline[b] - req.dispatched[b]))
    margin = run.runtime.physics.release_margin_s
    assert waits["production"] < 60.0
    assert waits["production-tuned"] > 1800.0 - margin  # the shortest deadline is 30 min
    assert slack["production-tuned"] <= margin + 1.0
