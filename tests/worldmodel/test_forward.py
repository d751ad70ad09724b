"""Forward model: read-only evaluation, known numbers, and the directions every lever must move."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from schemas.cost import CostConfig
from schemas.forecast import ClassDemand, DisturbanceForecast, Interval
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan
from worldmodel.forward import ForwardModel
from worldmodel.placement import place
from worldmodel.queueing import Pool
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import snapshot
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn

T0 = datetime(2023, 7, 1, tzinfo=UTC)
SITE = "PJM-1"


def _iv(x, w=0.2):
    return Interval(x, x * (1 - w), x * (1 + w), x * (1 - 2 * w), x * (1 + 2 * w))


def _forecast(scale=1.0, backlog=0, deadlines=()):
    return DisturbanceForecast(
        T0,
        300.0,
        (
            ClassDemand("code", "llama-3.1-8b", _iv(10 * scale), 2000, 30, 5000, 100, 0.3),
            ClassDemand("chat", "llama-3.1-70b", _iv(20 * scale), 1000, 250, 2500, 600, 0.2),
            ClassDemand("batch", "llama-3.1-70b", _iv(3 * scale), 7000, 300, 15000, 700, 0.5),
        ),
        _iv(50.0),
        False,
        0.8,
        deferred_backlog_requests=backlog,
        deferred_deadlines_s=deadlines,
    )


def _plan(n70=4, n8=4, precision="bf16", clock=1980, max_batch=256, autoscale=True, **kw):
    return Plan(
        (
            PoolPlan(SITE, "llama-3.1-70b", "H100", n70, n70 * 4, 4, precision, max_batch, clock),
            PoolPlan(SITE, "llama-3.1-8b", "H100", n8, n8 * 4, 1, precision, max_batch, clock),
        ),
        autoscale=autoscale,
        **kw,
    )


@pytest.fixture(scope="module")
def world():
    ws = WorldState.open(":memory:")
    fleet = pl.concat(
        [
            syn.fleet_events(T0 - timedelta(minutes=10), 4),
            syn.fleet_events(T0 - timedelta(minutes=10), 4, model="llama-3.1-8b", tp=1).with_columns(
                pl.col("replica_id") + "-8b"
            ),
        ]
    )
    arr = syn.arrivals(T0, 500, rate_per_s=10.0)
    ws.update(
        {
            "fleet_event": fleet,
            "gpu_telemetry": syn.telemetry(T0, 64 * 60, hosts=8),
            "request_arrival": arr,
            "request_completion": syn.completions(arr.head(400)),
        }
    )
    return ws, snapshot(ws, T0 + timedelta(seconds=60), inventory={("site-pjm", "H100"): 64})  # 8 nodes of 8


@pytest.fixture(scope="module")
def fm():
    return ForwardModel(ServingModel(), CostConfig())


def test_evaluating_never_mutates_state(world, fm):
    ws, _ = world
    before = ws.digest()
    snap = snapshot(ws, T0 + timedelta(seconds=60))
    for i in range(100):
        fm.evaluate(
            snap,
            _plan(
                n70=1 + i % 6,
                n8=1 + i % 5,
                precision=("bf16", "fp8")[i % 2],
                clock=1200 + 7 * i,
                max_batch=16 + 8 * i,
                autoscale=bool(i % 3),
            ),
            _forecast(0.5 + i / 50),
        )
    assert ws.digest() == before


def test_static_plan_known_gpu_hours_and_cost(world, fm):
    _, snap = world
    out = fm.evaluate(snap, _plan(autoscale=False), _forecast())
    gpu_h = (4 * 4 + 4 * 1) * 300 / 3600  # 20 GPUs for one 5-min period
    assert out.gpu_hours == pytest.approx(gpu_h)
    assert out.cost_usd == pytest.approx(gpu_h * 2.50 + out.energy_cost_usd)
    assert out.cost_usd_owned == pytest.approx(64 * 300 / 3600 * 30000 / 35040 + out.energy_cost_usd)
    assert out.energy_cost_usd == pytest.approx(out.energy_kwh * 50.0 / 1000)
    assert out.reloads == 0 and out.gp_per_dollar == pytest.approx(out.sla_met / out.cost_usd)
    assert out.gp_per_dollar_lo <= out.gp_per_dollar
    for c in out.classes:
        assert c.violation_rate <= c.violation_rate_hi


def test_more_demand_more_violations(world, fm):
    _, snap = world
    rates = [
        fm.evaluate(snap, _plan(autoscale=False), _forecast(s)).classes[1].violation_rate
        for s in (0.5, 1.0, 1.5, 2.0, 3.0)
    ]
    assert rates == sorted(rates) and rates[-1] > 0.5 > rates[0]


def test_more_capacity_fewer_violations_more_gpu_hours(world, fm):
    _, snap = world
    small = fm.evaluate(snap, _plan(n70=2, autoscale=False), _forecast(1.5))
    big = fm.evaluate(snap, _plan(n70=8, autoscale=False), _forecast(1.5))
    assert big.classes[1].violation_rate < small.classes[1].violation_rate
    assert big.gpu_hours > small.gpu_hours


def test_fp8_is_faster_and_reloads(world, fm):
    _, snap = world
    # with the roofline's precision gain credited, fp8 is faster; an unobserved precision gets no credit by
    # default (the measured gain can be far below the roofline), so before fp8 has run it only costs a reload
    credited = replace(snap, corrections=replace(snap.corrections, precision_credit=1.0))
    bf16 = fm.evaluate(credited, _plan(), _forecast())
    fp8 = fm.evaluate(credited, _plan(precision="fp8"), _forecast())
    assert fp8.classes[1].tpot_p99_ms < bf16.classes[1].tpot_p99_ms
    assert fp8.reloads == 8 and bf16.reloads == 0
    uncredited = fm.evaluate(snap, _plan(precision="fp8"), _forecast())
    assert uncredited.classes[1].tpot_p99_ms >= fp8.classes[1].tpot_p99_ms


def test_an_fp8_kv_cache_decodes_faster_than_fp8_weights_alone(world, fm):
    """The forward model reads each pool's KV-cache dtype (vLLM's default "auto" keeps a bf16 cache beside fp8
    weights): an fp8 cache reads half the KV bytes per decode step, so the chat class's TPOT falls."""
    _, snap = world
    credited = replace(snap, corrections=replace(snap.corrections, precision_credit=1.0))
    fp8 = _plan(precision="fp8", max_batch=512, autoscale=False)
    kv = replace(fp8, pools=tuple(replace(p, kv_dtype="fp8") for p in fp8.pools))
    auto_out, kv_out = (fm.evaluate(credited, p, _forecast(2.0)) for p in (fp8, kv))
    assert kv_out.classes[1].tpot_p99_ms < 0.97 * auto_out.classes[1].tpot_p99_ms


def test_lower_clock_saves_power_slows_prefill(world, fm):
    _, snap = world
    fast = fm.evaluate(snap, _plan(autoscale=False), _forecast())
    slow = fm.evaluate(snap, _plan(clock=1200, autoscale=False), _forecast())
    assert slow.peak_power_w < fast.peak_power_w
    assert slow.classes[0].ttft_p99_ms > fast.classes[0].ttft_p99_ms


def test_small_batch_cap_saturates(world, fm):
    _, snap = world
    out = fm.evaluate(snap, _plan(max_batch=8, autoscale=False), _forecast())
    assert out.classes[1].violation_rate > 0.5
    assert out.classes[1].served < out.classes[1].offered


def test_deferral_holds_batch_work(world, fm):
    _, snap = world
    fc = _forecast(backlog=100, deadlines=tuple(float(x) for x in range(1000, 11000, 100)))
    hold = fm.evaluate(snap, _plan(batch_admission=BatchAdmission.HOLD), fc)
    now = fm.evaluate(snap, _plan(batch_admission=BatchAdmission.IMMEDIATE), fc)
    assert hold.deferred_carryover > now.deferred_carryover == 0.0
    assert hold.classes[2].served < now.classes[2].served


def test_risk_band_widens_upper_violation(world, fm):
    _, snap = world
    wide = replace(snap, risk_band=2.0)
    a = fm.evaluate(snap, _plan(autoscale=False), _forecast(1.3))
    b = fm.evaluate(wide, _plan(autoscale=False), _forecast(1.3))
    assert b.classes[1].violation_rate_hi >= a.classes[1].violation_rate_hi
    assert b.classes[1].violation_rate == a.classes[1].violation_rate


def _fake_periods(plan, n=2, tpot_s=(0.04,) * 3):
    """Realized periods of a synthetic stream: 600 chat arrivals per period, completions at `tpot_s[k]`."""
    from schemas.policy import Observations
    from streams.replay.validate_cli import RealizedClass, RealizedPeriod

    fleet = syn.fleet_events(T0 - timedelta(minutes=10), 4)
    for k in range(n):
        start = T0 + timedelta(minutes=5 * k)
        arr = syn.arrivals(start, 600, rate_per_s=2.0, seed=k).with_columns(pl.col("request_id") + f"-{k}")
        obs = Observations(
            start + timedelta(minutes=5),
            k,
            arr,
            syn.completions(arr.head(500), tpot_s=tpot_s[k], prefill_s_per_token=2e-5),
            syn.telemetry(start, 64 * 30, hosts=8),
            fleet if k == 0 else fleet.head(0),
            syn.prices(start, 1),
        )
        yield RealizedPeriod(k, plan, obs, 1.5, 5.0, {"chat": RealizedClass(600, 0.02, 900.0, 60.0)})


def test_validate_plumbing_with_a_fake_realizer(tmp_path):
    import argparse
    import json

    from streams.replay.validate_cli import run

    calls = []

    def realize(market, plan, args):
        calls.append(plan.label if plan else None)
        yield from _fake_periods(plan or _plan())

    args = argparse.Namespace(markets="PJM", period_minutes=5.0, out=str(tmp_path))
    assert run(args, realize) == 0
    out = json.loads((tmp_path / "validation.json").read_text())
    imposed = out["markets"]["PJM"]["imposed"]
    assert set(imposed) == {
        "capacity_half_static",
        "capacity_1.5x_static",
        "fp8",
        "clock_min",
        "batch_cap_32",
    }
    assert calls[0] is None and len(calls) == 6
    near = imposed["fp8"]["summary"]["ttft_p99_near_saturation"]
    assert near["cells"] == 2 and near["rel_error_median"] is not None  # chat realized 2%: both periods count
    row = imposed["fp8"]["periods"][1]
    assert row["energy_kwh"]["realized"] == 1.5 and row["energy_kwh"]["rel_error"] is not None
    assert row["classes"]["chat"]["violation_rate"]["error_kind"] == "relative"


def test_the_logging_streams_history_calibrates_only_what_came_before():
    """Imposed-plan predictions learn from the logging policy's stream period by period: a change in its
    period 1 leaves the predictions of periods 0 and 1 as they were and moves period 2's."""
    from streams.replay.validate_cli import predict_stream

    def tpot99(history_tpot):
        history = _fake_periods(_plan(), 3, history_tpot)
        rows = predict_stream(_fake_periods(_plan(n70=2), 3), 300.0, CostConfig(), history=history)
        return [r["classes"]["chat"]["tpot_p99_ms"]["predicted"] for r in rows]

    base = tpot99((0.04, 0.04, 0.04))
    slow = tpot99((0.04, 0.20, 0.04))
    assert slow[:2] == base[:2]
    assert slow[2] > base[2]


def test_lowering_the_floor_in_force_releases_the_replicas_it_held(world, fm):
    _, snap = world  # 4 warm 70B and 4 warm 8B replicas
    # a scale-up just ended (its stabilization spans the period); the scale-down after it has its own test
    # (test_transients.py)
    snap = replace(snap, pools=tuple(replace(p, warm_age_s=0.0) for p in snap.pools))
    held = replace(snap, floors={(SITE, "llama-3.1-70b", "H100"): 4, (SITE, "llama-3.1-8b", "H100"): 4})
    low, f = _plan(n70=1, n8=1), _forecast(0.3)
    unknown = fm.evaluate(snap, low, f)  # no plan in force known: existing replicas ride out the stabilization
    released = fm.evaluate(held, low, f)  # the in-force floors held them: the autoscaler lets them go at once
    kept = fm.evaluate(held, _plan(n70=4, n8=4), f)  # the same floors again: nothing released
    assert released.gpu_hours < unknown.gpu_hours == pytest.approx(kept.gpu_hours)


def test_several_sites_grow_by_their_share_one_site_in_plan_order():
    """One autoscaler per site: growth follows the replicas each site holds; at one site the plan's order."""

    def pools(*sites):  # noqa: ANN002, ANN202
        return [Pool(PoolPlan(s, "llama-3.1-8b", "H100", 0, 64, 1, "bf16", 256, 1980), None, n, 0, 0.0, (), 0.0)
                for s, n in zip(sites, (4, 2), strict=True)]

    plan = Plan(pools=(), autoscale=True, autoscale_target=0.8)
    lam = 9.6  # 12 replicas at 1 req/s each and the 80% target
    assert place(plan, pools("site-pjm", "site-ercot"), [1.0, 1.0], lam, {}) == [8.0, 4.0]
    assert place(plan, pools("site-pjm", "site-pjm"), [1.0, 1.0], lam, {}) == [10.0, 2.0]


def test_a_throttled_clock_draws_less_power_a_lower_plan_clock_is_untouched(world, fm):
    _, snap = world
    f = _forecast(0.5)
    hot = replace(snap, pools=tuple(replace(p, sm_clock_mhz=1980.0, clock_eff_mhz=1800.0) for p in snap.pools))
    cool = replace(snap, pools=tuple(replace(p, sm_clock_mhz=1980.0, clock_eff_mhz=1980.0) for p in snap.pools))
    assert fm.evaluate(hot, _plan(), f).energy_kwh < fm.evaluate(cool, _plan(), f).energy_kwh
    low = _plan(clock=1500)  # below the throttled clock: drawn at its own clock either way
    assert fm.evaluate(hot, low, f).energy_kwh == pytest.approx(fm.evaluate(cool, low, f).energy_kwh)


def test_released_backlog_counts_as_met_like_carried_work(world, fm):
    """Holding and releasing the same deferrable backlog account for the same work: met now, or carried."""
    _, snap = world
    f = _forecast(0.5, backlog=200, deadlines=(7200.0,) * 5)
    run = fm.evaluate(snap, _plan(batch_admission=BatchAdmission.IMMEDIATE), f)
    hold = fm.evaluate(snap, _plan(batch_admission=BatchAdmission.HOLD), f)
    assert run.deferred_carryover == 0.0 and hold.deferred_carryover > 0.0
    batch = {o.request_class: o for o in run.classes}["batch"]
    assert batch.served > batch.offered  # the backlog runs too
    assert run.sla_met + run.deferred_carryover == pytest.approx(hold.sla_met + hold.deferred_carryover, rel=0.02)


def test_a_backlog_after_arrivals_stop_runs_only_as_fast_as_the_replicas_serve_it(world, fm):
    """After the window (no arrivals) a released deferrable backlog keeps its requests' sizes: one 70B replica
    runs a share of 20,000 long prompts in a period and carries the rest, more replicas run more (the drain
    once priced the backlog at size 0, and one replica "ran" any backlog)."""
    _, snap = world
    f = _forecast(0.0, backlog=20_000, deadlines=(7200.0,) * 5)
    runs = []
    for n in (1, 4, 16):
        out = fm.evaluate(snap, _plan(n70=n, autoscale=False, batch_admission=BatchAdmission.IMMEDIATE), f)
        runs.append({o.request_class: o for o in out.classes}["batch"].served)
        assert runs[-1] + out.deferred_carryover == pytest.approx(20_000)
    assert runs[0] < 0.5 * 20_000 and runs[0] < runs[1] < runs[2]


def test_a_reload_breaks_the_interactive_requests_in_flight(world, fm):
    """With nothing offered (the drain) a plan that keeps precision violates nothing; one that reloads the 70B
    pool requeues the chat requests in flight there: they count as violated and as SLA-met lost."""
    _, snap = world
    in_flight = snap.queue("chat").outstanding
    assert in_flight > 0
    drain = _forecast(scale=0.0)
    keep = fm.evaluate(snap, _plan(), drain)
    reload = fm.evaluate(snap, _plan(precision="fp8"), drain)
    chat = {o.request_class: o for o in keep.classes}["chat"]
    chat_reload = {o.request_class: o for o in reload.classes}["chat"]
    assert chat.offered == 0 and chat.violation_rate == 0.0
    assert chat_reload.violation_rate == 1.0
    assert snap.queue("code") is None  # the fixture's arrivals are all chat: only they are in flight
    assert reload.sla_met == pytest.approx(keep.sla_met - in_flight)


def test_part_used_nodes_draw_their_overhead_growth_fills_them_first(world, fm):
    """Nodes hosting replicas draw their non-GPU power: the same 20 GPUs spread over 8 nodes cost 5 nodes more
    than packed on 3; growth fills the free GPUs of powered nodes before it powers another."""
    _, snap = world
    key = (SITE, "H100")
    f = _forecast(0.5)
    plan = _plan(autoscale=False)  # 20 GPUs
    packed = fm.evaluate(replace(snap, placement={key: (20, 3)}), plan, f)
    spread = fm.evaluate(replace(snap, placement={key: (20, 8)}), plan, f)
    # written out: the planner's H100 server idles at 2,800 W, its 8 GPUs at 75 W each -> 2,200 W of node overhead,
    # for one 5-minute period, at PUE 1.3
    per_node_kwh = (2800.0 - 8 * 75.0) * 300 / 3.6e6 * 1.3
    assert spread.energy_kwh - packed.energy_kwh == pytest.approx(5 * per_node_kwh)
    grown = fm.evaluate(replace(snap, placement={key: (16, 4)}), plan, f)  # 4 more GPUs fit the 4 nodes
    assert grown.energy_kwh - packed.energy_kwh == pytest.approx(per_node_kwh)
    shrunk = fm.evaluate(replace(snap, placement={key: (40, 8)}), plan, f)  # 20 released: 2 nodes emptied
    assert shrunk.energy_kwh - packed.energy_kwh == pytest.approx(3 * per_node_kwh)


def test_under_edf_batch_prompts_do_not_queue_ahead_of_interactive_ones(world, fm):
    _, snap = world

    def chat_p99(batch_rate, ordering):
        fc = _forecast()
        demands = tuple(replace(d, arrivals_per_s=_iv(batch_rate)) if d.request_class == "batch" else d
                        for d in fc.demand)
        plan = _plan(autoscale=False, ordering=ordering, batch_admission=BatchAdmission.IMMEDIATE)
        out = fm.evaluate(snap, plan, replace(fc, demand=demands))
        return next(c for c in out.classes if c.request_class == "chat").ttft_p99_ms

    edf = chat_p99(6.0, Ordering.EDF) - chat_p99(0.5, Ordering.EDF)
    fcfs = chat_p99(6.0, Ordering.FCFS) - chat_p99(0.5, Ordering.FCFS)
    # FCFS: chat prompts wait behind 7,000-token batch prompts in their replica's chunk queue (+16 s here);
    # EDF: only the batch slots they hold and the chunks riding with decode move it (+0.3 s; as M/G/c over
    # the pool with batch prompts counted half, before: +1.1 s against +5.3 s)
    assert fcfs > 0.0 and edf < 0.05 * fcfs, (edf, fcfs)


def test_the_snapshots_corrections_decide_whatever_was_evaluated_before(world, fm):
    """The forward model keeps one serving model (and its memos of correction factors and decode terms) per
    corrections object: a snapshot with other corrections is scored with those, as a fresh model scores it."""
    from worldmodel.servingmodel import Corrections

    ws, _ = world
    snap = snapshot(ws, T0 + timedelta(seconds=60))
    slow = replace(snap, corrections=Corrections(decode={("H100", "llama-3.1-70b", "bf16"): 3.0},
                                                 prefill={("H100", "llama-3.1-70b"): 2.0}))
    plan, f = _plan(), _forecast()
    first = fm.evaluate(snap, plan, f)
    later = fm.evaluate(slow, plan, f)
    fresh = ForwardModel(ServingModel(), CostConfig()).evaluate(slow, plan, f)
    assert later == fresh
    assert later.sla_met < first.sla_met  # slower steps serve fewer requests within their SLA
    assert fm.evaluate(snap, plan, f) == first
