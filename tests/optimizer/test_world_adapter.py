"""The planner's world model adapter: the engine a pool runs is read from the fleet where it reports it."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl

from optimizer.world_adapter import engine_args
from schemas.cost import CostConfig
from schemas.forecast import ClassDemand, DisturbanceForecast, Interval
from schemas.plan import Plan, PoolPlan
from worldmodel.forward import ForwardModel
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import snapshot
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn

T0 = datetime(2023, 7, 1, tzinfo=UTC)
POOL = ("PJM-1", "llama-3.1-70b", "H100")


def _fleet(kv: str | None):
    """Four fp8 replicas of the 70B model whose fleet events report the KV dtype `kv` (None: never reported)."""
    ws = WorldState.open(":memory:")
    ev = syn.fleet_events(T0 - timedelta(minutes=10), 4, precision="fp8")
    ws.update({"fleet_event": ev.with_columns(pl.lit(kv, pl.String).alias("kv_cache_dtype"))})
    return snapshot(ws, T0)


def _plan(kv: str) -> Plan:
    return Plan((PoolPlan(*POOL, 4, 8, 4, "fp8", 256, 1980, kv),), autoscale=False)


def _reloads(snap, running: Plan, candidate: Plan) -> int:
    iv = Interval(5.0, 4.0, 6.0, 3.0, 7.0)
    fc = DisturbanceForecast(T0, 300.0, (ClassDemand("chat", "llama-3.1-70b", iv, 1000, 250, 2500, 600, 0.2),),
                             Interval(50.0, 40.0, 60.0, 30.0, 70.0), False, 0.8)  # fmt: skip
    fm = ForwardModel(ServingModel(), CostConfig())
    return fm.evaluate(replace(snap, engine_args=engine_args(snap, running)), candidate, fc).reloads


def test_the_kv_dtype_the_fleet_reports_decides_a_restart_not_a_stale_plan() -> None:
    """The operator runs an fp8 KV cache though the plan the planner last recommended said "auto": keeping fp8 is
    no restart and going to "auto" restarts all four replicas. Where the fleet never reports the dtype, the running
    plan's stands in."""
    stale = _plan("auto")
    reported = _fleet("fp8")
    assert engine_args(reported, stale)[POOL] == ("fp8", None)
    assert _reloads(reported, stale, _plan("fp8")) == 0
    assert _reloads(reported, stale, _plan("auto")) == 4
    silent = _fleet(None)
    assert silent.pool(POOL).kv_dtype is None
    assert _reloads(silent, stale, _plan("fp8")) == 4
    assert _reloads(silent, stale, _plan("auto")) == 0
