"""The autoscaler's surges: counted from the fleet's replica starts, priced for plans that leave them room."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from schemas.cost import CostConfig
from schemas.forecast import ClassDemand, DisturbanceForecast, Interval
from schemas.plan import Plan, PoolPlan
from worldmodel.forward import ForwardModel
from worldmodel.servingmodel import PoolConfig, ServingModel
from worldmodel.snapshot import FleetSnapshot, PoolState, snapshot, surge_rate
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn

T0 = datetime(2023, 7, 1, tzinfo=UTC)
SITE = "PJM-1"
M70 = "llama-3.1-70b"


def _starts(at: datetime, n: int, first: int, arrived: datetime | None = None) -> pl.DataFrame:
    ev = syn.fleet_events(at, n, kind="replica_started").with_columns(
        pl.Series("replica_id", [f"r-{first + i:03d}" for i in range(n)]))
    return ev.with_columns(pl.lit(arrived or at).cast(ev["arrived_at"].dtype).alias("arrived_at"))


def test_surges_are_counted_from_replica_starts_that_had_arrived():
    ws = WorldState.open(":memory:")
    ws.update({"fleet_event": pl.concat([
        _starts(T0, 6, 0),  # the bring-up: the first bucket is no surge
        _starts(T0 + timedelta(minutes=20), 5, 10),  # a surge
        _starts(T0 + timedelta(minutes=40), 2, 20),  # a step, not a surge
        _starts(T0 + timedelta(minutes=50), 6, 30, arrived=T0 + timedelta(minutes=70)),  # not arrived by as_of
    ])})  # fmt: skip
    snap = snapshot(ws, T0 + timedelta(minutes=60))
    assert snap.surge_rate_per_s[M70] == pytest.approx(surge_rate(1, 3600.0))
    later = snapshot(ws, T0 + timedelta(minutes=75))  # the late surge has arrived
    assert later.surge_rate_per_s[M70] == pytest.approx(surge_rate(2, 4500.0))


def _forecast() -> DisturbanceForecast:
    iv = Interval(10.0, 8.0, 12.0, 6.0, 14.0)
    return DisturbanceForecast(T0, 300.0, (ClassDemand("chat", M70, iv, 1000, 250, 2500, 600, 0.2),),
                               Interval(50.0, 40.0, 60.0, 30.0, 70.0), False, 0.8)  # fmt: skip


def _plan(ceiling: int, autoscale: bool = True) -> Plan:
    return Plan((PoolPlan(SITE, M70, "H100", 4, ceiling, 4, "bf16", 256, 1980),), autoscale=autoscale)


def test_a_plan_leaving_the_autoscaler_room_pays_for_its_surges():
    fm = ForwardModel(ServingModel(), CostConfig(), inventory={(SITE, "H100"): 64})
    calm = FleetSnapshot(T0, (PoolState(SITE, M70, "H100", 4, 0, 0, 4, "bf16", 1980.0, 256),), ())
    surging = replace(calm, surge_rate_per_s={M70: 2.0 / 3600.0})
    f = _forecast()
    wide, tight, static = _plan(16), _plan(4), _plan(16, autoscale=False)
    assert fm.evaluate(calm, wide, f).pool_replicas == fm.evaluate(calm, tight, f).pool_replicas
    assert fm.evaluate(calm, wide, f).gpu_hours == pytest.approx(fm.evaluate(calm, tight, f).gpu_hours)
    # 2 surges an hour: 1/6 in the period, each holding 12 more replicas (48 GPUs) for the load + 300 s
    added = fm.evaluate(surging, wide, f).gpu_hours - fm.evaluate(calm, wide, f).gpu_hours
    load_s = ServingModel().load_s(PoolConfig("H100", M70, 4, "bf16", 1980.0))
    assert added == pytest.approx(min(300.0 / 1800.0 * (load_s + 300.0), 300.0) * 48 / 3600.0)
    assert fm.evaluate(surging, wide, f).cost_usd > fm.evaluate(surging, tight, f).cost_usd
    for plan in (tight, static):  # no room above the count, or no autoscaler: nothing to surge into
        assert fm.evaluate(surging, plan, f).gpu_hours == pytest.approx(fm.evaluate(calm, plan, f).gpu_hours)



def test_after_a_surge_the_surplus_goes_once_the_stabilization_window_has_run():
    fm = ForwardModel(ServingModel(), CostConfig(), inventory={(SITE, "H100"): 64})
    surged = PoolState(SITE, M70, "H100", 14, 0, 0, 4, "bf16", 1980.0, 256)  # 14 replicas for ~4 replicas' load

    def replicas(age_s: float) -> float:
        snap = FleetSnapshot(T0, (replace(surged, warm_age_s=age_s),), ())
        plan = Plan((PoolPlan(SITE, M70, "H100", 1, 16, 4, "bf16", 256, 1980),))
        return fm.evaluate(snap, plan, _forecast()).pool_replicas[(SITE, M70, "H100")]

    assert replicas(0.0) == 14  # the scale-up just ended: the window spans the period
    assert 1 < replicas(600.0) < replicas(150.0) < 14  # none of the period held, or half of it
    assert replicas(150.0) == pytest.approx((14 + replicas(600.0)) / 2)  # time-averaged
