"""The autoscaler's scale-down after a scale-up, once its stabilization window has run."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from schemas.cost import CostConfig
from schemas.forecast import ClassDemand, DisturbanceForecast, Interval
from schemas.plan import Plan, PoolPlan
from worldmodel.forward import ForwardModel
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import FleetSnapshot, PoolState, snapshot
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn

T0 = datetime(2023, 7, 1, tzinfo=UTC)
SITE = "PJM-1"
M70 = "llama-3.1-70b"


def _forecast() -> DisturbanceForecast:
    iv = Interval(10.0, 8.0, 12.0, 6.0, 14.0)
    return DisturbanceForecast(T0, 300.0, (ClassDemand("chat", M70, iv, 1000, 250, 2500, 600, 0.2),),
                               Interval(50.0, 40.0, 60.0, 30.0, 70.0), False, 0.8)  # fmt: skip


def test_after_a_surge_the_surplus_goes_once_the_stabilization_window_has_run():
    fm = ForwardModel(ServingModel(), CostConfig(), inventory={(SITE, "H100"): 64})
    surged = PoolState(SITE, M70, "H100", 14, 0, 0, 4, "bf16", 1980.0, 256)  # 14 replicas for ~4 replicas' load

    def replicas(age_s: float) -> float:
        snap = FleetSnapshot(T0, (replace(surged, warm_age_s=age_s),), ())
        plan = Plan((PoolPlan(SITE, M70, "H100", 1, 16, 4, "bf16", 256, 1980),))
        return fm.evaluate(snap, plan, _forecast()).pool_replicas[(SITE, M70, "H100")]

    assert replicas(0.0) == 14  # the scale-up just ended: the window spans the period
    assert 1 < replicas(299.0) < replicas(150.0) < 14  # almost none of the period held, or half of it
    assert replicas(150.0) == pytest.approx((14 + replicas(300.0 - 1e-9)) / 2, rel=1e-6)  # time-averaged
    assert replicas(600.0) == 14  # the window ran out before and the fleet stayed: the runtime's metric holds it


def test_the_snapshot_dates_the_last_scale_up_by_the_newest_ready_replica():
    ws = WorldState.open(":memory:")
    late = syn.fleet_events(T0 + timedelta(seconds=200), 2).with_columns(pl.Series("replica_id", ["r-010", "r-011"]))
    ws.update({"fleet_event": pl.concat([syn.fleet_events(T0, 4), late])})
    assert snapshot(ws, T0 + timedelta(seconds=320)).pools[0].warm_age_s == pytest.approx(120.0)
    assert snapshot(ws, T0 + timedelta(seconds=100)).pools[0].warm_age_s == pytest.approx(100.0)  # not yet ready
