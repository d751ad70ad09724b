"""The ground-truth side of the imposed-action test: streams.replay.imposed.realize."""

from __future__ import annotations

import argparse
from dataclasses import replace

import polars as pl
import pytest

from schemas.plan import Plan
from streams.replay.imposed import realize, realized_periods, run_window
from streams.replay.metrics import summarize
from streams.replay.validate_cli import RealizedPeriod

PERIOD_S = 300.0
#: replicas pinned per (model, gpu) in the fixed-capacity plan (fits the default site: 62 H100 + 16 A100 GPUs)
FIXED = {("llama-3.1-8b", "H100"): 2, ("llama-3.1-70b", "H100"): 15, ("llama-3.1-70b", "A100"): 2}


def _args(periods: int = 2) -> argparse.Namespace:
    return argparse.Namespace(
        year=2023,
        window_rule="max",
        start=None,
        periods=periods,
        period_minutes=PERIOD_S / 60.0,
        seed=0,
        source="protocol",
    )


@pytest.fixture(scope="module")
def logged():
    """The logging policy's run of a two-period PJM window, and its realized periods."""
    run, plans = run_window("PJM", None, _args())
    return run, list(realized_periods(run, plans, PERIOD_S))


@pytest.fixture(scope="module")
def fixed_plan(logged) -> Plan:
    _, periods = logged
    base = periods[0].plan
    pools = tuple(
        replace(p, replica_floor=FIXED.get((p.model, p.gpu), 0), replica_ceiling=FIXED.get((p.model, p.gpu), 0))
        for p in base.pools
    )
    return replace(base.with_pools(pools), autoscale=False, label="fixed")


@pytest.fixture(scope="module")
def imposed(fixed_plan):
    return list(realize("PJM", fixed_plan, _args()))


def test_one_realized_period_per_control_period(logged):
    run, periods = logged
    assert len(periods) == run.periods >= 2
    assert [p.period_index for p in periods] == list(range(run.periods))
    assert all(isinstance(p, RealizedPeriod) for p in periods)
    for p in periods:
        assert (p.observations.as_of - run.workload.window.start).total_seconds() == (p.period_index + 1) * PERIOD_S
    # window periods carry arrivals and per-class outcomes; drain periods none
    for p in periods[:2]:
        assert p.observations.arrivals.height > 0
        assert set(p.classes) == {"code", "chat", "batch"}
        assert sum(c.offered for c in p.classes.values()) == p.observations.arrivals.height
        assert all(0.0 <= c.violation_rate <= 1.0 for c in p.classes.values())


def test_arrivals_carry_no_output_length(logged):
    _, periods = logged
    for p in periods:
        assert not any("output" in c for c in p.observations.arrivals.columns)
        assert p.observations.arrivals.filter(pl.col("arrived_at") > p.observations.as_of).height == 0


def test_period_energy_and_cost_reconcile_with_the_run(logged):
    run, periods = logged
    total = summarize(run)
    assert sum(p.energy_kwh for p in periods) == pytest.approx(total["energy_mwh"] * 1000.0, rel=1e-9)
    assert sum(p.cost_usd for p in periods) == pytest.approx(total["cost_usd"], rel=1e-9)
    assert all(p.energy_kwh > 0 and p.cost_usd > 0 for p in periods)


def test_realized_outcomes_match_the_run(logged):
    run, periods = logged
    total = summarize(run)
    for cls, figures in total["classes"].items():
        offered = sum(p.classes[cls].offered for p in periods if cls in p.classes)
        violated = sum(p.classes[cls].offered * p.classes[cls].violation_rate for p in periods if cls in p.classes)
        assert offered == figures["offered"]
        assert violated == pytest.approx(figures["offered"] - figures["sla_met"], abs=1e-6)


def test_imposed_fixed_capacity_is_respected(imposed, fixed_plan):
    assert all(p.plan is fixed_plan for p in imposed)
    tel = pl.concat([p.observations.telemetry for p in imposed], how="vertical_relaxed")
    per_tick = tel.group_by("event_at", "model_name", "modelName").agg(pl.col("uuid").n_unique().alias("gpus"))
    for (model, gpu), replicas in FIXED.items():
        tp = fixed_plan.pool("site-pjm", model, gpu).tp
        got = per_tick.filter((pl.col("model_name") == model) & (pl.col("modelName") == gpu))["gpus"]
        assert got.len() > 0
        assert (got == replicas * tp).all(), (model, gpu, got.unique().to_list())
    others = {(m, g) for m, g in tel.select("model_name", "modelName").unique().iter_rows()} - set(FIXED)
    assert not others
