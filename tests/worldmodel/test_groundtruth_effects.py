"""Hidden effects of the ground-truth simulator on small hand-built scenarios (minutes of simulated time):

(a) a precision change mid-run reloads the pool's replicas: they serve nothing while loading, their GPUs are
    still held (and counted) meanwhile, and afterwards they serve at the new precision's speed;
(b) no hidden thermal slowdown (it had no cited magnitude): sustained full load at the maximum clock leaves a
    prefill-bound probe exactly as fast as on a fresh replica, and telemetry temperature follows power;
(c) the site power-cap controller pulls a fully busy fleet at maximum clock to at or under the cap and keeps it
    there, and does nothing when the fleet draws less than the cap.

Every runtime has nominal nodes (no hidden per-node variation) so step times can be computed by hand from the
physics coefficients, as in test_groundtruth.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import polars as pl
import pytest

from schemas.fleet import PRECISION_INDEX, Precision, default_fleet
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan, Routing
from schemas.records import frame_schema
from streams.workload.builder import REQUEST_SCHEMA
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.observe import ObservationStream
from worldmodel.groundtruth.runtime import Physics, SiteRuntime
from worldmodel.physics import step_coefficients

MARKET, SITE = "PJM", "site-pjm"
M8 = "llama-3.1-8b"  # TP1: one GPU per replica
TEL_DT = 10.0


def pool(gpu: str, n: int, *, precision: str = "bf16", clock: float | None = None, kv_dtype: str = "auto") -> PoolPlan:
    clock = clock or (1980 if gpu == "H100" else 1410)
    return PoolPlan(SITE, M8, gpu, n, n, 1, precision, 256, clock, kv_dtype=kv_dtype)


def static_plan(*pools: PoolPlan) -> Plan:
    return Plan(pools=pools, routing=Routing.LEAST_LOAD, ordering=Ordering.EDF,
                batch_admission=BatchAdmission.PRESSURE, autoscale=False, label="test: static")


def frame(rows: list[tuple[float, int, int]]) -> pl.DataFrame:
    """Code requests on the 8B model as (arrival s, input tokens, output tokens)."""
    out = [{"request_id": f"r{k}", "arrival_s": at, "request_class": "code", "model": M8, "input_tokens": inp,
            "output_tokens": o, "prefix_block_ids": [], "deadline_s": None, "sla_ttft_ms": 1000.0,
            "sla_tpot_ms": 50.0, "tenant": "tenant-code", "allowed_regions": ["us-east"]}
           for k, (at, inp, o) in enumerate(rows)]
    return pl.DataFrame(out, schema=REQUEST_SCHEMA).sort("arrival_s")


def runtime(rows: list[tuple[float, int, int]], plan: Plan, physics: Physics | None = None) -> SiteRuntime:
    """The default PJM site with nominal nodes, prewarmed at the plan's floors."""
    rt = SiteRuntime(default_fleet((MARKET,)).site(MARKET), frame(rows), physics)
    rt.hw.node_speed[:] = 1.0
    rt.apply_plan(plan, prewarm=True)
    return rt


def _iteration_s(c, n_dec: int, kv: float, p_tok: float, p_attn: float, compute: float = 1.0,
                 memory: float = 1.0) -> float:
    mem = c.base_s + c.per_seq_s * n_dec + c.per_kv_token_s * kv
    return mem * memory + (c.per_prefill_token_s * p_tok + c.per_prefill_attn_s * p_attn) * compute


def alone_ttft(c, inp: int, compute: float = 1.0, memory: float = 1.0, budget: float | None = None) -> float:
    """TTFT (s) of a request alone on a replica: chunked prefill, the pool's token budget per iteration."""
    t, done = 0.0, 0
    budget = int(budget or c.token_budget)
    while done < inp:
        chunk = min(budget, inp - done)
        t += _iteration_s(c, 0, done, chunk, chunk * (done + chunk / 2), compute, memory)
        done += chunk
    return t


def alone_tpot(c, inp: int, out: int) -> float:
    """Mean TPOT (s) of a request alone on a replica: out - 1 decode steps, context growing by one each."""
    return sum(_iteration_s(c, 1, inp + 1 + j, 0, 0) for j in range(out - 1)) / (out - 1)


def tel(rt: SiteRuntime) -> pl.DataFrame:
    """The per-replica telemetry log as a frame."""
    lg, n = rt.logs, int(rt.logs.n_tel[0])
    return pl.DataFrame({"t": lg.tel_t[:n], "rep": lg.tel_rep[:n], "state": lg.tel_state[:n],
                         "util": lg.tel_util[:n], "clock": lg.tel_clock[:n], "power": lg.tel_power_w[:n],
                         "temp": lg.tel_temp[:n]})


def reconfigured_engines(rt: SiteRuntime) -> set[tuple[str, str]]:
    """(precision, kv_cache_dtype) the observed fleet events of replica reconfigurations report."""
    ev = ObservationStream(rt, datetime(2023, 7, 1, tzinfo=UTC), SITE, pl.DataFrame(schema=frame_schema("price")))
    return set(ev.fleet_events().filter(pl.col("kind") == "replica_reconfigured")
               .select("precision", "kv_cache_dtype").iter_rows())  # fmt: skip


def site_log(rt: SiteRuntime) -> pl.DataFrame:
    lg, n = rt.logs, int(rt.logs.n_site[0])
    return pl.DataFrame({"t": lg.site_t[:n], "it_w": lg.site_it_w[:n], "gpus": lg.site_gpus[:n],
                         "loading": lg.site_gpus_loading[:n]})


# --- (a) a precision change mid-run reloads the replicas -------------------------------------------------------

SWITCH_S = 120.0
PROBE = (400.5, 6000, 100)  # arrives long after the reload, alone on an idle replica


def _precision_run(switch_to: str, *, start: str = "bf16", kv_from: str = "auto", kv_to: str = "auto",
                   ) -> tuple[SiteRuntime, dict]:
    rows = [(0.5 + 0.5 * k, 2000, 200) for k in range(300)] + [PROBE]  # steady load until 150 s
    rt = runtime(rows, static_plan(pool("H100", 2, precision=start, kv_dtype=kv_from)))
    rt.advance(SWITCH_S)
    before = {"gen": int(rt.req.gen.sum()), "running": rt.rep.n[:2].copy(),
              "done": int(np.isfinite(rt.req.done).sum()), "dispatched": rt.req.dispatched.copy()}
    rt.apply_plan(static_plan(pool("H100", 2, precision=switch_to, kv_dtype=kv_to)))
    return rt, before


def test_precision_switch_reloads_serves_nothing_while_loading_then_serves_faster() -> None:
    fp8 = step_coefficients(M8, "H100", 1, "fp8", 1980.0)
    bf16 = step_coefficients(M8, "H100", 1, "bf16", 1980.0)
    rt, before = _precision_run("fp8")
    reps = np.flatnonzero(rt.rep.pool == 0)[:2]
    assert before["running"].sum() > 0  # work was in flight when the plan switched
    # the switch: both replicas reload the fp8 weights; their running sequences go back to the queue
    ready_at = SWITCH_S + fp8.weights_load_s
    assert rt.rep.state[reps].tolist() == [st.LOADING, st.LOADING]
    assert rt.rep.prec[reps].tolist() == [PRECISION_INDEX[Precision.FP8]] * 2
    assert rt.rep.ready_at[reps] == pytest.approx([ready_at, ready_at], rel=1e-12)
    assert rt.rep.n[reps].tolist() == [0, 0]
    assert int(rt.req.preempted.sum()) == int(before["running"].sum())
    n_ev = int(rt.logs.n_ev[0])
    reconf = rt.logs.ev_kind[:n_ev] == st.EV_RECONFIGURED
    assert sorted(rt.logs.ev_rep[:n_ev][reconf].tolist()) == reps.tolist()
    assert (rt.logs.ev_t[:n_ev][reconf] == SWITCH_S).all()
    assert reconfigured_engines(rt) == {("fp8", "auto")}  # fp8 weights, the KV cache left at "auto"

    # while loading: not a token generated, nothing dispatched or completed
    rt.advance(ready_at - 1e-6)
    assert int(rt.req.gen.sum()) == before["gen"]
    assert int(np.isfinite(rt.req.done).sum()) == before["done"]
    new_dispatch = (rt.req.dispatched > SWITCH_S) & ~(before["dispatched"] > 0)
    assert not new_dispatch.any()
    rt.advance(600.0)
    t = tel(rt).filter(pl.col("rep").is_in(reps.tolist()))
    during = t.filter((pl.col("t") > SWITCH_S) & (pl.col("t") < ready_at))
    ticks = int(np.ceil((ready_at - SWITCH_S) / TEL_DT)) - 1  # ticks at 130, 140, .. s before ready_at
    assert during.height == 2 * ticks
    assert (during["state"] == st.LOADING).all() and (during["util"] == 0.0).all()
    # ... yet the GPUs are held: counted in the site's warm-or-loading GPUs (GPU-hours) and drawing power
    s = site_log(rt).filter((pl.col("t") > SWITCH_S) & (pl.col("t") < ready_at))
    assert s["gpus"].to_list() == [2.0] * ticks and s["loading"].to_list() == [2.0] * ticks
    assert (during["power"] > bf16.idle_power_w).all()
    first_after = rt.req.first[rt.req.first > SWITCH_S]
    assert first_after.min() >= ready_at  # service resumes only once the weights are loaded

    # afterwards: the probe, alone, runs at exactly the fp8 step times (faster than bf16)
    k = rt.requests.height - 1
    assert np.isfinite(rt.req.done).all() and rt.req.rep[k] in reps
    assert rt.hw.site_throttle[0] == 1.0
    at, inp, out = PROBE
    ttft, tpot = rt.req.first[k] - at, (rt.req.done[k] - rt.req.first[k]) / (out - 1)
    assert ttft == pytest.approx(alone_ttft(fp8, inp), rel=1e-9)
    assert tpot == pytest.approx(alone_tpot(fp8, inp, out), rel=1e-9)
    assert alone_ttft(fp8, inp) < 0.95 * alone_ttft(bf16, inp)
    assert alone_tpot(fp8, inp, out) < alone_tpot(bf16, inp, out)


def test_reapplying_the_same_precision_does_not_reload() -> None:
    """The baseline of the test above: the same plan again at 120 s keeps the replicas warm and serving."""
    rt, before = _precision_run("bf16")
    reps = np.flatnonzero(rt.rep.pool == 0)[:2]
    assert rt.rep.state[reps].tolist() == [st.WARM, st.WARM]
    assert rt.rep.n[reps].tolist() == before["running"].tolist() and int(rt.req.preempted.sum()) == 0
    rt.advance(SWITCH_S + 40.0)
    assert int(rt.req.gen.sum()) > before["gen"] and int(np.isfinite(rt.req.done).sum()) > before["done"]
    n_ev = int(rt.logs.n_ev[0])
    assert not (rt.logs.ev_kind[:n_ev] == st.EV_RECONFIGURED).any()


def test_kv_dtype_change_reloads_the_replica_like_a_precision_change() -> None:
    """fp8 weights with an "auto" (bf16) KV cache -> the same weights with an fp8 KV cache: vLLM takes
    --kv-cache-dtype at start-up, so both replicas restart (sequences requeued, GPUs held while loading) and
    come back with twice the KV tokens and half the KV read time; re-applying fp8 KV changes nothing."""
    auto = step_coefficients(M8, "H100", 1, "fp8", 1980.0)
    fp8kv = step_coefficients(M8, "H100", 1, "fp8", 1980.0, kv_dtype="fp8")
    rt, before = _precision_run("fp8", start="fp8", kv_to="fp8")
    reps = np.flatnonzero(rt.rep.pool == 0)[:2]
    assert before["running"].sum() > 0
    assert rt.rep.state[reps].tolist() == [st.LOADING, st.LOADING]
    assert rt.rep.prec[reps].tolist() == [st.precision_code("fp8", "fp8")] * 2 == [3, 3]
    assert rt.rep.ready_at[reps] == pytest.approx([SWITCH_S + fp8kv.weights_load_s] * 2, rel=1e-12)
    assert rt.rep.n[reps].tolist() == [0, 0] and int(rt.req.preempted.sum()) == int(before["running"].sum())
    assert rt.rep.coef[reps, st.C_KVCAP].tolist() == [fp8kv.kv_capacity_tokens] * 2
    assert rt.rep.coef[reps, st.C_KV] == pytest.approx([auto.per_kv_token_s / 2] * 2, rel=1e-12)
    n_ev = int(rt.logs.n_ev[0])
    assert sorted(rt.logs.ev_rep[:n_ev][rt.logs.ev_kind[:n_ev] == st.EV_RECONFIGURED].tolist()) == reps.tolist()
    assert reconfigured_engines(rt) == {("fp8", "fp8")}  # what the fleet events tell the world model
    rt.advance(SWITCH_S + 1.0)
    rt.apply_plan(static_plan(pool("H100", 2, precision="fp8", kv_dtype="fp8")))  # the same again: no restart
    assert rt.rep.ready_at[reps] == pytest.approx([SWITCH_S + fp8kv.weights_load_s] * 2, rel=1e-12)
    n_ev2 = int(rt.logs.n_ev[0])
    assert (rt.logs.ev_kind[:n_ev2] == st.EV_RECONFIGURED).sum() == 2


def test_bf16_weights_beside_an_fp8_cache_run_as_vllm_runs_them() -> None:
    """Plans never choose the pair (the policy gate's `kv_dtype_offered`), but an operator's fleet may run it: the
    ground truth reloads into it like any KV change, with the fp8 cache's capacity and read time and the bf16
    weights' load, and reports it; an unknown KV dtype is still an error."""
    bf16_fp8 = step_coefficients(M8, "H100", 1, "bf16", 1980.0, kv_dtype="fp8")
    rt, _ = _precision_run("bf16", kv_to="fp8")
    reps = np.flatnonzero(rt.rep.pool == 0)[:2]
    assert rt.rep.state[reps].tolist() == [st.LOADING, st.LOADING]
    assert rt.rep.prec[reps].tolist() == [st.precision_code("bf16", "fp8")] * 2
    assert rt.rep.coef[reps, st.C_KVCAP].tolist() == [bf16_fp8.kv_capacity_tokens] * 2
    assert rt.rep.ready_at[reps] == pytest.approx([SWITCH_S + bf16_fp8.weights_load_s] * 2, rel=1e-12)
    assert reconfigured_engines(rt) == {("bf16", "fp8")}
    with pytest.raises(ValueError, match=r"unknown KV-cache dtype 'int8'; expected one of \['auto', 'fp8'\]"):
        rt.apply_plan(static_plan(pool("H100", 2, kv_dtype="int8")))


@pytest.mark.parametrize(("gpu", "budget"), [("H100", 8192), ("A100", 2048)])
def test_token_budget_follows_the_gpu_type(gpu: str, budget: int) -> None:
    """A 6,000-token prompt alone: one prefill iteration on H100 (vLLM V1 default 8,192 tokens), three chunks
    of at most 2,048 on A100; Physics(token_budget=...) overrides the default for every pool."""
    inp = 6000
    c = step_coefficients(M8, gpu, 1, "bf16", 1980.0 if gpu == "H100" else 1410.0)
    assert c.token_budget == budget
    for physics, chunk in ((None, budget), (Physics(token_budget=1024), 1024)):
        rt = runtime([(1.0, inp, 20)], static_plan(pool(gpu, 1)), physics)
        rt.advance(30.0)
        ttft = rt.req.first[0] - 1.0
        assert ttft == pytest.approx(alone_ttft(c, inp, budget=chunk), rel=1e-9)
        other = 2048 if chunk == 8192 else 8192
        assert abs(ttft - alone_ttft(c, inp, budget=other)) > 1e-4


# --- (b) no hidden thermal slowdown ---------------------------------------------------------------------------

WARMUP = [(2.0 * k, 3000, 300) for k in range(450)]  # ~15 minutes keeping one 8B replica fully busy
PROBE_AT, PROBE_INP = 911.0, 8000  # a prefill-bound probe right after the warm-up, alone on the replica


def _probe_ttft(clock: float, warm: bool) -> tuple[float, SiteRuntime]:
    rows = ([*WARMUP] if warm else []) + [(PROBE_AT, PROBE_INP, 2)]
    rt = runtime(rows, static_plan(pool("H100", 1, clock=clock)))
    rt.advance(PROBE_AT + 2.0)
    k = rt.requests.height - 1
    assert np.isfinite(rt.req.done).all()
    if warm:
        assert np.nanmax(rt.req.done[:k]) < PROBE_AT  # the probe runs alone
    return float(rt.req.first[k] - PROBE_AT), rt


@pytest.mark.parametrize("clock", [1980.0, 1095.0])
def test_sustained_load_does_not_slow_a_replica(clock: float) -> None:
    hot_ttft, rt = _probe_ttft(clock, warm=True)
    cold_ttft, _ = _probe_ttft(clock, warm=False)  # the same probe on a fresh replica
    r = int(rt.req.rep[-1])
    t = tel(rt).filter(pl.col("rep") == r)
    busy = t.filter((pl.col("t") > 10) & (pl.col("t") <= 900))
    assert busy["util"].min() > 0.95  # sustained full load
    assert hot_ttft == pytest.approx(cold_ttft, rel=1e-12)
    c = step_coefficients(M8, "H100", 1, "bf16", clock)
    assert hot_ttft == pytest.approx(alone_ttft(c, PROBE_INP), rel=1e-9)
    # the clock in telemetry never exceeds the target; temperature is a function of power alone
    assert (t["clock"] <= clock).all()
    temp = 32.6 + 0.034 * t["power"].to_numpy()
    assert t["temp"].to_numpy() == pytest.approx(temp, rel=1e-12)


# --- (c) the site power-cap controller -------------------------------------------------------------------------

HORIZON_S = 240.0
SETTLE_TICKS = 4  # the controller steps the clock share by 5% per 10 s tick: within the cap by the 5th tick


def _full_fleet(h100_clock: float, a100_clock: float) -> tuple[SiteRuntime, list[float]]:
    """Every GPU of the site serving one long 8B decode (busy the whole horizon); the site throttle per tick."""
    site = default_fleet((MARKET,)).site(MARKET)
    n_h, n_a = 8 * site.groups[0].nodes, 8 * site.groups[1].nodes
    rows = [(0.01 * k, 1000, 60000) for k in range(n_h + n_a)]
    rt = runtime(rows, static_plan(pool("H100", n_h, clock=h100_clock), pool("A100", n_a, clock=a100_clock)))
    throttle = []
    for t_end in np.arange(TEL_DT, HORIZON_S + 1, TEL_DT):
        rt.advance(float(t_end))
        throttle.append(float(rt.hw.site_throttle[0]))
    assert int((rt.rep.state == st.WARM).sum()) == n_h + n_a and (rt.rep.n[rt.rep.state == st.WARM] == 1).all()
    busy = tel(rt).filter(pl.col("t") > TEL_DT)
    assert busy.height == (n_h + n_a) * (len(throttle) - 1) and busy["util"].min() == pytest.approx(1.0)
    return rt, throttle


def test_power_cap_controller_holds_a_busy_fleet_at_max_clock_under_the_cap() -> None:
    rt, throttle = _full_fleet(1980.0, 1410.0)
    cap = float(rt.hw.site_cap_w[0])
    w = site_log(rt)["it_w"].to_numpy()
    assert w[0] > 1.05 * cap  # unthrottled, the busy fleet at maximum clock draws well over the cap
    assert throttle[0] == pytest.approx(0.95)  # so the controller cuts the site's clock share at once
    assert w[SETTLE_TICKS:].max() <= cap  # and holds the site at or under the cap from then on
    assert w[SETTLE_TICKS:].min() >= 0.9 * cap  # without throttling far below it
    assert min(throttle) >= 0.5 and max(throttle[1:]) < 1.0
    # the replicas run at the reduced clock share: effective clocks in telemetry below the locked clocks
    t = tel(rt).filter(pl.col("t") > TEL_DT)
    locked = np.where(rt.pools.gpu[rt.rep.pool[t["rep"].to_numpy()]] == 0, 1980.0, 1410.0)
    assert (t["clock"].to_numpy() < locked).all()
    assert (rt.rep.thr[rt.rep.state == st.WARM] == throttle[-2]).all()  # the share read at the last tick


def test_power_cap_controller_does_not_act_under_the_cap() -> None:
    rt, throttle = _full_fleet(1095.0, 1005.0)  # the same busy fleet at the lowest clocks
    cap = float(rt.hw.site_cap_w[0])
    w = site_log(rt)["it_w"].to_numpy()
    assert w.max() < cap
    assert throttle == [1.0] * len(throttle)
    assert (rt.rep.thr[rt.rep.state == st.WARM] == 1.0).all()
    t = tel(rt)
    locked = np.where(rt.pools.gpu[rt.rep.pool[t["rep"].to_numpy()]] == 0, 1095.0, 1005.0)
    assert (t["clock"].to_numpy() == locked).all()  # effective clock = locked clock: the cap does not act


def test_the_plans_token_budget_reaches_the_replicas_and_a_change_restarts_them() -> None:
    """PoolPlan.max_num_batched_tokens (vLLM's --max-num-batched-tokens) sets the pool's chunk: a 6,000-token
    prompt alone takes the chunks of 1,024 tokens on H100 instead of the 8,192 default; changing it later
    restarts the replica (an engine argument), leaving it alone does not."""
    from dataclasses import replace

    inp = 6000
    c = step_coefficients(M8, "H100", 1, "bf16", 1980.0)
    small = static_plan(replace(pool("H100", 1), max_num_batched_tokens=1024))
    rt = runtime([(1.0, inp, 20)], small)
    rt.advance(30.0)
    assert rt.req.first[0] - 1.0 == pytest.approx(alone_ttft(c, inp, budget=1024), rel=1e-9)
    r = int(np.flatnonzero(rt.rep.pool == 0)[0])
    rt.apply_plan(small)
    assert rt.rep.state[r] == st.WARM
    rt.apply_plan(static_plan(pool("H100", 1)))  # back to the engine default: a restart
    assert rt.rep.state[r] == st.LOADING and rt.rep.coef[r, st.C_TOKENS] == 8192
