"""Ground-truth simulator: conservation, telemetry reconciliation, determinism, negative prices, hand-computed
SLA accounting and the observation stream's information rules (DESIGN.md protocol v1, issue 3)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from optimizer.registry import create
from schemas.fleet import default_fleet
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan, Routing
from schemas.policy import History, Observations, Policy, PolicyContext
from streams.replay.driver import RunResult, run_replay
from streams.replay.metrics import request_outcomes, summarize
from streams.workload.builder import REQUEST_SCHEMA, Workload, build_workload
from worldmodel.groundtruth.observe import met
from worldmodel.groundtruth.runtime import SiteRuntime
from worldmodel.physics import step_coefficients

MARKET = "PJM"
PERIOD_S = 300.0
SITE = "site-pjm"
SLA = {"code": (1000.0, 50.0), "chat": (2000.0, 100.0), "batch": (None, None)}
MODEL = {"code": "llama-3.1-8b", "chat": "llama-3.1-70b", "batch": "llama-3.1-70b"}


class Recording(Policy):
    """Wraps a policy and keeps every Observations it is handed."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.seen: list[Observations] = []

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return self.inner.start(ctx, history)

    def plan(self, obs: Observations) -> Plan:
        self.seen.append(obs)
        return self.inner.plan(obs)


class Static(Policy):
    """A fixed plan every period."""

    name = "static"

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return self._plan

    def plan(self, obs: Observations) -> Plan:
        return self._plan


def pool(model: str, gpu: str, n: int, *, max_batch: int = 256) -> PoolPlan:
    tp = {"llama-3.1-8b": 1, "llama-3.1-70b": 4 if gpu == "H100" else 8}[model]
    clock = 1980 if gpu == "H100" else 1410
    return PoolPlan(SITE, model, gpu, n, n, tp, "bf16", max_batch, clock)


def static_plan(*pools: PoolPlan, ordering: Ordering = Ordering.EDF) -> Plan:
    return Plan(
        pools=pools,
        routing=Routing.LEAST_LOAD,
        ordering=ordering,
        batch_admission=BatchAdmission.PRESSURE,
        autoscale=False,
        label="test: static",
    )


def hand_frame(rows: list[dict]) -> pl.DataFrame:
    """A requests frame in the workload builder's schema from a few hand-written requests."""
    out = []
    for k, r in enumerate(rows):
        cls = r["cls"]
        ttft, tpot = SLA[cls]
        out.append(
            {
                "request_id": f"hand-{k}",
                "arrival_s": r["at"],
                "request_class": cls,
                "model": MODEL[cls],
                "input_tokens": r["inp"],
                "output_tokens": r["out"],
                "prefix_block_ids": r.get("blocks", []),
                "deadline_s": r.get("deadline"),
                "sla_ttft_ms": ttft,
                "sla_tpot_ms": tpot,
                "tenant": f"tenant-{cls}",
                "allowed_regions": r.get("regions", ["us-east"]),
            }
        )
    return pl.DataFrame(out, schema=REQUEST_SCHEMA).sort("arrival_s")


def hand_runtime(rows: list[dict], plan: Plan) -> SiteRuntime:
    """A runtime on the default PJM site with no hidden node variation, prewarmed at the plan's floors."""
    rt = SiteRuntime(default_fleet((MARKET,)).site(MARKET), hand_frame(rows))
    rt.hw.node_speed[:] = 1.0  # the hand computation assumes nominal nodes
    rt.apply_plan(plan, prewarm=True)
    return rt


@pytest.fixture(scope="module")
def wl() -> Workload:
    return build_workload(MARKET, 2023, periods=3, seed=0)


@pytest.fixture(scope="module")
def prod(wl: Workload) -> tuple[RunResult, Recording]:
    policy = Recording(create("production"))
    return run_replay(wl, policy, default_fleet((MARKET,)), keep_observations=True), policy


# --- conservation ---------------------------------------------------------------------------------------


def test_conservation_per_class_and_overall(prod: tuple[RunResult, Recording]) -> None:
    run, _ = prod
    s = summarize(run)
    assert s["offered"] == run.workload.requests.height
    assert s["offered"] == s["completed"] + s["unfinished"]
    assert sum(c["offered"] for c in s["classes"].values()) == s["offered"]
    for name, c in s["classes"].items():
        n = run.workload.requests.filter(pl.col("request_class") == name).height
        assert c["offered"] == n
        assert c["offered"] == c["completed"] + c["unfinished"]
        assert 0 <= c["sla_met"] <= c["completed"]
    # every request id exactly once in the outcomes: a completion record or an unfinished request
    comp = pl.concat(run.observations["completions"])
    assert comp["request_id"].n_unique() == comp.height == s["completed"]
    done = set(comp["request_id"].to_list())
    unfinished = set(run.workload.requests["request_id"].to_list()) - done
    assert len(unfinished) == s["unfinished"]
    assert done | unfinished == set(run.workload.requests["request_id"].to_list())
    per_class = comp.group_by("request_class").len()
    for row in per_class.iter_rows(named=True):
        assert row["len"] == s["classes"][row["request_class"]]["completed"]


def test_conservation_with_unfinished_work(wl: Workload) -> None:
    """A plan with no 8B replicas leaves every code request unfinished; none is dropped from the count."""
    interactive = wl.requests.filter(pl.col("request_class") != "batch")
    small = replace(wl, requests=interactive.filter(pl.col("arrival_s") < PERIOD_S))
    plan = static_plan(pool("llama-3.1-70b", "H100", 4))
    run = run_replay(small, Static(plan), default_fleet((MARKET,)), window_s=PERIOD_S, grace_s=PERIOD_S)
    s = summarize(run)
    n_code = small.requests.filter(pl.col("request_class") == "code").height
    assert n_code > 0
    assert s["classes"]["code"]["unfinished"] == n_code
    assert s["classes"]["code"]["sla_met"] == 0
    assert s["classes"]["code"]["sla_violation_rate"] == 1.0
    assert s["offered"] == small.requests.height == s["completed"] + s["unfinished"]
    assert s["unfinished"] >= n_code
    assert s["sla_violation_rate"] == pytest.approx((s["offered"] - s["sla_met"]) / s["offered"])


# --- energy and GPU-hours reconcile with the emitted telemetry -------------------------------------------


#: non-GPU power of a powered 8-GPU node (W): Splitwise idle node power minus 8 idle GPUs (worldmodel/physics/power.py)
NODE_OVERHEAD_W = {"H100": 2800.0 - 8 * 129.0, "A100": 1500.0 - 8 * 73.7}  # Splitwise idle node - 8 GPU idle
PUE = 1.3  # schemas/cost.py default


def _it_energy_from_telemetry(tel: pl.DataFrame) -> float:
    """Joules of site IT energy from DCGM rows: GPU power x 10 s, plus node overhead of every powered node."""
    gpu_j = float(tel["DCGM_FI_DEV_POWER_USAGE"].sum()) * 10.0
    nodes = tel.select("event_at", "hostname", "modelName").unique()
    over = NODE_OVERHEAD_W
    node_j = sum(over[g] * 10.0 * n for g, n in nodes.group_by("modelName").len().iter_rows())
    return gpu_j + node_j


def test_energy_and_gpu_hours_reconcile_with_telemetry(prod: tuple[RunResult, Recording]) -> None:
    run, _ = prod
    logs = run.runtime.logs
    tel = pl.concat(run.observations["telemetry"])
    s = summarize(run)
    n_site = int(logs.n_site[0])
    site_j = float(logs.site_it_w[:n_site].sum()) * 10.0
    assert _it_energy_from_telemetry(tel) == pytest.approx(site_j, rel=1e-9)
    assert s["energy_mwh"] == pytest.approx(site_j * PUE / 3.6e9, rel=1e-9)
    # every GPU named in telemetry is a real GPU of the site, and its hostname's type matches
    n_gpus = run.runtime.hw.g_type.shape[0]
    idx = tel["uuid"].str.extract(r"-(\d{4})$").cast(pl.Int64)
    assert idx.null_count() == 0 and int(idx.min()) >= 0 and int(idx.max()) < n_gpus
    assert (tel["hostname"].str.contains("h100") == (tel["modelName"] == "H100")).all()
    # GPU-hours: telemetry rows x 10 s == metrics' gpu_hours == the site log's warm-or-loading GPUs
    assert tel.height * 10.0 / 3600.0 == pytest.approx(s["gpu_hours"], rel=1e-9)
    assert float(logs.site_gpus[:n_site].sum()) * 10.0 / 3600.0 == pytest.approx(s["gpu_hours"], rel=1e-9)
    # the cumulative DCGM energy counter of each GPU ends at its summed power x 10 s
    per_gpu = tel.group_by("uuid").agg(
        pl.col("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").max().alias("cum"),
        (pl.col("DCGM_FI_DEV_POWER_USAGE").sum() * 1e4).alias("sum"),
    )
    assert np.allclose(per_gpu["cum"], per_gpu["sum"], rtol=1e-9)


def test_gpu_hours_reconcile_on_a_large_fleet(wl: Workload) -> None:
    """128 warm replicas for 15 minutes emit more telemetry rows than a fixed buffer would hold."""
    code = replace(wl, requests=wl.requests.filter(pl.col("request_class") == "code"))
    plan = static_plan(pool("llama-3.1-8b", "H100", 64), pool("llama-3.1-8b", "A100", 64))
    run = run_replay(code, Static(plan), default_fleet((MARKET,)), window_s=3 * PERIOD_S)
    logs = run.runtime.logs
    n_site = int(logs.n_site[0])
    ticks = n_site
    assert int(logs.n_tel[0]) == 128 * ticks  # one row per replica per 10 s tick, none lost
    s = summarize(run)
    assert s["gpu_hours"] == pytest.approx(128 * ticks * 10.0 / 3600.0, rel=1e-9)
    assert float(logs.site_gpus[:n_site].sum()) * 10.0 / 3600.0 == pytest.approx(s["gpu_hours"], rel=1e-9)


# --- determinism ----------------------------------------------------------------------------------------


def test_determinism(wl: Workload, prod: tuple[RunResult, Recording]) -> None:
    first, _ = prod
    again = run_replay(wl, create("production"), default_fleet((MARKET,)))
    a, b = first.runtime.req, again.runtime.req
    for name in ("rep", "dispatched", "first", "done", "cached", "gen", "preempted"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    sa, sb = summarize(first), summarize(again)
    sa.pop("wall_s")
    sb.pop("wall_s")
    assert sa == sb


# --- negative prices ------------------------------------------------------------------------------------


def test_cost_positive_on_negative_price_window() -> None:
    """CAISO day-ahead 2024-05-19 16:00-18:00 UTC is below -$25/MWh: energy is credited, cost stays > 0."""
    start = datetime(2024, 5, 19, 16, tzinfo=UTC)
    w = build_workload("CAISO", 2024, start=start, periods=2, seed=0)
    assert w.window.mean_price_usd_mwh < 0
    run = run_replay(w, create("production"), default_fleet(("CAISO",)))
    prices = w.prices.filter(
        (pl.col("interval_start") >= start) & (pl.col("interval_start") < start + timedelta(seconds=run.end_s))
    )
    assert (prices["lmp_usd_mwh"] < 0).all()  # the whole horizon, drain included, is negative-priced
    s = summarize(run)
    assert s["energy_cost_usd"] < 0
    assert s["energy_share"] < 0
    assert s["cost_usd"] > 0 and s["cost_usd_owned"] > 0
    assert s["cost_usd"] == pytest.approx(s["gpu_cost_usd"] + s["energy_cost_usd"])
    assert s["gp_per_dollar"] == pytest.approx(s["sla_met"] / s["cost_usd"])
    # energy cost, written out: each 10 s site row (ending at site_t) draws IT power x PUE 1.3 for 10 s, priced at
    # the $/MWh of the UTC hour it falls in (the window starts on the hour); negative hours credit it
    assert run.end_s > 3600.0  # the drain reaches a second hour: more than one price applies
    hour_price = dict(zip(prices["interval_start"].to_list(), prices["lmp_usd_mwh"].to_list(), strict=True))
    assert len(hour_price) == prices.height >= 2
    logs = run.runtime.logs
    n = int(logs.n_site[0])
    row_mwh = logs.site_it_w[:n] * PUE * 10.0 / 3.6e9  # W x PUE x s -> MWh
    row_hour = [start + timedelta(hours=int((t - 5.0) // 3600.0)) for t in logs.site_t[:n]]
    row_price = np.array([hour_price[h] for h in row_hour])
    assert (row_price < 0).all() and len(set(row_hour)) >= 2
    assert s["energy_mwh"] == pytest.approx(float(row_mwh.sum()), rel=1e-9)
    expected_usd = float((row_mwh * row_price).sum())
    assert expected_usd < 0
    assert s["energy_cost_usd"] == pytest.approx(expected_usd, rel=1e-9)
    # GPU rent, written out: $2.50 per H100-hour, $1.50 per A100-hour (schemas/cost.py defaults)
    by_type = s["gpu_hours_by_type"]
    assert s["gpu_cost_usd"] == pytest.approx(2.50 * by_type.get("H100", 0.0) + 1.50 * by_type.get("A100", 0.0))


# --- SLA accounting by hand -----------------------------------------------------------------------------


def _iteration_s(c: object, n_dec: int, kv: float, p_tok: float, p_attn: float) -> float:
    return (
        c.base_s
        + c.per_seq_s * n_dec
        + c.per_kv_token_s * kv  # type: ignore[attr-defined]
        + c.per_prefill_token_s * p_tok
        + c.per_prefill_attn_s * p_attn
    )  # type: ignore[attr-defined]


#: step-time coefficients (s) on H100 at 1980 MHz, bf16, written out: (base, per decode sequence, per KV token
#: in the batch, per prefill token, per prefill attention token pair); the calibrated physics tables' values
COEF = {
    "llama-3.1-70b": SimpleNamespace(base_s=0.0176696094019146, per_seq_s=5.206628129706792e-05,
                                     per_kv_token_s=3.056716417910448e-08, per_prefill_token_s=5.691053158636239e-05,
                                     per_prefill_attn_s=6.626491405460061e-10),  # TP4
    "llama-3.1-8b": SimpleNamespace(base_s=0.006147547022562765, per_seq_s=0.0,
                                    per_kv_token_s=4.8907462686567165e-08, per_prefill_token_s=1.6238624873609707e-05,
                                    per_prefill_attn_s=4.663548357784794e-09),  # TP1
}


def _alone(model: str, inp: int, out: int) -> tuple[float, float]:
    """(TTFT, mean TPOT) of one request alone on one replica, from the written-out coefficients."""
    c = COEF[model]
    ttft, done = 0.0, 0
    while done < inp:  # chunked prefill, 8192 tokens per iteration (vLLM V1's H100 max_num_batched_tokens)
        chunk = min(8192, inp - done)
        ttft += _iteration_s(c, 0, done, chunk, chunk * (done + chunk / 2))
        done += chunk
    k = out - 1  # the first token comes with the last prefill chunk; then k decode steps, context +1 each
    decode = sum(_iteration_s(c, 1, inp + 1 + j, 0, 0) for j in range(k))
    return ttft, decode / k


CASES = [  # (class, input, output, arrival): each alone on its replica
    ("chat", 5000, 50, 1.0),
    ("code", 3000, 200, 2.0),
    ("chat", 60000, 20, 40.0),  # long prompt: TTFT over the chat SLO
]
#: (TTFT s, mean TPOT s) of each case, evaluated once from `_alone` and kept as constants
ALONE = [(0.31050538, 0.017875276), (0.075849389, 0.0062991602), (4.7557686, 0.019556011)]


def test_sla_accounting_hand_computed() -> None:
    plan = static_plan(pool("llama-3.1-70b", "H100", 1), pool("llama-3.1-8b", "H100", 1))
    rt = hand_runtime([{"cls": c, "inp": i, "out": o, "at": t} for c, i, o, t in CASES], plan)
    rt.advance(120.0)
    req = rt.req
    assert np.isfinite(req.done).all()
    o = request_outcomes(SimpleNamespace(runtime=rt))  # type: ignore[arg-type]
    for k in (0, 1):  # the simulator's coefficients are the written-out ones
        c = step_coefficients(MODEL[CASES[k][0]], "H100", 4 if k == 0 else 1, "bf16", 1980)
        for name, value in vars(COEF[MODEL[CASES[k][0]]]).items():
            assert getattr(c, name) == pytest.approx(value, rel=1e-12, abs=1e-15), name
    expected_met = []
    for k, (cls, inp, out, at) in enumerate(CASES):
        ttft, tpot = _alone(MODEL[cls], inp, out)
        assert (ttft, tpot) == pytest.approx(ALONE[k], rel=1e-6)
        assert req.first[k] - at == pytest.approx(ttft, rel=1e-9)
        assert (req.done[k] - req.first[k]) / (out - 1) == pytest.approx(tpot, rel=1e-9)
        assert o["ttft_s"][k] == pytest.approx(ttft, rel=1e-9)
        assert o["tpot_s"][k] == pytest.approx(tpot, rel=1e-9)
        slo_ttft, slo_tpot = SLA[cls]
        expected_met.append(ttft <= slo_ttft / 1000.0 and tpot <= slo_tpot / 1000.0)
    assert o["sla_met"].tolist() == expected_met
    assert expected_met == [True, True, False]


def test_batch_sla_is_the_deadline() -> None:
    """A deferrable request meets its SLA iff it is done by its deadline, however slow its tokens."""
    plan = static_plan(pool("llama-3.1-70b", "H100", 1))
    rows = [
        {"cls": "batch", "inp": 4000, "out": 30, "at": 0.5, "deadline": 1800.0},
        {"cls": "batch", "inp": 4000, "out": 30, "at": 60.0, "deadline": 60.1},
    ]
    rt = hand_runtime(rows, plan)
    rt.advance(300.0)
    o = request_outcomes(SimpleNamespace(runtime=rt))  # type: ignore[arg-type]
    assert np.isfinite(rt.req.done).all()
    assert o["sla_met"].tolist() == [True, False]
    sla = met(rt.req.cls, o["ttft_s"], o["tpot_s"], rt.req.done, rt.req.deadline, rt.slo_ttft_s, rt.slo_tpot_s)
    assert sla.tolist() == [True, False]


def test_edf_orders_deferrable_work_by_deadline_fcfs_by_arrival() -> None:
    """One replica, one batch slot: a long chat request holds it; two batch requests queue behind it."""
    rows = [
        {"cls": "chat", "inp": 1000, "out": 400, "at": 0.1},
        {"cls": "batch", "inp": 500, "out": 5, "at": 0.2, "deadline": 7200.0},  # earlier arrival, later deadline
        {"cls": "batch", "inp": 500, "out": 5, "at": 0.3, "deadline": 3600.0},
    ]
    order = {}
    for ordering in (Ordering.EDF, Ordering.FCFS):
        plan = static_plan(pool("llama-3.1-70b", "H100", 1, max_batch=1), ordering=ordering)
        rt = hand_runtime(rows, plan)
        rt.advance(300.0)
        assert np.isfinite(rt.req.done).all()
        assert min(rt.req.dispatched[1], rt.req.dispatched[2]) >= rt.req.done[0]
        order[ordering] = "late-deadline first" if rt.req.dispatched[1] < rt.req.dispatched[2] else "early first"
    assert order == {Ordering.EDF: "early first", Ordering.FCFS: "late-deadline first"}


# --- information availability ---------------------------------------------------------------------------


def test_arrivals_carry_no_output_length(prod: tuple[RunResult, Recording]) -> None:
    _, policy = prod
    assert policy.seen
    for obs in policy.seen:
        assert not any("output" in c for c in obs.arrivals.columns), obs.arrivals.columns
    assert {
        "request_id",
        "request_class",
        "model",
        "input_tokens",
        "prefix_block_ids",
        "sla_ttft_ms",
        "sla_tpot_ms",
        "deadline_at",
    } <= set(policy.seen[0].arrivals.columns)


def test_no_future_leakage(prod: tuple[RunResult, Recording]) -> None:
    run, policy = prod
    start = run.workload.window.start
    prev = None
    ids: list[str] = []
    for obs in policy.seen:
        assert obs.as_of == start + timedelta(seconds=obs.period_index * PERIOD_S)
        for name in ("arrivals", "completions", "telemetry", "fleet_events"):
            frame = getattr(obs, name)
            if frame.height:
                assert frame["event_at"].max() <= obs.as_of, name
                assert frame["arrived_at"].max() <= obs.as_of, name
                if prev is not None:  # delivered once, in the period it happened
                    assert frame["event_at"].min() > prev, name
        if obs.prices.height:
            assert obs.prices["published_at"].max() <= obs.as_of
        ids.extend(obs.completions["request_id"].to_list())
        prev = obs.as_of
    # a completion is reported only after it happened: its request's done time is within the period
    done_s = dict(zip(run.workload.requests["request_id"].to_list(), run.runtime.req.done.tolist(), strict=True))
    assert ids and all(not math.isnan(done_s[i]) for i in ids)
    for obs in policy.seen:
        for rid, at in zip(obs.completions["request_id"].to_list(), obs.completions["event_at"].to_list(), strict=True):
            assert abs((at - start).total_seconds() - done_s[rid]) < 1e-3


def test_three_sites_a_request_pinned_to_a_full_site_does_not_hold_up_the_rest() -> None:
    """Two us-east-pinned requests fill site-pjm's one slot and queue; work allowed at site-ercot starts at
    once instead of waiting behind them, and the queued pinned request keeps its place at the head."""
    sites = default_fleet().sites
    plan = static_plan(*(replace(pool("llama-3.1-8b", "H100", 1, max_batch=1), site=s.name) for s in sites[:2]))
    rows = [
        {"cls": "code", "inp": 2000, "out": 400, "at": 0.0},
        {"cls": "code", "inp": 2000, "out": 400, "at": 0.1},
        {"cls": "code", "inp": 500, "out": 20, "at": 0.2, "regions": ["us-central"]},
    ]
    rt = SiteRuntime(sites, hand_frame(rows))
    rt.hw.node_speed[:] = 1.0
    rt.apply_plan(plan, prewarm=True)
    rt.advance(120.0)
    first = rt.req.first
    assert first[2] - 0.2 < 0.5  # served at site-ercot straight away
    assert first[1] >= rt.req.done[0]  # the second pinned request waited for the first to finish


def test_three_sites_each_autoscaler_sees_its_share_of_the_queue() -> None:
    """A queued request allowed at n sites counts 1/n in each of those sites' backlog (none elsewhere)."""
    from worldmodel.groundtruth.scaler import model_demand

    sites = default_fleet().sites
    plan = static_plan(*(replace(pool("llama-3.1-8b", "H100", 0), site=s.name) for s in sites))
    regions = [["us-east"], ["us-east"], ["us-east", "us-central"], ["us-east", "us-central", "us-west"]]
    rows = [{"cls": "code", "inp": 500, "out": 20, "at": 0.1 * k, "regions": r} for k, r in enumerate(regions)]
    rt = SiteRuntime(sites, hand_frame(rows))
    rt.apply_plan(plan, prewarm=True)
    rt.advance(1.0)
    m = int(rt.req.model[0])
    waiting = [model_demand(rt.rep, rt.pools, rt.req, rt.q, rt.si, m, s)[6] for s in range(3)]
    assert waiting == pytest.approx([2 + 1 / 2 + 1 / 3, 1 / 2 + 1 / 3, 1 / 3])
