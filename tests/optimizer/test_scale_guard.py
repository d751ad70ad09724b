"""The scale-up guard (optimizer/scale_guard.py) on the ground truth: on an hour where the reference's backlog
trigger surges, production's plan under the guard serves the hour with fewer GPU-hours and more SLA-met requests
per dollar, and no class misses its SLA more often."""

from __future__ import annotations

import pytest

from optimizer.registry import create
from optimizer.scale_guard import GuardInputs, ScaleGuard
from schemas.fleet import default_fleet
from streams.replay.branching import live_replicas
from streams.replay.driver import RunResult, run_replay
from streams.replay.metrics import summarize
from streams.workload.builder import Workload, build_workload

pytestmark = pytest.mark.slow


def _run(guard: ScaleGuard | None, wl: Workload | None = None) -> RunResult:
    """Production's plan under `guard` on `wl` (default: ERCOT 2023's default window, 12 periods: the reference
    surges at periods 4-6, 70B: 9 -> 23)."""
    wl = wl or build_workload("ERCOT", 2023, periods=12, seed=0)
    return run_replay(wl, create("production"), default_fleet(), period_s=300.0,
                      intercept=lambda k, run, plan: (guard.apply(plan, GuardInputs(live_replicas(run))) if guard
                                                      else plan))


def test_the_guard_serves_a_surging_hour_cheaper_and_no_worse() -> None:
    ref, guarded = summarize(_run(None)), summarize(_run(ScaleGuard()))
    assert guarded["gpu_hours"] < 0.995 * ref["gpu_hours"]  # 92.7 against 93.6 GPU-hours (89.2 at target 0.7)
    assert guarded["gp_per_dollar"] > 1.03 * ref["gp_per_dollar"]  # 309.9 against 296.2 (321.6 at target 0.7)
    for c, v in ref["classes"].items():
        assert guarded["classes"][c]["sla_violation_rate"] <= v["sla_violation_rate"] + 1e-3, c



def test_on_the_owned_basis_the_guard_holds_more_and_serves_more_per_owned_dollar() -> None:
    """Capacity held costs only its energy on the owned basis, so the guard's target fitted there
    (`GUARD_TARGETS["owned"]`) holds a larger fleet: on a median-price hour (PJM 2022, the fit's year) it meets
    more requests, no class misses its SLA more often, and the owned gp/$ is higher than under the rented
    basis's target (798.4 against 771.1; above the energy break-even the rented target is taken, test_wiring)."""
    wl = build_workload("PJM", 2022, rule="median", periods=12, seed=0)
    rented, owned = summarize(_run(ScaleGuard(), wl)), summarize(_run(ScaleGuard(cost_basis="owned"), wl))
    assert owned["gpu_hours"] > rented["gpu_hours"]  # 163.5 against 110.5 GPU-hours
    assert owned["sla_met"] > 1.03 * rented["sla_met"]  # 203,976 against 195,522 (183,733 at rented target 0.7)
    assert owned["gp_per_dollar_owned"] > 1.03 * rented["gp_per_dollar_owned"]  # 798.4 against 771.1
    for c, v in rented["classes"].items():
        assert owned["classes"][c]["sla_violation_rate"] <= v["sla_violation_rate"] + 1e-3, c
