"""The aurelius policy on its REAL components (optimizer/wiring.py): the forecasting facade, the in-memory
world state with self-calibration and the forward model, on observation frames the ground-truth replay
emitted. Checks: a decision comes out with its audit record and the scenario's fallback; no leakage (a decision
as of t is unchanged when the workload the policy is built from and every observation after t are perturbed);
the oracle provider is flagged and reads the realized future; the cached capacity MILP agrees with the
reference formulation; the replay CLI's factory builds every arm."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import UTC, timedelta
from pathlib import Path

import polars as pl
import pytest

from optimizer.aurelius import AURELIUS_ARMS, START_FALLBACK, AureliusPolicy
from optimizer.forecast_adapter import ForecastingProvider, OracleForecastProvider, realized_series
from optimizer.registry import create
from optimizer.wiring import build_policy
from optimizer.world_adapter import WorldStateModel
from schemas.fleet import default_fleet
from schemas.policy import Observations
from streams.replay.driver import run_replay
from streams.workload.builder import Workload, build_workload
from worldmodel.horizon import HorizonSpec, steps

MARKET = "PJM"
PERIODS = 3  # window periods with arrivals; the policy decides at periods 1..PERIODS
DECIDE_AT = 2  # the decision checked for leakage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wl() -> Workload:
    return build_workload(MARKET, 2023, periods=PERIODS, seed=0)


@pytest.fixture(scope="module")
def stream(wl: Workload):
    """The observation frames a cheap reference run delivered, period by period, plus its context."""
    fleet = default_fleet((MARKET,))
    seen: dict[str, object] = {}

    class Recorder:
        def __init__(self) -> None:
            self.inner = create("production")
            self.name = "production"
            self.obs: list[Observations] = []

        def start(self, ctx, history):  # noqa: ANN001, ANN201
            seen["ctx"], seen["history"] = ctx, history
            return self.inner.start(ctx, history)

        def plan(self, obs):  # noqa: ANN001, ANN201
            if obs.period_index <= PERIODS + 1:
                self.obs.append(obs)
            return self.inner.plan(obs)

        def last_decision(self):  # noqa: ANN201
            return None

    rec = Recorder()
    run_replay(wl, rec, fleet, window_s=(PERIODS + 2) * 300.0, grace_s=0.0)  # type: ignore[arg-type]
    assert len(rec.obs) > DECIDE_AT + 1, "the short replay delivers periods after the checked decision"
    return seen["ctx"], seen["history"], rec.obs[: PERIODS + 1]


def aurelius(wl: Workload, **kw) -> AureliusPolicy:
    pol = build_policy("aurelius", wl, 0, audit=False, window_periods=PERIODS, **kw)
    assert isinstance(pol, AureliusPolicy)
    return pol


def drive(policy: AureliusPolicy, ctx, history, obs: list[Observations]) -> dict[int, dict]:  # noqa: ANN001
    policy.start(ctx, history)
    records = {0: policy.last_decision()}
    for o in obs:
        policy.plan(o)
        records[o.period_index] = policy.last_decision()
    return records


@pytest.fixture(scope="module")
def records(wl: Workload, stream) -> dict[int, dict]:  # noqa: ANN001
    ctx, history, obs = stream
    return drive(aurelius(wl), ctx, history, obs)


#: Each decision's fallback in this scenario (PJM 2023 default window, 3 periods, seed 0, production reference):
#: (fallback flag, pattern of fallback_reason; None: a searched candidate is recommended, no reason).
EXPECTED_FALLBACK: dict[int, tuple[bool, str | None]] = {
    0: (True, re.escape(START_FALLBACK)),  # nothing observed yet: the reference plan as deployed
    1: (True, r"no candidate passed the hard gates \(best: sla: (code|chat) \d+\.\d\d% > budget 1\.00%"
              r"(; chat \d+\.\d\d% > budget 1\.00%)?\)"),
    # the best candidate short of the reference under the scale-up guard, or of its lever's measured margin
    2: (True, r"pareto: gp/\$ \d+ <= reference \d+( x 1\.\d+)?.*"),
    3: (False, None),
    4: (True, r"pareto: gp/\$ 0 <= reference 0"),  # the drain: nothing offered, nothing to gain, nothing moved
}


def test_real_adapters_produce_decisions(records: dict[int, dict]) -> None:
    assert set(records) == set(range(PERIODS + 2)) == set(EXPECTED_FALLBACK)  # the start and one per period
    for k, rec in records.items():
        assert rec is not None and rec["period_index"] == k
        assert rec["chosen_plan"]["pools"], "a plan with pools"
        assert rec["forecasts"]["price_usd_mwh"]["point"] == rec["forecasts"]["price_usd_mwh"]["point"]  # not NaN
        assert rec["reference_policy"] == "production"  # the strongest measured reference (optimizer/wiring.py)
        fallback, reason = EXPECTED_FALLBACK[k]
        assert rec["fallback"] is fallback, (k, rec["fallback_reason"])
        if fallback:
            assert re.fullmatch(reason, rec["fallback_reason"]), (k, rec["fallback_reason"])
            assert rec["chosen_plan"] == rec["reference_plan"]
        else:
            assert rec["fallback_reason"] is None and rec["chosen_plan"] != rec["reference_plan"]
            assert rec["candidates_evaluated"] > 0 and rec["predicted_delta"]["gp_per_dollar"] > 0
    assert records[0]["candidates_evaluated"] == 0  # the start decision searches nothing
    assert all(records[k]["candidates_evaluated"] > 0 for k in range(1, PERIODS + 2))


def _perturb(o: Observations) -> Observations:
    """Every field a later period delivers, changed: sizes, counts, prices, telemetry, completions."""
    arr = o.arrivals
    if arr.height:
        arr = pl.concat([arr, arr.with_columns(pl.col("request_id") + "-dup")]).with_columns(
            (pl.col("input_tokens") * 3).alias("input_tokens")
        )
    comp = (
        o.completions.with_columns((pl.col("ttft_s") * 5).alias("ttft_s"), (pl.col("tpot_s") * 5).alias("tpot_s"))
        if o.completions.height
        else o.completions
    )
    tel = (
        o.telemetry.with_columns((pl.col("DCGM_FI_DEV_POWER_USAGE") * 2).alias("DCGM_FI_DEV_POWER_USAGE"))
        if o.telemetry.height
        else o.telemetry
    )
    prices = (
        o.prices.with_columns((pl.col("lmp_usd_mwh") * 10 + 500).alias("lmp_usd_mwh")) if o.prices.height else o.prices
    )
    return replace(o, arrivals=arr, completions=comp, telemetry=tel, prices=prices)


def _decision_view(rec: dict) -> tuple:
    return (
        rec["chosen_plan"],
        rec["fallback"],
        rec["fallback_reason"],
        rec["forecasts"],
        [(c["plan"]["label"], round(c["score"], 9)) for c in rec["top_candidates"]],
    )


def _perturb_future(wl: Workload, after_s: float) -> Workload:
    """The workload with everything after `after_s` (s after the window start) changed: every later request
    doubled and three times the size, every later hour's price x 10 + 500 $/MWh. The past is untouched."""
    req = wl.requests
    late = req.filter(pl.col("arrival_s") > after_s).with_columns(
        pl.col("input_tokens") * 3, pl.col("output_tokens") * 3
    )
    requests = pl.concat([req.filter(pl.col("arrival_s") <= after_s), late,
                          late.with_columns(pl.col("request_id") + "-dup")]).sort("arrival_s")
    cut = wl.window.start + timedelta(seconds=after_s)
    prices = wl.prices.with_columns(
        pl.when(pl.col("interval_start") >= cut).then(pl.col("lmp_usd_mwh") * 10 + 500)
        .otherwise(pl.col("lmp_usd_mwh")).alias("lmp_usd_mwh")
    )
    assert requests.height > req.height and not prices.equals(wl.prices)
    return replace(wl, requests=requests, prices=prices)


def test_no_leakage_decision_at_t_unchanged_by_later_data(
    wl: Workload,
    stream,  # noqa: ANN001
    records: dict[int, dict],
) -> None:
    """The real aurelius wiring (build_policy: forecasting facade, DuckDB world state, forward model, search) is
    built from a workload whose future after t is perturbed, the replay's workload as the CLI hands every arm,
    and fed observations perturbed after t: decisions up to t are unchanged, later ones move."""
    ctx, history, obs = stream
    t_s = DECIDE_AT * ctx.period_s  # decision DECIDE_AT is made as of window start + t_s
    assert obs[DECIDE_AT - 1].period_index == DECIDE_AT and obs[DECIDE_AT - 1].as_of == ctx.window_start + timedelta(
        seconds=t_s)
    future = _perturb_future(wl, t_s)
    perturbed = [o if o.period_index <= DECIDE_AT else _perturb(o) for o in obs]
    assert any(o.period_index > DECIDE_AT for o in perturbed)
    again = drive(aurelius(future), ctx, history, perturbed)
    for k in range(DECIDE_AT + 1):
        assert _decision_view(again[k]) == _decision_view(records[k]), f"decision {k} changed"
    # the perturbation is real: a later decision saw it
    later = max(again)
    assert _decision_view(again[later]) != _decision_view(records[later])
    # and so is the workload's: the oracle arm, which reads the realized future by design, decides otherwise at t
    upto = [o for o in obs if o.period_index <= DECIDE_AT]

    def oracle(w: Workload) -> dict:  # noqa: ANN202
        pol = build_policy("oracle", w, 0, audit=False, window_periods=PERIODS)
        return drive(pol, ctx, history, upto)[DECIDE_AT]  # type: ignore[arg-type]

    assert oracle(future)["forecasts"] != oracle(wl)["forecasts"]


def _path_view(rec: dict) -> list:
    """The record's predicted paths at 9 significant digits (DuckDB sums may differ in the last bit)."""
    return [{k: float(f"{v:.9g}") for k, v in step.items()}
            for key in ("horizon_chosen", "horizon_reference") for step in rec.get(key, [])]


def test_no_leakage_of_the_horizon_arm_and_its_path_in_the_record(wl: Workload, stream) -> None:  # noqa: ANN001
    """The horizon arm reads 3 h of forecasts (day-ahead prices where published): its decisions up to t, and the
    predicted paths its records carry, are unchanged when the workload's future and every observation after t
    are perturbed; a later decision moves."""
    ctx, history, obs = stream

    def run(w: Workload, frames: list[Observations]) -> dict[int, dict]:
        pol = build_policy("aurelius-horizon", w, 0, audit=False, window_periods=PERIODS)
        assert isinstance(pol, AureliusPolicy) and pol.horizon is not None
        return drive(pol, ctx, history, frames)

    base = run(wl, obs)
    again = run(_perturb_future(wl, DECIDE_AT * ctx.period_s),
                [o if o.period_index <= DECIDE_AT else _perturb(o) for o in obs])
    for k in range(DECIDE_AT + 1):
        assert _decision_view(again[k]) == _decision_view(records_view := base[k]), f"decision {k} changed"
        assert _path_view(again[k]) == _path_view(records_view)
    later = max(again)
    assert _decision_view(again[later]) != _decision_view(base[later])
    path = base[DECIDE_AT]["horizon_reference"]  # from the committed period to the horizon's end, or to the end
    assert path and path[0]["periods"] == 1  # of the drain (the window here has 3 periods: worldmodel/horizon.py)
    assert len(path) == len(steps(HorizonSpec().periods, HorizonSpec())) or path[-1]["carried"] < 0.5
    assert all(step["cost_usd"] >= 0 and step["replicas"] >= 0 for step in path)


def test_world_model_snapshot_reads_only_what_arrived(wl: Workload, stream) -> None:  # noqa: ANN001
    ctx, history, obs = stream
    wm = WorldStateModel()
    wm.start(ctx, history)
    wm.update(obs[0])
    before = wm.snapshot(obs[0].as_of)
    wm.update(_perturb(obs[1]))  # a later period's (perturbed) records are in the state now
    assert wm.snapshot(obs[0].as_of).queues == before.queues
    assert wm.snapshot(obs[0].as_of).pools == before.pools
    # the fleet inventory, not the GPUs seen in telemetry, sizes idle power and the owned basis
    site = ctx.fleet.site(MARKET)
    assert sum(before.inventory.values()) == sum(site.gpus(g.gpu) for g in site.groups)
    wm.close()


def test_forecast_provider_confidence_and_backlog(wl: Workload, stream) -> None:  # noqa: ANN001
    ctx, history, obs = stream
    fp = ForecastingProvider(window_periods=PERIODS)
    fp.start(ctx, history)
    for o in obs:
        fp.update(o)
    fc = fp.forecast(obs[-1].as_of, 12)
    assert len(fc) == 12
    assert 0.0 <= fc[0].confidence <= 1.0
    assert "confidence.price" in fc[0].provenance
    batch_open = sum(1 for _ in fp.backlog.deadline)
    assert fc[0].deferred_backlog_requests == batch_open
    # the protocol's drain: periods at or after the configured window end offer no arrivals
    end = ctx.window_start.timestamp() + PERIODS * ctx.period_s
    for f in fc:
        if f.period_start.timestamp() >= end:
            assert all(d.arrivals_per_s.point == 0.0 for d in f.demand)


def test_oracle_provider_reads_the_realized_future_and_is_flagged(wl: Workload, stream) -> None:  # noqa: ANN001
    ctx, history, obs = stream
    truth = realized_series(wl, ctx.period_s)
    n_code = wl.requests.filter(pl.col("request_class") == "code").height
    assert truth["arrivals/code"][0].sum() == n_code
    fp = OracleForecastProvider(wl, ctx.period_s, window_periods=PERIODS)
    fp.start(ctx, history)
    f = fp.forecast(ctx.window_start, 3)
    assert f[0].provenance["oracle"] == "true"
    first = truth["arrivals/code"][0][0] / ctx.period_s
    code = next(d for d in f[0].demand if d.request_class == "code")
    assert code.arrivals_per_s.point == pytest.approx(first)
    assert code.arrivals_per_s.hi95 == code.arrivals_per_s.lo95  # zero-width: the realized value


def test_build_policy_builds_every_arm_and_reference(wl: Workload) -> None:
    for name in AURELIUS_ARMS:
        pol = build_policy(name, wl, 3)
        assert isinstance(pol, AureliusPolicy) and pol.name == name and pol.seed == 3
        own = AURELIUS_ARMS[name].get("reference", "production")  # without a tuning: production's plan
        assert pol.reference == own and pol.also_references == ()
        assert isinstance(pol.forecast_provider, OracleForecastProvider) == (name == "oracle")
    assert build_policy("production").name == "production"
    with pytest.raises(ValueError):
        build_policy("oracle", None)


def test_the_cost_basis_reaches_the_objective_the_guard_and_the_capacity_prices(wl: Workload) -> None:
    """`--cost-basis owned` builds arms that count the owned basis's cost, price a held GPU-hour at nothing beyond
    its energy, and run the guard at the target fitted on that basis; an unknown basis is refused."""
    from optimizer.scale_guard import GUARD_TARGETS

    for basis in ("rented", "owned"):
        pol = build_policy("aurelius", wl, cost_basis=basis)
        assert pol.cost_basis == basis and pol.guard is not None and pol.guard.cost_basis == basis
        assert pol.guard.target_at() == GUARD_TARGETS[basis].value
        assert (pol._gpu_usd_per_gpu_h["H100"] > 0) == (basis == "rented")
    assert build_policy("aurelius-no-guard", wl, cost_basis="owned").guard is None
    with pytest.raises(ValueError):
        build_policy("aurelius", wl, cost_basis="leased")


def test_the_committed_plan_bounds_the_autoscaler_by_the_live_fleet(records: dict[int, dict]) -> None:
    """Once the fleet has been observed every committed plan (fallback or not) carries the scale-up guard: each
    pool's ceiling at most its live replicas + the step or the forecast's need (never below its floor), the
    guard's target, and the live counts and needs it bounded them by in the audit record."""
    guarded = [rec for rec in records.values() if rec["scale_guard"]["live"]]
    assert len(guarded) >= PERIODS, "the fleet is observed from the first period on"
    for rec in guarded:
        g = rec["scale_guard"]
        assert rec["chosen_plan"]["autoscale_target"] == g["target"]
        for p in rec["chosen_plan"]["pools"]:
            key = "/".join((p["site"], p["model"], p["gpu"]))
            live = g["live"].get(key, 0)  # a pool not listed has none
            backlog = math.ceil(g["waiting"].get(key, 0.0) / 5.0 - 1e-9) if g["backlog"] else 0  # the trigger's ask
            bound = max(live + g["step"], math.ceil(g["growth"] * live), g["need"].get(key, 0), backlog)
            assert p["replica_ceiling"] <= max(p["replica_floor"], bound), (rec["period_index"], p, live)
    assert any(n > 0 for rec in guarded for n in rec["scale_guard"]["need"].values())  # the forecast's need read
    assert records[0]["scale_guard"]["live"] == {}  # the start: nothing observed, the reference plan as deployed


def test_the_week_before_tuning_sets_the_reference_precision(wl: Workload) -> None:
    """The tuning's weights, KV dtype and token budget reach every aurelius arm that does not fix its own, and
    production-tuned runs the whole configuration; without a tuning the arms keep the reference's own."""
    from optimizer.baselines.tuned import StaticConfig

    tuned = StaticConfig(precision="fp8", kv_dtype="fp8", max_batch=512, max_num_batched_tokens=2048)
    assert build_policy("aurelius", wl, tuned=tuned).reference_precision == ("fp8", "fp8")
    assert build_policy("aurelius-no-guard", wl, tuned=tuned).reference_precision == ("fp8", "fp8")
    assert build_policy("aurelius-own-precision", wl, tuned=tuned).reference_precision is None
    assert build_policy("aurelius", wl).reference_precision is None
    # the chunked-prefill budget, the engine's other restart setting, comes with the precision
    assert build_policy("aurelius", wl, tuned=tuned).reference_token_budget == 2048
    assert build_policy("aurelius-no-token-budget", wl, tuned=tuned).reference_token_budget is None
    assert build_policy("aurelius-no-token-budget", wl, tuned=tuned).reference_precision == ("fp8", "fp8")
    assert build_policy("aurelius-own-precision", wl, tuned=tuned).reference_token_budget is None
    assert build_policy("aurelius", wl).reference_token_budget is None
    assert build_policy("production-tuned", wl, tuned=tuned).config == tuned


def test_the_arms_guard_production_tuned_once_the_week_before_measured_it(wl: Workload) -> None:
    """With the tuning the aurelius arms guard production-tuned at that configuration (its batch cap, target and
    price rule) at the target fitted over that plan; without it (the Kafka worker), and in the arms that ablate an
    engine setting or name production, and on the owned basis, production's plan, at the target fitted over that
    plan at the tuned engine settings where the tuning sets them. In the three-site mode the guard over
    production-tuned's plan runs the target fitted on that mode's week before."""
    from optimizer.baselines.tuned import StaticConfig
    from optimizer.scale_guard import GUARD_TARGET, GUARD_TARGET_ON_PRODUCTION, GUARD_TARGET_THREE_SITE

    tuned = StaticConfig(precision="fp8", kv_dtype="fp8", max_batch=512, max_num_batched_tokens=2048)
    pol = build_policy("aurelius", wl, tuned=tuned)
    assert (pol.reference, pol.reference_policy.config) == ("production-tuned", tuned)
    assert pol.guard.target_at() == GUARD_TARGET.value
    untuned = build_policy("aurelius", wl)
    assert (untuned.reference, untuned.reference_policy, untuned.guard.target_at()) == (
        "production", None, GUARD_TARGET.value)  # no tuning: production created at start, deployed engine
    for arm in ("aurelius-on-production", "aurelius-no-clock", "aurelius-no-token-budget"):
        pol = build_policy(arm, wl, tuned=tuned)
        assert (pol.reference, pol.guard.target_at()) == ("production", GUARD_TARGET_ON_PRODUCTION.value), arm
    assert build_policy("aurelius-own-precision", wl, tuned=tuned).reference == "production"
    assert build_policy("aurelius-no-guard", wl, tuned=tuned).guard is None
    assert build_policy("aurelius", wl, tuned=tuned, reference="production").reference == "production"
    owned = build_policy("aurelius", wl, tuned=tuned, cost_basis="owned")  # the hold lengthens the drain it pays
    assert (owned.reference, owned.guard.rented_target) == ("production", GUARD_TARGET_ON_PRODUCTION.value)
    three = build_policy("aurelius", wl, tuned=tuned, all_sites=True)
    assert GUARD_TARGET_THREE_SITE.value != GUARD_TARGET.value
    assert (three.reference, three.guard.target_at()) == ("production-tuned", GUARD_TARGET_THREE_SITE.value)
    assert build_policy("aurelius-on-production", wl, tuned=tuned, all_sites=True).guard.target_at() == (
        GUARD_TARGET_ON_PRODUCTION.value)  # over production's plan, the target fitted over it
    assert build_policy("aurelius", wl, all_sites=True).guard.target_at() == GUARD_TARGET.value  # no tuning


def test_the_replays_cost_basis_flag_reaches_the_arms(wl: Workload, monkeypatch: pytest.MonkeyPatch) -> None:
    """`aurelius replay --cost-basis owned` builds every policy of the job with the owned basis (the references
    ignore it; the arms optimize it), not only the headline's."""
    from streams.cli import build_parser
    from streams.replay import cli

    seen: dict[str, object] = {}

    class Built(Exception):
        pass

    def capture(name: str, *a: object, **kw: object) -> None:
        seen.update(kw)
        raise Built

    monkeypatch.setattr(cli, "build_policy", capture)
    for basis in ("owned", "rented"):
        args = build_parser().parse_args(["replay", "--cost-basis", basis])
        with pytest.raises(Built):
            cli._one(wl, "aurelius", None, args, None, "PJM", 0, False, None, {})
        assert seen["cost_basis"] == basis
    for all_sites in (True, False):  # the three-site mode reaches the arms too (its own guard target)
        with pytest.raises(Built):
            cli._one(wl, "aurelius", None, build_parser().parse_args(["replay"]), None, "PJM", 0, all_sites, None, {})
        assert seen["all_sites"] is all_sites


def test_the_workers_cost_basis_reaches_its_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`aurelius worker --cost-basis owned` (or env AURELIUS_COST_BASIS) builds the worker's policy on that basis;
    without either it is rented."""
    from datetime import datetime

    from streams.cli import build_parser
    from streams.worker_cli import policy_decider, settings_from_args
    from worldmodel.state import WorldState

    world = WorldState.open(tmp_path / "state.duckdb")
    origin = datetime(2023, 8, 17, tzinfo=UTC)
    flag = settings_from_args(build_parser().parse_args(["worker", "--cost-basis", "owned"]))
    assert policy_decider(flag, origin, world).policy.cost_basis == "owned"
    assert settings_from_args(build_parser().parse_args(["worker"])).cost_basis == "rented"
    monkeypatch.setenv("AURELIUS_COST_BASIS", "owned")
    assert settings_from_args(build_parser().parse_args(["worker"])).cost_basis == "owned"


def test_the_owned_guard_takes_the_rented_target_where_energy_outweighs_capital(
        wl: Workload, stream, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The owned-basis arm's guard reads each period's forecast price against the fleet's energy break-even: PJM's
    window ($338-432/MWh) lies under the default fleet's 692.8, so the committed target is the owned one moved
    towards the rented basis's by the price's share of the break-even (`priced_target`, at or above the owned
    target, below the rented one); with the break-even put under the price the rented basis's (0.7) is, and the
    record says why."""
    import optimizer.aurelius as aurelius_module
    from optimizer.scale_guard import GUARD_TARGET, GUARD_TARGET_OWNED, GuardInputs, priced_target

    ctx, history, obs = stream
    owned, rented = GUARD_TARGET_OWNED.value, GUARD_TARGET.value
    for breakeven in (None, 100.0):
        if breakeven is not None:
            monkeypatch.setattr(aurelius_module, "energy_breakeven_usd_mwh", lambda gpus, b=breakeven: b)
        recs = drive(aurelius(wl, cost_basis="owned"), ctx, history, obs)
        guarded = [r for r in recs.values() if r["scale_guard"]["live"]]
        assert guarded and all(r["cost_basis"] == "owned" for r in recs.values())
        for r in guarded:
            g = r["scale_guard"]
            assert g["price_usd_mwh"] == r["forecasts"]["price_usd_mwh"]["point"]
            assert (g["price_usd_mwh"] >= g["breakeven_usd_mwh"]) == (breakeven is not None)
            share = GuardInputs(price_usd_mwh=g["price_usd_mwh"], breakeven_usd_mwh=g["breakeven_usd_mwh"]).energy_share
            assert g["target"] == priced_target(owned, rented, share) == r["chosen_plan"]["autoscale_target"]
            assert g["target"] == rented if breakeven is not None else owned <= g["target"] < rented


def test_the_week_before_clock_measurement_sets_the_reference_clock_by_price(wl: Workload, stream) -> None:  # noqa: ANN001
    """The tuning's clock-share measurements reach the arms that take its precision; each decision reprices them at
    its forecast price: where the lower clock's energy saving outweighs its lost requests at PJM's window prices
    ($338-432/MWh; the crossover here is 52.6) the guarded reference plan, committed at every fallback, runs at
    0.85 of each GPU's maximum clock; where it loses requests at no saving, at the full clock."""
    from optimizer.baselines.tuned import StaticConfig
    from optimizer.clock_price import ClockMeasurement, ClockPrices
    from schemas.fleet import SM_CLOCK_RANGE_MHZ, GpuType

    pays = ClockPrices((ClockMeasurement(1.0, 1000, 1.0, 1.2, 0.0010, True),
                        ClockMeasurement(0.85, 990, 1.0, 1.2, 0.0008, True)))  # fmt: skip
    loses = ClockPrices((ClockMeasurement(1.0, 1000, 1.0, 1.2, 0.0010, True),
                         ClockMeasurement(0.85, 900, 1.0, 1.2, 0.0010, True)))  # fmt: skip
    tuned = StaticConfig()
    assert build_policy("aurelius", wl, tuned=tuned, clock=pays).reference_clock is pays
    assert build_policy("aurelius-no-clock", wl, tuned=tuned, clock=pays).reference_clock is None
    assert build_policy("aurelius-own-precision", wl, tuned=tuned, clock=pays).reference_clock is None
    assert build_policy("aurelius", wl).reference_clock is None
    ctx, history, obs = stream
    for prices, share in ((pays, 0.85), (loses, 1.0)):
        recs = drive(aurelius(wl, tuned=tuned, clock=prices), ctx, history, obs)
        committed = [r for k, r in recs.items() if k > 0 and r["fallback"] and r["forecasts"]]
        assert committed
        for r in committed:
            c = r["reference_clock"]
            assert c["share"] == share and c["price_usd_mwh"] == r["forecasts"]["price_usd_mwh"]["point"]
            for p in r["chosen_plan"]["pools"]:
                assert p["sm_clock_mhz"] == round(SM_CLOCK_RANGE_MHZ[GpuType(p["gpu"])][1] * share), (share, p)
