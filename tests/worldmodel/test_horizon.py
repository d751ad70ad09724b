"""The planner's horizon (worldmodel/horizon.py): a plan held over several periods, the fleet carried between them.

A release (ceilings cut to one replica under light load) against holding the fleet: the horizon predicts the
release's replicas falling and its GPU-hours and cost below the hold's over the periods after the first, and the
ground truth, serving a light hour under the same two plans, realizes the same direction."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import polars as pl
import pytest

from optimizer.registry import create
from schemas.cost import CostConfig
from schemas.fleet import default_fleet
from schemas.plan import BatchAdmission, Plan
from schemas.policy import History, Observations, Policy, PolicyContext
from streams.replay.driver import run_replay
from streams.replay.metrics import summarize
from streams.workload.builder import build_workload
from tests.worldmodel.test_forward import _forecast, _plan
from tests.worldmodel.test_forward import world as world  # noqa: F401 - the fixture
from worldmodel.forward import ForwardModel
from worldmodel.horizon import HorizonSpec, rollout, steps
from worldmodel.servingmodel import ServingModel


def _hold_and_release(plan: Plan, live: int) -> tuple[Plan, Plan]:
    """The fleet held at `live` replicas per pool (no autoscaling) and released to at most one replica per pool."""
    hold = replace(plan.with_pools(tuple(replace(p, replica_floor=live, replica_ceiling=live) for p in plan.pools)),
                   autoscale=False, label="hold")  # fmt: skip
    release = replace(plan.with_pools(tuple(replace(p, replica_floor=0, replica_ceiling=1) for p in plan.pools)),
                      label="release")  # fmt: skip
    return hold, release


def test_a_release_predicted_over_the_horizon(world) -> None:  # noqa: ANN001, F811
    _, snap = world  # 4 warm replicas per pool
    fm = ForwardModel(ServingModel(), CostConfig())
    light = tuple(replace(_forecast(scale=0.05), period_start=snap.as_of + timedelta(minutes=5 * k))
                  for k in range(12))  # fmt: skip
    hold, release = _hold_and_release(_plan(n70=4, n8=4), 4)
    spec = HorizonSpec(fine=3, block=3, periods=12)
    h_hold = rollout(fm.evaluate, snap, hold, light, spec)
    h_rel = rollout(fm.evaluate, snap, release, light, spec)
    assert [n for _, n, _ in h_rel.steps] == [1, 1, 1, 3, 3, 3]
    # the cut ceilings bind at once and carry through every step; the held fleet stays at 8 replicas
    assert all(sum(o.pool_replicas.values()) <= 2 for _, _, o in h_rel.steps)
    assert all(sum(o.pool_replicas.values()) == 8 for _, _, o in h_hold.steps)
    assert h_rel.total.gpu_hours < h_hold.total.gpu_hours
    assert h_rel.total.cost_usd < h_hold.total.cost_usd
    assert h_rel.total.gp_per_dollar > h_hold.total.gp_per_dollar


def test_the_horizon_ends_with_the_drain(world) -> None:  # noqa: ANN001, F811
    """After the window (no arrivals forecast) the rollout stops once the held work is served: the fleet's bill
    ends with the work, as the replay's does, so a plan that drains slowly is not scored against a fast one's
    idle hours."""
    _, snap = world
    fm = ForwardModel(ServingModel(), CostConfig())
    deadlines = tuple(3600.0 + 360.0 * k for k in range(20))  # 1-3 h
    drain = tuple(replace(_forecast(scale=0.0, backlog=20000 if k == 0 else 0, deadlines=deadlines if k == 0 else ()),
                          period_start=snap.as_of + timedelta(minutes=5 * k)) for k in range(36))  # fmt: skip
    hold, release = _hold_and_release(_plan(n70=4, n8=4), 4)
    spec = HorizonSpec()
    h_hold = rollout(fm.evaluate, snap, hold, drain, spec)
    h_rel = rollout(fm.evaluate, snap, release, drain, spec)
    assert h_hold.steps[-1][2].deferred_carryover < 0.5
    assert len(h_hold.steps) < len(h_rel.steps) <= len(steps(36, spec))
    assert h_hold.total.gpu_hours == pytest.approx(sum(o.gpu_hours for _, _, o in h_hold.steps))
    assert h_hold.total.gpu_hours < 8 * 4 * 5 * 36 / 60  # not the held fleet over the whole 3 h


def test_the_decisions_to_come_release_what_the_committed_period_holds(world) -> None:  # noqa: ANN001, F811
    """A hold is committed for one period: with the continuation the held work runs under pressure from the next
    step on, so the horizon does not score a hold kept for 3 h against a release (the decisions to come re-plan
    it); without one the hold stands throughout and carries the work to the horizon's end."""
    _, snap = world
    fm = ForwardModel(ServingModel(), CostConfig())
    deadlines = tuple(7200.0 + 180.0 * k for k in range(20))  # 2-3 h
    fcs = tuple(replace(_forecast(scale=0.2, backlog=3000 if k == 0 else 0, deadlines=deadlines if k == 0 else ()),
                        period_start=snap.as_of + timedelta(minutes=5 * k)) for k in range(12))  # fmt: skip
    hold = replace(_plan(n70=4, n8=4), batch_admission=BatchAdmission.HOLD)
    spec = HorizonSpec(fine=2, block=5, periods=12)
    kept = rollout(fm.evaluate, snap, hold, fcs, spec)
    released = rollout(fm.evaluate, snap, hold, fcs, spec, continuation=(BatchAdmission.PRESSURE,) * 12)
    assert released.steps[0][2] == kept.steps[0][2]  # the committed period is the plan's own
    assert kept.steps[-1][2].deferred_carryover > 3000
    assert released.total.deferred_carryover < 0.5 < kept.total.deferred_carryover


class _Fixed(Policy):
    """Serves one plan for the whole window: production's pools with floors and ceilings from `shape`."""

    def __init__(self, shape: str, live: int) -> None:
        self.name, self.shape, self.live = shape, shape, live
        self._plan: Plan | None = None

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        hold, release = _hold_and_release(create("production").start(ctx, history), self.live)
        self._plan = hold if self.shape == "hold" else release
        return self._plan

    def plan(self, obs: Observations) -> Plan:
        assert self._plan is not None
        return self._plan


@pytest.mark.slow
def test_the_ground_truth_realizes_the_release_in_the_same_direction() -> None:
    wl = build_workload("PJM", 2023, periods=6, seed=0)
    light = wl.requests.filter(pl.col("request_id").hash(7) % 50 == 0)  # 2 % of the arrivals: a light hour
    wl = replace(wl, requests=light)
    fleet = default_fleet(("PJM",))
    live = {(s.name, m, g.gpu): 4 for s in fleet.sites for g in s.groups for m in ("llama-3.1-70b", "llama-3.1-8b")}
    out = {}
    for shape in ("hold", "release"):
        run = run_replay(wl, _Fixed(shape, 4), fleet, period_s=300.0, initial_replicas=live)
        out[shape] = summarize(run)
    assert out["release"]["gpu_hours"] < out["hold"]["gpu_hours"]
    assert out["release"]["cost_usd"] < out["hold"]["cost_usd"]
    assert out["release"]["gp_per_dollar"] > out["hold"]["gp_per_dollar"]
