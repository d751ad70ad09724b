"""Deferral LP and capacity MILP on tiny instances whose optimum is checked by hand."""

from __future__ import annotations

import pytest
from opt_fakes import forecast, reference_plan

from optimizer.capacity_milp import SizingPool, size_capacity
from optimizer.deferral_lp import Cohort, plan_deferral, risk_adjusted_price, schedule_deferral
from schemas.forecast import Interval
from schemas.plan import BatchAdmission
from worldmodel.servingmodel import ServingModel

E = 1e-4  # MWh per request


def flat(*vals: float) -> list[Interval]:
    return [Interval(v, v, v, v, v) for v in vals]


def test_risk_adjusted_price():
    assert risk_adjusted_price(Interval(100, 80, 140, 60, 180), 0.5) == 120.0


def test_lp_holds_work_for_the_cheap_period():
    s = schedule_deferral([Cohort(10, 0, 1)], flat(100, 10), [100, 100], E)
    assert s.release == pytest.approx((0.0, 10.0), abs=1e-6)
    assert s.admission() == BatchAdmission.HOLD and s.late == pytest.approx(0.0, abs=1e-9)


def test_lp_runs_now_in_free_headroom_rather_than_pay_gpu_time_later():
    # energy alone says wait (100 -> 10 $/MWh saves 0.09 $ for 10 requests); later there is no headroom, so each
    # request would pay 0.05 $ of GPU time: releasing now into the free headroom is cheaper
    s = schedule_deferral([Cohort(10, 0, 1)], flat(100, 10), [100, 100], E, free_requests=[100, 0],
                          gpu_usd_per_request=0.05)
    assert s.release == pytest.approx((10.0, 0.0), abs=1e-6) and s.admission() == BatchAdmission.IMMEDIATE
    assert s.carry_usd_per_request == pytest.approx(E * 55.0 + 0.05)
    # without the GPU term the same case holds the work for the cheap period
    assert schedule_deferral([Cohort(10, 0, 1)], flat(100, 10), [100, 100], E).admission() == BatchAdmission.HOLD


def test_lp_spills_into_the_expensive_period_when_the_cheap_one_is_full():
    s = schedule_deferral([Cohort(10, 0, 1)], flat(100, 10), [100, 4], E)
    assert s.release == pytest.approx((6.0, 4.0), abs=1e-6)
    assert s.release_now_share == pytest.approx(0.6) and s.admission() == BatchAdmission.PRESSURE


def test_lp_runs_now_when_the_deadline_is_now():
    s = schedule_deferral([Cohort(10, 0, 0)], flat(100, 10), [100, 100], E)
    assert s.release == pytest.approx((10.0, 0.0), abs=1e-6) and s.admission() == BatchAdmission.IMMEDIATE


def test_lp_releases_now_when_prices_tie():
    s = schedule_deferral([Cohort(10, 0, 2)], flat(50, 50, 50), [100, 100, 100], E)
    assert s.release[0] == pytest.approx(10.0, abs=1e-6)


def test_lp_uses_the_risk_adjusted_price():
    # point says wait (90 later vs 100 now); the 80% upper bound of later (150) says run now
    prices = [Interval(100, 100, 100, 100, 100), Interval(90, 60, 150, 40, 200)]
    def admission(rho: float) -> str:
        return schedule_deferral([Cohort(5, 0, 1)], prices, [10, 10], E, risk_aversion=rho).admission()

    assert admission(0.0) == "hold" and admission(0.5) == "immediate"


def test_lp_defers_past_the_horizon_when_the_deadline_allows_and_counts_late_work():
    # deadline beyond the horizon: the tail price is the horizon mean (55) < 100 now, so wait
    s = schedule_deferral([Cohort(10, 0, 5)], flat(100, 10), [100, 0], E)
    assert s.release[0] == pytest.approx(0.0, abs=1e-6)
    late = schedule_deferral([Cohort(10, 0, 0)], flat(100, 10), [3, 100], E)
    assert late.release[0] == pytest.approx(3.0, abs=1e-6) and late.late == pytest.approx(7.0, abs=1e-6)


def test_plan_deferral_holds_before_a_price_drop():
    fcs = [forecast(price=300.0), *(forecast(price=20.0) for _ in range(11))]
    s = plan_deferral(fcs, reference_plan(), ServingModel(), (1800.0, 3600.0))
    assert s is not None and s.admission() == BatchAdmission.HOLD
    s = plan_deferral([forecast(price=20.0), *(forecast(price=300.0) for _ in range(11))], reference_plan(),
                      ServingModel(), (1800.0, 3600.0))
    assert s is not None and s.admission() == BatchAdmission.IMMEDIATE


def pool(name: str, rps: float, cost: float, tp: int = 1, prev: int = 0, power: float = 0.0, n_max: int = 8):
    return SizingPool(("s", "m", name), tp, rps, power, cost, prev, n_max)


INV = {("s", "H100"): 8, ("s", "A100"): 8}


def test_milp_picks_the_cheaper_capacity():
    # need 40 rps / 0.8 = 50 rps: H100 10 rps at $3 ($0.30 per rps), A100 4 rps at $1.5 ($0.375 per rps)
    # cheapest: 5 H100 = $15; 4 H100 + 3 A100 = $16.5; 3 H100 + 5 A100 = $16.5 -> 5 H100
    s = size_capacity([pool("H100", 10, 3.0), pool("A100", 4, 1.5)], {"m": 40.0}, INV, {}, {}, 16)
    assert s.replicas == {("s", "m", "H100"): 5, ("s", "m", "A100"): 0} and s.objective_usd_h == 15.0


def test_milp_inventory_forces_a_split():
    s = size_capacity([pool("H100", 10, 3.0, tp=4), pool("A100", 4, 1.5)], {"m": 40.0}, INV, {}, {}, 16)
    # only 2 H100 replicas (8 GPUs / tp 4) = 20 rps; the other 30 rps need 8 A100 replicas (32 rps)
    assert s.replicas == {("s", "m", "H100"): 2, ("s", "m", "A100"): 8}


def test_milp_power_cap_binds():
    # uncapped optimum 5 H100 ($15) draws 500 + 5,000 W > 4,000 W. With the cap: 3 H100 need 5 A100
    # (30 + 20 rps, 4,000 W, $16.5); 2 H100 need 8 A100 ($18); 1 H100 would need 10 A100 > inventory
    pools = [pool("H100", 10, 3.0, power=1000.0), pool("A100", 4, 1.5, power=100.0)]
    s = size_capacity(pools, {"m": 40.0}, INV, {"s": 4000.0}, {"s": 500.0}, 16)
    assert s.replicas == {("s", "m", "H100"): 3, ("s", "m", "A100"): 5} and s.objective_usd_h == 16.5


def test_milp_swap_budget_limits_change_and_shortfall_is_reported():
    s = size_capacity([pool("H100", 10, 3.0, prev=1)], {"m": 40.0}, INV, {}, {}, 2)
    assert s.replicas == {("s", "m", "H100"): 3} and s.shortfall_rps["m"] == pytest.approx(40.0 - 24.0)


def test_milp_infeasible_swap_returns_none():
    # 10 warm replicas on an 8-GPU inventory, swap budget 1: cannot get back inside the inventory
    assert size_capacity([pool("H100", 10, 3.0, prev=10, n_max=10)], {"m": 1.0}, INV, {}, {}, 1) is None


def test_over_a_3h_horizon_work_is_held_across_the_spike_and_released_after_the_published_drop():
    """36 five-minute periods: the (published) price stays at the spike's $4,000/MWh for 2 h, then falls to $70;
    with a 3 h deadline slack the LP holds now, releases nothing during the spike and everything after the drop,
    none of it late. With deadlines inside the spike it runs the work during the spike, in time."""
    spike, low = 24, 12
    fcs = [forecast(price=4000.0) for _ in range(spike)] + [forecast(price=70.0) for _ in range(low)]
    s = plan_deferral(fcs, reference_plan(), ServingModel(), (3.0 * 3600.0,))
    assert s is not None and s.admission() == BatchAdmission.HOLD
    assert sum(s.release[:spike]) == pytest.approx(0.0, abs=1e-6)
    assert sum(s.release[spike:]) > 0 and s.late == pytest.approx(0.0, abs=1e-6)
    s = plan_deferral(fcs, reference_plan(), ServingModel(), (1800.0,))  # due within the spike
    assert s is not None and sum(s.release[:spike]) > 0 and s.late == pytest.approx(0.0, abs=1e-6)
