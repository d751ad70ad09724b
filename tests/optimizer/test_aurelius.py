"""The aurelius policy end to end on injected fakes: arms, audit records, fallbacks, budgets. (No leakage is
checked on the real wiring, where data after t is within reach: test_wiring.py.)"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import fastjsonschema
import polars as pl
import pytest
from opt_fakes import (
    PERIOD_S,
    FakeWorld,
    PersistenceForecasts,
    StubReference,
    context,
    history,
    observations,
    reference_plan,
)

from optimizer.aurelius import START_FALLBACK, AureliusPolicy
from optimizer.levers import plan_key
from optimizer.registry import create, names
from optimizer.scale_guard import GUARD_TARGET, ScaleGuard
from schemas.audit import decision_id
from schemas.policy import History

SCHEMA = fastjsonschema.compile(json.loads(Path("schemas/audit_record.v1.schema.json").read_text()))
PERIODS = 6


def make(**kw) -> AureliusPolicy:
    kw.setdefault("forecast_provider", PersistenceForecasts())
    return AureliusPolicy(world_model=FakeWorld(), reference_policy=StubReference(), **kw)


def run(policy: AureliusPolicy, obs_fn=observations, periods: int = PERIODS) -> list[dict]:
    policy.start(context(), history())
    records = [policy.last_decision()]
    for k in range(1, periods + 1):
        policy.plan(obs_fn(k))
        records.append(policy.last_decision())
    return records


def varied(k: int):
    return observations(k, code=3000 + 300 * k, chat=900 - 60 * k, price=100.0 + (-1) ** k * 40 * k)


@pytest.fixture(scope="module")
def full_run() -> list[dict]:
    return run(make(), varied)


def test_arms_are_registered_with_their_modes():
    arms = {"aurelius", "aurelius-clock-only", "aurelius-fixed-grid", "aurelius-no-deferral", "aurelius-no-capacity",
            "aurelius-no-precision", "aurelius-no-batch", "oracle"}
    assert arms <= set(names())
    assert create("aurelius-no-deferral").mode == "no-deferral"
    oracle = create("oracle")
    assert oracle.oracle and oracle.name == "oracle"
    with pytest.raises(ValueError, match="inject forecast_provider"):
        oracle.start(context(), history())


def test_records_follow_the_audit_schema_with_stable_ids(full_run):
    for i, rec in enumerate(full_run):
        SCHEMA(json.loads(json.dumps(rec)))
        assert rec["period_index"] == i and rec["policy"] == "aurelius"
        at = context().window_start + timedelta(seconds=i * context().period_s)
        assert rec["decision_id"] == decision_id("aurelius", ("PJM",), at)
        if i == 0:  # nothing observed yet: the reference plan as deployed
            assert rec["fallback"] and rec["fallback_reason"] == START_FALLBACK and rec["candidates_evaluated"] == 0
        else:
            assert rec["candidates_evaluated"] > 0 and rec["top_candidates"]
        assert rec["gates"] and rec["regret"] is not None and rec["reference_plan"] is not None


def test_decisions_are_reproducible(full_run):
    again = run(make(), varied)
    for a, b in zip(full_run, again, strict=True):
        assert a["decision_id"] == b["decision_id"] and a["chosen_plan"] == b["chosen_plan"]


def test_search_budget_median_and_grid_share(full_run):
    evals = [r["candidates_evaluated"] for r in full_run]
    assert statistics.median(evals) <= 40
    assert all(e <= 0.1 * r["audit"]["grid_size"] for e, r in zip(evals, full_run, strict=True))
    assert all(r["audit"]["grid_size"] >= 500 for r in full_run)


def test_regret_on_the_fake_world(full_run):
    regrets = [r["regret"] for r in full_run[1:]]  # the start decision is the forced fallback, not a search
    assert sum(x == 0.0 for x in regrets) / len(regrets) >= 0.95 and statistics.mean(regrets) <= 0.005


def test_chosen_plan_beats_the_reference_or_is_the_reference(full_run):
    for r in full_run:
        if r["fallback"]:
            assert r["chosen_plan"] == r["reference_plan"] and r["fallback_reason"]
        else:
            assert r["predicted_delta"]["gp_per_dollar"] > 0
            assert all(v <= 0.1 for k, v in r["predicted_delta"].items() if k.startswith("violation_pp_"))


def test_confidence_fallback_recommends_the_reference():
    recs = run(make(forecast_provider=PersistenceForecasts(confidence=0.3), audit=False), periods=1)
    assert recs[0]["fallback_reason"] == START_FALLBACK
    for r in recs[1:]:
        assert r["fallback"] and r["fallback_reason"] == "forecast confidence 0.30 < threshold 0.50"
        assert r["chosen_plan"] == reference_plan().as_dict() and r["candidates_evaluated"] == 0


def test_clock_only_changes_only_clocks():
    pol = make(mode="clock-only", audit=False)
    pol.start(context(), history())
    plan = pol.plan(observations(1))
    ref = reference_plan()
    for p, q in zip(plan.pools, ref.pools, strict=True):
        assert (p.replica_floor, p.replica_ceiling, p.precision, p.max_batch) == (
            q.replica_floor, q.replica_ceiling, q.precision, q.max_batch)
    assert plan.batch_admission == ref.batch_admission


@pytest.mark.parametrize("arm", ["aurelius-no-capacity", "aurelius-no-batch"])  # the fake moves no precision
def test_an_ablation_arm_never_moves_its_lever_family(arm: str):
    """The full planner moves each family on the fake world; the arm without it keeps the reference's."""
    from optimizer.aurelius import AURELIUS_ARMS
    from optimizer.margins import families_moved
    from schemas.plan import Plan

    ablated = AURELIUS_ARMS[arm]["ablate"]

    def moved(pol: AureliusPolicy) -> set[str]:
        recs = run(pol, varied, periods=4)
        plans = [(Plan.from_dict(r["chosen_plan"]), Plan.from_dict(r["reference_plan"])) for r in recs]
        return set().union(*(families_moved(chosen, ref) for chosen, ref in plans))

    assert ablated & moved(make(audit=False)), "the full planner does not move the family here: no test"
    assert not ablated & moved(make(audit=False, ablate=ablated, name=arm))


def test_no_deferral_keeps_the_reference_admission():
    recs = run(make(mode="no-deferral", audit=False), varied, periods=3)
    assert all(r["chosen_plan"]["batch_admission"] == "pressure" for r in recs)


def test_plan_key_ignores_labels_and_sees_every_lever():
    from dataclasses import replace

    p = reference_plan()
    assert plan_key(p) == plan_key(replace(p, label="other", notes=("why",)))
    # engine arguments restart replicas: plans that differ only there are different decisions
    for change in ({"kv_dtype": "fp8"}, {"max_num_batched_tokens": 2048}, {"sm_clock_mhz": 1500}):
        q = p.with_pools((replace(p.pools[0], **change), *p.pools[1:]))
        assert plan_key(q) != plan_key(p), change
    for change in ({"ordering": "fcfs"}, {"autoscale_target": 0.6}, {"autoscale": False}):
        assert plan_key(replace(p, **change)) != plan_key(p), change


def test_the_better_predicted_reference_is_the_pareto_yardstick():
    from dataclasses import replace

    base = reference_plan()
    # a second reference with half the floors: cheaper, and under the fakes' demand predicted to score differently
    half = base.with_pools(tuple(replace(p, replica_floor=max(p.replica_floor // 2, 1)) for p in base.pools))
    half = replace(half, label="second reference")
    recs = run(make(also_reference_policies=(StubReference(half),)), periods=2)
    for r in recs:
        assert r["pareto_reference"] in (base.label, "second reference")
        assert r["reference_plan"]["label"] == r["pareto_reference"]
        if r["fallback"]:
            assert r["chosen_plan"] == r["reference_plan"]


def test_floor_release_hands_the_plan_in_force_to_the_evaluator():
    class Recording(FakeWorld):
        def __init__(self) -> None:
            super().__init__()
            self.in_force: list = []

        def evaluator(self, as_of, f, in_force=None, running=None, spread=True):  # noqa: ANN001, ANN202
            self.in_force.append(in_force)
            return super().evaluator(as_of, f, in_force, running, spread)

    for release in (False, True):
        world = Recording()
        pol = AureliusPolicy(world_model=world, reference_policy=StubReference(), audit=False,
                             forecast_provider=PersistenceForecasts(), floor_release=release)
        pol.start(context(), history())
        first = pol.plan(observations(1))
        pol.plan(observations(2))
        assert world.in_force[2] == (first if release else None)  # the plan returned the period before
        assert release or world.in_force == [None] * 3


def test_a_decision_that_fails_on_odd_inputs_recommends_the_reference_and_decisions_go_on():
    """Inputs the models cannot digest (the fuzz suite found an unknown GPU type, a price of 1.8e308 $/MWh,
    history before a zero-filled season) make that period's decision the reference plan with the reason; the
    next period decides normally."""

    class Choking(FakeWorld):
        def update(self, obs):
            if obs.period_index == 2:
                raise KeyError("H200")
            super().update(obs)

    pol = AureliusPolicy(world_model=Choking(), reference_policy=StubReference(), audit=False,
                         forecast_provider=PersistenceForecasts())
    recs = run(pol, periods=3)
    failed = recs[2]
    assert failed["fallback"] and failed["fallback_reason"] == "decision failed: KeyError: 'H200'"
    assert failed["chosen_plan"] == failed["reference_plan"]
    SCHEMA(failed)
    assert not recs[3]["fallback_reason"] or not recs[3]["fallback_reason"].startswith("decision failed")


class _LiveWorld(FakeWorld):
    """FakeWorld with 3 live replicas of the 70B H100 pool, whose forward model places `need` of them and which
    held `waiting` sequences over the last minute."""

    KEY = ("site-pjm", "llama-3.1-70b", "H100")

    def __init__(self, need: int, waiting: float = 0.0) -> None:
        super().__init__()
        self.need, self.held = need, waiting

    def replicas(self, as_of):  # noqa: ANN001, ANN201
        return {self.KEY: 3}

    def waiting(self, as_of):  # noqa: ANN001, ANN201
        return {self.KEY: self.held}

    def evaluator(self, as_of, f, in_force=None, running=None, spread=True):  # noqa: ANN001, ANN201
        base = super().evaluator(as_of, f, in_force, running, spread)
        return lambda plan: replace(base(plan), pool_replicas={self.KEY: float(self.need)})


@pytest.mark.parametrize(("need", "waiting", "backlog", "ceiling"),
                         [(0, 0.0, False, 5), (7, 0.0, False, 7), (20, 0.0, False, 8), (0, 31.0, False, 5),
                          (0, 31.0, True, 7)])
def test_the_guard_bounds_the_reference_by_the_live_fleet_or_the_forecast_need(need: int, waiting: float,
                                                                                backlog: bool, ceiling: int):
    """The yardstick's 70B H100 ceiling: live 3 + 1 is under the pool's floor 5, so the floor; a forecast need of 7
    lifts it to 7; a need of 20 stops at the reference's own ceiling 8; 31 sequences waiting over the last minute
    lift it to the backlog trigger's ceil(31 / 5) = 7 only with the backlog term. Pools with no live replica may
    add one."""
    pol = AureliusPolicy(world_model=_LiveWorld(need, waiting), reference_policy=StubReference(),
                         forecast_provider=PersistenceForecasts(), audit=False, guard=ScaleGuard(backlog=backlog))
    rec = run(pol, periods=1)[1]
    ref = {(p["site"], p["model"], p["gpu"]): p for p in rec["reference_plan"]["pools"]}
    assert ref[_LiveWorld.KEY]["replica_ceiling"] == ceiling
    assert ref[("site-pjm", "llama-3.1-70b", "A100")]["replica_ceiling"] == 1  # none live, no need: one may start
    assert rec["reference_plan"]["autoscale_target"] == GUARD_TARGET.value  # the guard's own target
    assert rec["scale_guard"]["live"] == {"site-pjm/llama-3.1-70b/H100": 3}


class _RampWorld(_LiveWorld):
    """_LiveWorld whose forward model places one 70B H100 replica per chat request/s of the forecast it is given."""

    def evaluator(self, as_of, f, in_force=None, running=None, spread=True):  # noqa: ANN001, ANN201
        base = FakeWorld.evaluator(self, as_of, f, in_force, running, spread)
        chat = next(d.arrivals_per_s.point for d in f.demand if d.request_class == "chat")
        return lambda plan: replace(base(plan), pool_replicas={self.KEY: chat})


@pytest.mark.parametrize(("trend", "chat", "ceiling"), [(True, 1350, 6), (False, 1350, 5), (True, 600, 5)])
def test_the_guard_serves_a_rising_forecast_as_it_rises(trend: bool, chat: int, ceiling: int):
    """Chat at 3.0 req/s, then `chat` requests in the next period: a rise to 4.5 req/s is carried on to 6.0 by
    the trend (6 replicas), where the 80% upper bound asks for 4.95 (5, the floor); a fall leaves the upper bound."""
    pol = AureliusPolicy(world_model=_RampWorld(0), reference_policy=StubReference(), audit=False,
                         forecast_provider=PersistenceForecasts(), guard=ScaleGuard(trend=trend))
    recs = run(pol, lambda k: observations(k, chat=900 if k == 1 else chat), periods=2)
    ref = {(p["site"], p["model"], p["gpu"]): p for p in recs[2]["reference_plan"]["pools"]}
    assert ref[_LiveWorld.KEY]["replica_ceiling"] == ceiling
    assert recs[2]["scale_guard"]["trend"] is trend
    assert recs[1]["scale_guard"]["need"] == {"site-pjm/llama-3.1-70b/H100": 4}  # no decision before: the hi80 3.3


def _climbing(k: int):
    """observations(k) whose 900 chat requests arrive at a rate climbing linearly across the period (from 0 to
    6 req/s: 3 req/s on average, as the flat period's)."""
    obs = observations(k)
    a = obs.arrivals
    chat = a.filter(pl.col("request_class") == "chat")
    n, as_of = chat.height, obs.as_of
    at = [as_of - timedelta(seconds=PERIOD_S * (1 - ((i + 0.5) / n) ** 0.5)) for i in range(n)]
    chat = chat.with_columns(pl.Series("event_at", at, dtype=a.schema["event_at"]))
    return replace(obs, arrivals=pl.concat([a.filter(pl.col("request_class") != "chat"), chat]))


@pytest.mark.parametrize(("ramp", "need"), [(True, 15), (False, 4)])
def test_the_guard_serves_a_ramp_still_climbing_when_the_period_closed(ramp: bool, need: int):
    """Chat's mean is 3 req/s (the 80% upper bound 3.3: 4 replicas), but it climbed from 0 to 6 req/s inside the
    period: the line through its minute counts (0.02 req/s per s) reaches 9 req/s in the middle of this period and
    15 in the middle of the next, so the need (the larger) is 15 replicas with the ramp term and 4 without; the
    record names the climbing class."""
    pol = AureliusPolicy(world_model=_RampWorld(0), reference_policy=StubReference(), audit=False,
                         forecast_provider=PersistenceForecasts(), guard=ScaleGuard(ramp=ramp))
    rec = run(pol, _climbing, periods=1)[1]
    assert rec["scale_guard"]["need"] == {"site-pjm/llama-3.1-70b/H100": need}
    ramps = rec["scale_guard"]["ramps"]
    assert ramps.get("chat/llama-3.1-70b") == ({"level": 6.0, "slope": 0.02} if ramp else None)


def _late_start(k: int):
    """observations(k) with each class's arrivals spread evenly over the period's second half (a worker that
    started mid-period sees its first period so: flat, not climbing)."""
    obs = observations(k)
    parts = []
    for _, part in obs.arrivals.group_by("request_class"):
        n = part.height
        at = [obs.as_of - timedelta(seconds=PERIOD_S / 2 * (i + 0.5) / n) for i in range(n)]
        parts.append(part.with_columns(pl.Series("event_at", at, dtype=part.schema["event_at"])))
    return replace(obs, arrivals=pl.concat(parts))


@pytest.mark.parametrize(("fresh", "climbing"), [(True, False), (False, True)])
def test_a_fresh_start_reads_no_ramp_from_the_part_of_its_first_period_it_did_not_see(fresh: bool, climbing: bool):
    """A worker started without history mid-period: its first arrivals (every class flat over the second half) are
    binned from the first arrival on, so no ramp; with history the period counts whole, and an empty first half
    followed by a flat rate is a climb in every class."""
    pol = AureliusPolicy(world_model=_RampWorld(0), reference_policy=StubReference(), audit=False,
                         forecast_provider=PersistenceForecasts())
    pol.start(context(), History(pl.DataFrame(), pl.DataFrame(), pl.DataFrame()) if fresh else history())
    pol.plan(_late_start(1))
    ramps = pol.last_decision()["scale_guard"]["ramps"]
    assert sorted(ramps) == (["batch/llama-3.1-70b", "chat/llama-3.1-70b", "code/llama-3.1-8b"] if climbing else [])


def test_the_reference_runs_at_the_tuned_precision_where_the_gpu_has_it():
    """With `reference_precision` the yardstick (and the fallback the record commits) has fp8 weights and KV on
    the H100 pools and stays bf16 on the A100s, which have no fp8; with `reference_token_budget` every pool runs
    that chunked-prefill budget; the record says which settings it took."""
    pol = AureliusPolicy(world_model=FakeWorld(), reference_policy=StubReference(), audit=False,
                         forecast_provider=PersistenceForecasts(), reference_precision=("fp8", "fp8"),
                         reference_token_budget=2048)  # fmt: skip
    rec = run(pol, periods=1)[1]
    SCHEMA(rec)
    got = {p["gpu"]: (p["precision"], p["kv_dtype"], p["max_num_batched_tokens"])
           for p in rec["reference_plan"]["pools"]}  # fmt: skip
    assert got == {"H100": ("fp8", "fp8", 2048), "A100": ("bf16", "auto", 2048)}
    assert rec["reference_precision"] == ["fp8", "fp8"] and rec["reference_token_budget"] == 2048
    assert rec["reference_plan"]["label"].endswith(" at fp8/kv fp8, 2048 tokens/iteration")  # the plan says so too
    committed = {p["max_num_batched_tokens"] for p in rec["chosen_plan"]["pools"]}
    assert committed == {2048}  # what the decision commits keeps it
