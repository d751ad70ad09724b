"""Three-site mode: each site priced at its own market, residency learned from arrivals, placed candidates."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl
from opt_fakes import SERVING, TPOT_SLO_S, forecast

from forecasting.bundle import MarketForecaster
from optimizer.candidates import MOVE_SHARE, GenerationInputs, generate, site_prices
from optimizer.forecast_adapter import _Residency
from optimizer.levers import lever_space
from schemas.cost import CostConfig
from schemas.fleet import default_fleet
from schemas.forecast import Interval, MarketPrice
from schemas.plan import Plan, PoolPlan
from schemas.policy import History, Observations
from worldmodel.forward import ForwardModel
from worldmodel.snapshot import FleetSnapshot

FLEET3 = default_fleet()
T0 = datetime(2023, 4, 21, 18, tzinfo=UTC)


def plan_at(*sites: str) -> Plan:
    pools = tuple(
        p
        for s in sites
        for p in (
            PoolPlan(s, "llama-3.1-8b", "H100", 1, 8, 1, "bf16", 256, 1980),
            PoolPlan(s, "llama-3.1-70b", "H100", 1, 4, 4, "bf16", 256, 1980),
        )
    )
    return Plan(pools=pools, label="three-site reference")


def priced(pjm: float, ercot: float, caiso: float, pinned: dict | None = None, chat: float = 3.0):  # noqa: ANN201
    f = forecast(price=pjm, chat=chat)
    others = (MarketPrice("ERCOT", Interval(ercot, ercot, ercot, ercot, ercot), True),
              MarketPrice("CAISO", Interval(caiso, caiso, caiso, caiso, caiso), True))
    return replace(f, other_markets=others, pinned_share=pinned or {})


def test_forward_model_prices_each_site_at_its_market():
    fm = ForwardModel(SERVING, CostConfig(), inventory={(s.name, "H100"): 64 for s in FLEET3.sites},
                      site_markets={s.name: s.market for s in FLEET3.sites})
    snap = FleetSnapshot(as_of=T0, pools=(), queues=())
    f = priced(400.0, 20.0, 20.0)
    at_pjm = fm.evaluate(snap, plan_at("site-pjm"), f)
    at_ercot = fm.evaluate(snap, plan_at("site-ercot"), f)
    assert at_pjm.energy_kwh == at_ercot.energy_kwh  # same pools, same power
    assert at_pjm.energy_cost_usd > 10 * at_ercot.energy_cost_usd  # 400 vs 20 $/MWh
    same = fm.evaluate(snap, plan_at("site-ercot"), replace(f, other_markets=()))  # no ERCOT price: PJM's
    assert same.energy_cost_usd == at_pjm.energy_cost_usd


def test_forecaster_keeps_each_markets_prices_apart():
    hours = [T0 - timedelta(hours=h) for h in range(48, 0, -1)]
    rows = pl.DataFrame({
        "market": ["PJM"] * 48 + ["ERCOT"] * 48,
        "interval_start": hours * 2,
        "lmp_usd_mwh": [300.0] * 48 + [20.0] * 48,
        "published_at": [h + timedelta(hours=1) for h in hours] * 2,
    })
    empty = pl.DataFrame({"minute_at": [], "request_class": [], "requests": []})
    mf = MarketForecaster("PJM", horizon_periods=2, other_markets=("ERCOT",))
    mf.start(History(empty, pl.DataFrame(), rows), as_of=T0)
    first = mf.forecast(T0, 2)[0]
    assert abs(first.price_usd_mwh.point - 300.0) < 1.0
    (ercot,) = first.other_markets
    assert ercot.market == "ERCOT" and abs(ercot.price_usd_mwh.point - 20.0) < 1.0


def test_residency_shares_come_from_arrivals():
    res = _Residency()
    arrivals = pl.DataFrame({
        "model": ["llama-3.1-70b"] * 4 + ["llama-3.1-8b"] * 2,
        "allowed_regions": [["us-east"], ["us-east", "us-west"], ["us-west"], ["us-east"], ["us-east"], None],
    })
    res.update(Observations(T0, 1, arrivals, pl.DataFrame(), pl.DataFrame(), pl.DataFrame(), pl.DataFrame()))
    assert res.shares() == {("llama-3.1-70b", "us-east"): 0.5, ("llama-3.1-70b", "us-west"): 0.25,
                            ("llama-3.1-8b", "us-east"): 0.5}


def inputs(f) -> GenerationInputs:  # noqa: ANN001
    ref = plan_at("site-pjm", "site-ercot", "site-caiso")
    return GenerationInputs(
        fleet=FLEET3, space=lever_space(FLEET3, ref.pools, clock_levels=1), reference=ref, previous=ref,
        forecasts=(f,) * 3, price_history_usd_mwh=(50.0, 100.0), tpot_slo_s=TPOT_SLO_S, admission=None,
        swap_budget=16, serving=SERVING, site_placement=True,
    )


def test_placed_plans_keep_only_pinned_work_at_the_pricier_sites():
    f = priced(400.0, 20.0, 60.0, pinned={("llama-3.1-70b", "us-east"): 0.3}, chat=40.0)
    prices = site_prices(inputs(f))
    assert prices["site-ercot"] == 20.0 and prices["site-caiso"] == 60.0 and prices["site-pjm"] >= 400.0
    placed = next(p for p in generate(inputs(f)) if p.label == "reference@cheap-site")
    assert [p.site for p in placed.pools] == ["site-ercot"] * 2 + ["site-caiso"] * 2 + ["site-pjm"] * 2
    for p in placed.pools:
        if p.site != "site-ercot":  # nothing known to run there: the pinned floor, no growth beyond it
            assert p.replica_ceiling == p.replica_floor
    pjm70 = next(p for p in placed.pools if p.site == "site-pjm" and p.model == "llama-3.1-70b")
    assert pjm70.replica_floor > 1  # 30% of the 70B demand may only run in us-east
    caiso70 = next(p for p in placed.pools if p.site == "site-caiso" and p.model == "llama-3.1-70b")
    assert caiso70.replica_floor == 1  # nothing pinned to us-west: the reference's floor
    running = {("site-pjm", "llama-3.1-70b", "H100"): 6, ("site-ercot", "llama-3.1-70b", "H100"): 2}
    plans = generate(replace(inputs(f), current_replicas=running))
    moving = next(p for p in plans if p.label == "reference@cheap-site")
    pjm70 = next(p for p in moving.pools if p.site == "site-pjm" and p.model == "llama-3.1-70b")
    ercot70 = next(p for p in moving.pools if p.site == "site-ercot" and p.model == "llama-3.1-70b")
    assert pjm70.replica_ceiling == 6  # may shrink, not grow
    assert ercot70.replica_floor == 2 + math.ceil(MOVE_SHARE * (6 - pjm70.replica_floor))  # started at the cheap site


PLACED = "@cheap-site"  # the suffix optimizer.candidates._placed gives every placed plan's label


def _placed_labels(plans: list[Plan]) -> list[str]:
    return [p.label for p in plans if p.label.endswith(PLACED)]


def test_placed_plans_only_when_asked_and_with_several_sites():
    f = priced(400.0, 20.0, 60.0)
    asked = generate(inputs(f))
    assert "reference@cheap-site" in _placed_labels(asked)  # asked, three sites: placed plans come out
    plain = generate(replace(inputs(f), site_placement=False))
    assert plain and _placed_labels(plain) == []
    # the same candidates, unplaced: every placed label is an unplaced plan's label plus the suffix
    assert {lbl.removesuffix(PLACED) for lbl in _placed_labels(asked)} <= {p.label for p in plain}


def test_one_site_gets_no_placed_plans():
    f = forecast()
    ref = plan_at("site-pjm")
    inp = replace(inputs(f), reference=ref, previous=ref, space=lever_space(FLEET3, ref.pools, clock_levels=1))
    assert inp.site_placement  # placement asked for: only the single site rules it out
    plans = generate(inp)
    assert plans and _placed_labels(plans) == []
    assert all({p.site for p in plan.pools} == {"site-pjm"} for plan in plans)
