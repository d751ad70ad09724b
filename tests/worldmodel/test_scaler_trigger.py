"""The autoscaler's triggers (Physics.scaler_trigger): vLLM V1's waiting gauge, the interactive backlog trigger
and the deferrable deadline-slack trigger, against the legacy trigger. Hand-built states, no engine run."""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl
import pytest

from schemas.fleet import default_fleet
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan, Routing
from streams.cli import build_parser
from streams.replay.cli import _physics
from streams.workload.builder import REQUEST_SCHEMA
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.engine import enqueue
from worldmodel.groundtruth.runtime import Physics, SiteRuntime
from worldmodel.groundtruth.scaler import (
    autoscale_tick,
    deferrable_slack,
    fold_completions,
    model_demand,
    model_waiting,
    pool_count,
    telemetry_tick,
    waiting_gauge,
)

MARKET = "PJM"
SITE = "site-pjm"
M70 = "llama-3.1-70b"
MODEL = {"code": "llama-3.1-8b", "chat": M70, "batch": M70}
SLA = {"code": (1000.0, 50.0), "chat": (2000.0, 100.0), "batch": (None, None)}
FAR = 1.0e6  # s: arrivals the tests never advance to


def frame(rows: list[dict]) -> pl.DataFrame:
    out = []
    for k, r in enumerate(rows):
        ttft, tpot = SLA[r["cls"]]
        out.append({
            "request_id": f"t-{k}", "arrival_s": FAR + k, "request_class": r["cls"], "model": MODEL[r["cls"]],
            "input_tokens": r["inp"], "output_tokens": r.get("out", 300), "prefix_block_ids": [],
            "deadline_s": r.get("deadline"), "sla_ttft_ms": ttft, "sla_tpot_ms": tpot, "tenant": "t",
            "allowed_regions": ["us-east"],
        })  # fmt: skip
    return pl.DataFrame(out, schema=REQUEST_SCHEMA)


def runtime(rows: list[dict], trigger: str, floor: int = 1, ceil: int = 1, autoscale: bool = False) -> SiteRuntime:
    """One site (PJM), the 70B H100 pool between floor and ceil, prewarmed at the floor, nominal nodes."""
    rt = SiteRuntime(default_fleet((MARKET,)).site(MARKET), frame(rows), Physics(scaler_trigger=trigger))
    rt.hw.node_speed[:] = 1.0
    plan = Plan(
        pools=(PoolPlan(SITE, M70, "H100", floor, ceil, 4, "bf16", 256, 1980),),
        routing=Routing.LEAST_LOAD, ordering=Ordering.EDF, batch_admission=BatchAdmission.PRESSURE,
        autoscale=autoscale, autoscale_target=0.8, label="test",
    )  # fmt: skip
    rt.apply_plan(plan, prewarm=True)
    return rt


def warm_70b(rt: SiteRuntime) -> tuple[int, int]:
    """(pool, first warm replica) of the 70B H100 pool."""
    p = rt.pool_keys.index((SITE, M70, "H100"))
    r = int(np.flatnonzero((rt.rep.state == st.WARM) & (rt.rep.pool == p))[0])
    return p, r


def admit(rt: SiteRuntime, r: int, slots: list[dict]) -> None:
    """Put requests into replica r's running set as hand-written (prefill left, cached, generated, ...)."""
    rep, req = rt.rep, rt.req
    for k, s in enumerate(slots):
        i = s["i"]
        rep.seqs[r, k] = i
        rep.active[r, k] = s.get("active", 0)
        rep.chunk[r, k] = s.get("chunk", 0)
        req.rep[i] = r
        req.dispatched[i] = 0.0
        req.cached[i] = s.get("cached", 0)
        req.gen[i] = s.get("gen", 0)
        req.preempted[i] = s.get("preempted", 0)
        req.prefill_left[i] = s["left"]
    rep.n[r] = len(slots)
    rep.stepping[r] = 1
    rep.step_start[r] = 0.0
    rep.step_end[r] = 1.0


# --- the waiting gauge ----------------------------------------------------------------------------------------

GAUGE_ROWS = [
    {"cls": "chat", "inp": 3000},  # 0 decoding
    {"cls": "chat", "inp": 5000},  # 1 partially prefilled (not in the iteration in flight)
    {"cls": "chat", "inp": 4000},  # 2 admitted, prefill not started (512 tokens from the prefix cache)
    {"cls": "chat", "inp": 3000},  # 3 readmitted after a preemption, not scheduled yet
    {"cls": "chat", "inp": 3000},  # 4 its first chunk is in the iteration in flight
    {"cls": "batch", "inp": 6000, "deadline": 7200.0},  # 5 deferrable, admitted, not scheduled
    {"cls": "chat", "inp": 1000},  # 6 queued
    {"cls": "chat", "inp": 1000},  # 7 queued
    {"cls": "batch", "inp": 1000, "deadline": 7200.0},  # 8 queued deferrable
    {"cls": "code", "inp": 1000},  # 9 queued, another model
]


def gauge_state(trigger: str) -> tuple[SiteRuntime, int]:
    rt = runtime(GAUGE_ROWS, trigger)
    _, r = warm_70b(rt)
    admit(rt, r, [
        {"i": 0, "left": 0, "gen": 5, "active": 1},
        {"i": 1, "left": 5000 - 2048, "active": 0},
        {"i": 2, "left": 4000 - 512, "cached": 512},
        {"i": 3, "left": 3000 + 7, "gen": 7, "preempted": 1},
        {"i": 4, "left": 3000, "active": 1, "chunk": 2048},
        {"i": 5, "left": 6000},
    ])  # fmt: skip
    for i in (6, 7, 8, 9):
        enqueue(rt.req, rt.q, rt.si, i, False)
    return rt, r


def tel_row(rt: SiteRuntime, r: int) -> int:
    telemetry_tick(rt.rep, rt.pools, rt.req, rt.q, rt.hw, rt.logs, rt.sf, rt.si, 10.0)
    n = int(rt.logs.n_tel[0])
    rows = np.flatnonzero(rt.logs.tel_rep[:n] == r)
    assert rows.size == 1
    return int(rt.logs.tel_waiting[rows[0]])


def test_waiting_gauge_counts_exactly_the_unscheduled_requests() -> None:
    """v1: waiting = queued (2 chat + 1 deferrable) + admitted without a prefill chunk (2, 3, 5); the partially
    prefilled (1), decoding (0) and in-flight first chunk (4) ones are running; the 8B request is elsewhere."""
    rt, r = gauge_state("v1")
    m = int(rt.req.model[0])
    assert waiting_gauge(rt.rep, rt.pools, rt.req, rt.q, rt.si, r) == 3 + 3
    assert model_waiting(rt.rep, rt.pools, rt.req, rt.q, rt.si, m, 0) == 6.0
    assert tel_row(rt, r) == 6  # telemetry's num_requests_waiting
    _, _, _, running, _, _, waiting, _ = model_demand(rt.rep, rt.pools, rt.req, rt.q, rt.si, m, 0)
    assert running == 3.0  # 0, 1, 4
    assert waiting == 2.0 + 2.0  # the backlog trigger: queued chat + admitted unscheduled chat (2, 3)


def test_legacy_reproduces_the_old_count() -> None:
    """legacy: waiting = queued interactive + admitted before their first token (1, 2, 4, 5) + queued deferrable
    (admission is not HOLD); running = past the first token (0, 3); telemetry = the interactive queue."""
    rt, r = gauge_state("legacy")
    m = int(rt.req.model[0])
    _, _, _, running, _, _, waiting, _ = model_demand(rt.rep, rt.pools, rt.req, rt.q, rt.si, m, 0)
    assert (running, waiting) == (2.0, 2.0 + 4.0 + 1.0)
    assert model_waiting(rt.rep, rt.pools, rt.req, rt.q, rt.si, m, 0) == 7.0
    assert tel_row(rt, r) == 2
    rt.si[st.S_ADMISSION] = st.ADM_HOLD
    assert model_demand(rt.rep, rt.pools, rt.req, rt.q, rt.si, m, 0)[6] == 6.0


# --- the backlog trigger and the deferrable slack trigger -----------------------------------------------------


def tick(rt: SiteRuntime, t: float = 15.0) -> int:
    """One autoscaler tick; the 70B H100 pool's replicas warm or loading after it."""
    autoscale_tick(rt.rep, rt.pools, rt.req, rt.q, rt.hw, rt.logs, rt.sf, rt.si, t)
    return pool_count(rt.rep, rt.pools, rt.pool_keys.index((SITE, M70, "H100")))


def queued(rows: list[dict], trigger: str) -> SiteRuntime:
    rt = runtime(rows, trigger, floor=1, ceil=16, autoscale=True)
    for i in range(len(rows)):
        enqueue(rt.req, rt.q, rt.si, i, False)
    return rt


def test_deferrable_work_alone_does_not_trip_the_backlog_trigger() -> None:
    """50 queued deferrable requests due in 10 h: legacy reads them as backlog (ceil(50/5), capped at +4), v1
    leaves them to the slack trigger, which has ample slack; 50 queued chat requests still scale v1 up."""
    batch = [{"cls": "batch", "inp": 8000, "deadline": 36000.0}] * 50
    assert tick(queued(batch, "legacy")) == 5
    assert tick(queued(batch, "v1")) == 1
    assert tick(queued([{"cls": "chat", "inp": 1000}] * 50, "v1")) == 5


def slack(rt: SiteRuntime, t: float = 15.0) -> int:
    m = int(rt.req.model[0])
    fold_completions(rt.req, rt.logs, rt.sf, rt.si)
    return deferrable_slack(rt.rep, rt.pools, rt.req, rt.q, rt.sf, rt.si, m, 0, t)


def test_a_deferrable_backlog_that_misses_its_deadlines_scales_up() -> None:
    """4000 deferrable requests of 10k prompt tokens due in 10 min: far beyond one replica's 10 minutes."""
    rt = queued([{"cls": "batch", "inp": 10000, "deadline": 600.0}] * 4000, "v1")
    assert slack(rt) > 5
    assert tick(rt) == 5  # bounded like the other triggers: x2 or +4 per tick


def test_a_deferrable_backlog_with_ample_slack_does_not_scale_up() -> None:
    """The same work due in a day fits one replica's day; within SLACK_MIN_S of a deadline nothing helps."""
    rt = queued([{"cls": "batch", "inp": 10000, "deadline": 86400.0}] * 4000, "v1")
    assert slack(rt) == 1
    assert tick(rt) == 1
    rt = queued([{"cls": "batch", "inp": 10000, "deadline": 60.0}] * 4000, "v1")  # past helping
    assert slack(rt) == 0  # no deadline a replica started now could still help with: no say
    assert tick(rt) == 1


def test_the_slack_trigger_lets_an_oversized_fleet_scale_down() -> None:
    """Eight idle warm replicas, deferrable work one replica finishes well before its deadline: the trigger asks
    for the fewest replicas that meet it, not for the fleet it has (which would pin it at its peak)."""
    rt = runtime([{"cls": "batch", "inp": 10000, "deadline": 86400.0}] * 100, "v1", floor=8, ceil=16, autoscale=True)
    for i in range(100):
        enqueue(rt.req, rt.q, rt.si, i, False)
    rt.pools.floor[rt.pool_keys.index((SITE, M70, "H100"))] = 1
    assert slack(rt) == 1
    assert tick(rt) == 1
    rt = runtime([{"cls": "batch", "inp": 10000, "deadline": 1200.0}] * 2000, "v1", floor=8, ceil=16, autoscale=True)
    for i in range(2000):  # work that needs some but not all of them
        enqueue(rt.req, rt.q, rt.si, i, False)
    rt.pools.floor[rt.pool_keys.index((SITE, M70, "H100"))] = 1
    need = slack(rt)
    assert 1 < need < 8
    assert tick(rt) == need


N_SLACK = 1500


def slack_state(out_unfinished: int) -> SiteRuntime:
    """Deferrable work queued (due in 10 min) and admitted (decoding, partly prefilled, unscheduled), five
    completed deferrable requests of 300 output tokens; every unfinished request's output length set to
    out_unfinished."""
    rows = [{"cls": "batch", "inp": 6000, "deadline": 600.0}] * N_SLACK + [{"cls": "batch", "inp": 2000}] * 5
    rows = [dict(r, deadline=r.get("deadline", 600.0)) for r in rows]
    rt = runtime(rows, "v1", floor=1, ceil=16, autoscale=True)
    _, r = warm_70b(rt)
    admit(rt, r, [
        {"i": 0, "left": 0, "gen": 40, "active": 1},
        {"i": 1, "left": 2000, "active": 0},
        {"i": 2, "left": 6000},
    ])  # fmt: skip
    for i in range(3, N_SLACK):
        enqueue(rt.req, rt.q, rt.si, i, False)
    for k, i in enumerate(range(N_SLACK, N_SLACK + 5)):  # completed: their output length is known
        rt.req.gen[i] = rt.req.out[i] = 300
        rt.req.done[i] = 1.0
        rt.logs.completed[k] = i
    rt.logs.n_completed[0] = 5
    rt.req.out[:N_SLACK] = out_unfinished
    return rt


def test_the_slack_estimate_never_reads_the_output_length_of_unfinished_work() -> None:
    a, b = slack_state(1), slack_state(10**9)
    assert 1 < slack(a) < 5  # a decision the output lengths could move either way
    assert slack(a) == slack(b)
    assert tick(a) == tick(b)
    c = slack_state(1)  # the completed outputs do count
    c.req.gen[N_SLACK:] = 30000
    assert slack(c) > slack(a)


# --- wiring ---------------------------------------------------------------------------------------------------


def test_the_trigger_is_wired_from_physics_and_the_cli() -> None:
    assert runtime([], "v1").si[st.S_SCALER_TRIGGER] == st.SCALER_V1
    assert runtime([], "legacy").si[st.S_SCALER_TRIGGER] == st.SCALER_LEGACY
    with pytest.raises(ValueError, match="scaler_trigger"):
        runtime([], "v2")
    args = build_parser().parse_args(["replay", "--scaler-trigger", "legacy"])
    assert _physics(args).scaler_trigger == "legacy"
    assert _physics(build_parser().parse_args(["replay"])).scaler_trigger == "v1"
    assert Physics().scaler_trigger == "v1"
    assert isinstance(args, argparse.Namespace)
