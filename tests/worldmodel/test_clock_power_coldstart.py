"""Clock, power and cold start of the ground truth (issue 16, item 3 and the cold-start half of item 4).

* a clock target at or above the GPU's power-limited clock changes nothing in prefill (coefficients and an
  engine run), while decode keeps its small clock sensitivity;
* power depends on activity: a small-batch, memory-bound decode replica draws less than a compute-bound
  (prefill) one; an idle replica draws the tagged idle figure;
* `Physics.cold_start_s` (`--cold-start-s`) sets every replica's start-to-ready time.

Runtimes have nominal nodes (no hidden per-node variation) so times can be computed from the coefficients.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from schemas import fleet
from schemas.fleet import SM_CLOCK_RANGE_MHZ, GpuType, default_fleet
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan, Routing
from schemas.provenance import Provenance
from streams.cli import build_parser
from streams.replay.cli import _physics
from streams.replay.ruler import ruler_version
from streams.workload.builder import REQUEST_SCHEMA
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.runtime import Physics, SiteRuntime
from worldmodel.physics import clock, power, step_coefficients, tables

MARKET, SITE = "PJM", "site-pjm"
M8 = "llama-3.1-8b"
PREFILL_TERMS = ("per_prefill_token_s", "per_prefill_attn_s")
DECODE_TERMS = ("base_s", "per_seq_s", "per_kv_token_s")


def _plan(n: int, clock_mhz: float = 1980.0, gpu: str = "H100", autoscale: bool = False) -> Plan:
    return Plan(pools=(PoolPlan(SITE, M8, gpu, n, n, 1, "bf16", 256, clock_mhz),), routing=Routing.LEAST_LOAD,
                ordering=Ordering.EDF, batch_admission=BatchAdmission.PRESSURE, autoscale=autoscale,
                label="test: static")  # fmt: skip


def _frame(rows: list[tuple[float, int, int]]) -> pl.DataFrame:
    out = [{"request_id": f"r{k}", "arrival_s": at, "request_class": "code", "model": M8, "input_tokens": inp,
            "output_tokens": o, "prefix_block_ids": [], "deadline_s": None, "sla_ttft_ms": 1000.0,
            "sla_tpot_ms": 50.0, "tenant": "tenant-code", "allowed_regions": ["us-east"]}
           for k, (at, inp, o) in enumerate(rows)]  # fmt: skip
    return pl.DataFrame(out, schema=REQUEST_SCHEMA).sort("arrival_s")


def _runtime(rows, plan: Plan, physics: Physics | None = None, prewarm: bool = True) -> SiteRuntime:
    rt = SiteRuntime(default_fleet((MARKET,)).site(MARKET), _frame(rows), physics)
    rt.hw.node_speed[:] = 1.0
    rt.apply_plan(plan, prewarm=prewarm)
    return rt


def _alone_ttft(c, inp: int) -> float:
    """TTFT (s) of a request alone on a replica: chunked prefill, the pool's token budget per iteration."""
    t, done = 0.0, 0
    while done < inp:
        chunk = min(int(c.token_budget), inp - done)
        t += c.base_s + c.per_kv_token_s * done
        t += c.per_prefill_token_s * chunk + c.per_prefill_attn_s * chunk * (done + chunk / 2)
        done += chunk
    return t


# --- clock: prefill runs at the power-limited clock ---------------------------------------------------------


@pytest.mark.parametrize(("gpu", "model", "tp"), [("H100", "llama-3.1-70b", 4), ("A100", "llama-3.1-70b", 8),
                                                  ("H100", M8, 1)])  # fmt: skip
def test_clock_above_power_limited_clock_changes_no_prefill_coefficient(gpu: str, model: str, tp: int) -> None:
    f_max, f_pl = tables.max_clock_mhz(gpu), fleet.power_limited_clock_mhz(gpu)
    top = step_coefficients(model, gpu, tp, "bf16", f_max)
    for f in (f_pl, 0.5 * (f_pl + f_max), 0.85 * f_max):
        if f < f_pl:
            continue
        c = step_coefficients(model, gpu, tp, "bf16", f)
        for term in PREFILL_TERMS:
            assert getattr(c, term) == getattr(top, term)  # exactly: the target above f_pl changes nothing
        assert c.base_s > top.base_s  # decode keeps its small clock sensitivity
    low = max(0.7 * f_max, SM_CLOCK_RANGE_MHZ[GpuType(gpu)][0])  # below f_pl: prefill time scales as f_pl / f
    c = step_coefficients(model, gpu, tp, "bf16", low)
    assert c.per_prefill_token_s == pytest.approx(top.per_prefill_token_s * f_pl / low, rel=1e-12)
    assert 1.0 < c.base_s / top.base_s <= (f_max / low) ** 0.1 + 1e-12


def test_power_limited_clock_is_the_measured_h200_figure() -> None:
    h100 = fleet.POWER_LIMITED_CLOCK_MHZ[fleet.GpuType.H100]
    assert h100.value == 1579.0 and "gpu_calibration_h200.json" in h100.source
    assert h100.provenance == Provenance.MODELED  # measured on an H200, transferred to the H100
    assert clock.compute_clock_mhz("H100", 1980.0) == 1579.0
    assert clock.clock_factor("per_prefill_token_s", "H100", 0.85 * 1980.0) == 1.0


PROBE_INP = 8000


def _probe(clock_mhz: float) -> tuple[float, SiteRuntime]:
    rt = _runtime([(1.0, PROBE_INP, 2)], _plan(1, clock_mhz))
    rt.advance(30.0)
    assert np.isfinite(rt.req.done).all()
    return float(rt.req.first[0] - 1.0), rt


def test_engine_prefill_unchanged_by_a_clock_target_above_the_power_limited_clock() -> None:
    top, rt_top = _probe(1980.0)
    mid, _ = _probe(0.85 * 1980.0)  # 1,683 MHz > 1,579 MHz
    low, _ = _probe(0.7 * 1980.0)  # 1,386 MHz < 1,579 MHz
    c_top, c_mid, c_low = (step_coefficients(M8, "H100", 1, "bf16", f) for f in (1980.0, 0.85 * 1980, 0.7 * 1980))
    assert top == pytest.approx(_alone_ttft(c_top, PROBE_INP), rel=1e-9)
    assert mid == pytest.approx(_alone_ttft(c_mid, PROBE_INP), rel=1e-9)
    assert low == pytest.approx(_alone_ttft(c_low, PROBE_INP), rel=1e-9)
    # the prefill (compute) part of the TTFT is identical at 1,980 and 1,683 MHz: only base_s (decode-like) moves
    no_prefill = {"per_prefill_token_s": 0.0, "per_prefill_attn_s": 0.0}
    memory_part = _alone_ttft(replace(c_mid, **no_prefill), PROBE_INP) - _alone_ttft(replace(c_top, **no_prefill),
                                                                                       PROBE_INP)  # fmt: skip
    assert mid - top == pytest.approx(memory_part, rel=1e-6)
    assert mid < 1.01 * top < low
    # telemetry: a prefill-busy replica at the maximum clock target reads below it (held at f_pl)
    t = rt_top.logs
    n = int(t.n_tel[0])
    busy = t.tel_util[:n] > 0.0
    assert busy.any() and (t.tel_clock[:n][busy] < 1980.0).all() and (t.tel_clock[:n][busy] >= 1579.0).all()


# --- power: activity-dependent ------------------------------------------------------------------------------


def _tel(rt: SiteRuntime) -> dict[int, pl.DataFrame]:
    lg, n = rt.logs, int(rt.logs.n_tel[0])
    t = pl.DataFrame({"t": lg.tel_t[:n], "rep": lg.tel_rep[:n], "util": lg.tel_util[:n], "power": lg.tel_power_w[:n],
                      "running": lg.tel_running[:n], "temp": lg.tel_temp[:n]}).filter(pl.col("t") > 10.0)  # fmt: skip
    return {r: g for (r,), g in t.group_by("rep")}


def test_small_batch_decode_draws_less_than_prefill_and_idle_draws_the_tagged_figure() -> None:
    # two replicas, one long decode (batch 1, memory-bound): one replica decodes, the other stays idle
    dec = _runtime([(0.1, 500, 20000)], _plan(2))
    dec.advance(60.0)
    # one replica fed a stream of long prompts (compute-bound prefill)
    pre = _runtime([(0.2 + 0.25 * k, 8000, 2) for k in range(240)], _plan(1))
    pre.advance(60.0)
    d, p = _tel(dec), _tel(pre)
    decode_rep = int(dec.req.rep[0])
    (idle_rep,) = [r for r in d if r != decode_rep]
    (prefill_rep,) = p
    assert (d[decode_rep]["running"] == 1).all() and d[decode_rep]["util"].min() > 0.95
    assert p[prefill_rep]["util"].min() > 0.95
    p_dec, p_pre = d[decode_rep]["power"].max(), p[prefill_rep]["power"].min()
    assert p_dec < p_pre - 50.0
    assert p_pre == pytest.approx(129.0 + 0.99 * 571.0, rel=0.03)  # near the power limit
    # idle: the tagged figure (the project's measured H200 idle, transferred to the H100)
    idle = tables.GPUS[GpuType.H100].idle_w
    assert idle.value == 129.0 and "gpu_calibration_h200.json" in idle.source
    assert (d[idle_rep]["power"] == idle.value).all() and (d[idle_rep]["util"] == 0.0).all()
    # temperature follows power (display only)
    assert d[idle_rep]["temp"].max() < d[decode_rep]["temp"].min()
    assert d[decode_rep]["temp"].max() < p[prefill_rep]["temp"].min()


def test_decode_power_fit_sensitivity_moves_h100_decode_power_only() -> None:
    """`Physics(decode_power_fit="h100-measured")`: an H100 decode replica draws the H100 shift's activity less
    (571 W x shift), a prefill-busy one nearly the same, an A100 decode replica the same; no timing moves."""
    shift = power.DECODE_POWER_FITS["h100-measured"].shift
    assert shift[fleet.GPU_INDEX[GpuType.H100]] == pytest.approx(-0.095, abs=0.005)
    assert shift[fleet.GPU_INDEX[GpuType.A100]] == 0.0
    decode = [(0.1 + 0.001 * k, 500, 20000) for k in range(2)]
    prefill = [(0.2 + 0.25 * k, 8000, 2) for k in range(240)]
    runs: dict[tuple[str, str, str], SiteRuntime] = {}
    for fit in fleet.DECODE_POWER_FIT_NAMES:
        for name, rows, gpu in (("decode", decode, "H100"), ("prefill", prefill, "H100"), ("decode", decode, "A100")):
            rt = _runtime(rows, _plan(1, SM_CLOCK_RANGE_MHZ[GpuType(gpu)][1], gpu), Physics(decode_power_fit=fit))
            rt.advance(60.0)
            runs[fit, name, gpu] = rt
    for name, gpu in (("decode", "H100"), ("prefill", "H100"), ("decode", "A100")):
        spec = tables.gpu_spec(gpu)
        dynamic_w = spec.tdp_w.value - spec.idle_w.value
        (rec,), (h100,) = (_tel(runs[fit, name, gpu]).values() for fit in fleet.DECODE_POWER_FIT_NAMES)
        assert rec["util"].min() > 0.95
        diff = (h100["power"] - rec["power"]).to_numpy()
        if name == "prefill":  # only its few decode steps (2 output tokens per prompt) move
            assert (diff <= 0.0).all() and diff.min() > 0.02 * dynamic_w * shift[fleet.GPU_INDEX[GpuType.H100]]
        else:  # below the cap, where the fit is linear: the whole shift, in W
            assert (rec["running"] == 2).all()
            assert rec["power"].max() < spec.idle_w.value + dynamic_w * power.A_PREFILL.value - 1.0
            assert diff == pytest.approx(dynamic_w * shift[fleet.GPU_INDEX[GpuType(gpu)]], abs=1e-6)
        a, b = (runs[fit, name, gpu].req for fit in fleet.DECODE_POWER_FIT_NAMES)
        assert np.array_equal(a.first, b.first, equal_nan=True) and np.array_equal(a.done, b.done, equal_nan=True)
    with pytest.raises(ValueError, match="decode_power_fit"):
        _runtime(decode, _plan(1), Physics(decode_power_fit="h200"))


def test_the_decode_power_fit_is_wired_from_the_cli_into_the_ruler() -> None:
    args = build_parser().parse_args(["replay", "--decode-power-fit", "h100-measured"])
    assert _physics(args).decode_power_fit == "h100-measured"
    assert _physics(build_parser().parse_args(["replay"])).decode_power_fit == "record" == Physics().decode_power_fit
    assert ruler_version(_physics(args)) != ruler_version(Physics())  # figures of the two are never compared


def test_decode_power_fit_error_is_what_the_docs_report() -> None:
    err = power.decode_fit_error()
    assert err["rms"] < 0.035 and err["max"] < 0.06  # docs/physics.md: RMS 3.1%, worst 5.5% of TDP
    assert power.decode_activity(0.2, 1) < power.decode_activity(0.2, 64)


# --- cold start ---------------------------------------------------------------------------------------------


def _start_to_ready(physics: Physics | None) -> np.ndarray:
    """Replicas started by the plan's floor at the first autoscaler tick (no prewarm): ready - started (s)."""
    rt = _runtime([(1.0, 100, 2)], _plan(2), physics, prewarm=False)
    rt.advance(400.0)
    lg, n = rt.logs, int(rt.logs.n_ev[0])
    kind, rep, t = lg.ev_kind[:n], lg.ev_rep[:n], lg.ev_t[:n]
    started = {int(r): float(x) for r, x, k in zip(rep, t, kind, strict=True) if k == st.EV_STARTED}
    ready = {int(r): float(x) for r, x, k in zip(rep, t, kind, strict=True) if k == st.EV_READY}
    assert len(started) == 2 and set(ready) == set(started)
    # ready is logged at the first telemetry tick at or after ready_at
    ready_at = rt.rep.ready_at[list(started)]
    assert all(0.0 <= ready[r] - ra < st.TEL_DT for r, ra in zip(started, ready_at, strict=True))
    return ready_at - np.array(list(started.values()))


def test_cold_start_s_sets_replica_ready_times() -> None:
    default = _start_to_ready(None)
    assert default == pytest.approx([tables.weights_load_s(M8, 1, "bf16")] * 2)
    assert _start_to_ready(Physics(cold_start_s=60.0)) == pytest.approx([60.0, 60.0])
    assert _start_to_ready(Physics(cold_start_s=300.0)) == pytest.approx([300.0, 300.0])


def test_cold_start_default_is_the_frozen_cited_figure() -> None:
    # 70B bf16: 5 s pod + 141.1 GB at 140 GB / 265 s + 60 s engine init = 332 s (Anyscale, K8s SLO, vLLM)
    assert tables.weights_load_s("llama-3.1-70b", 4, "bf16") == pytest.approx(332.1, abs=0.1)
    assert "Anyscale" in tables.WEIGHT_FETCH_BYTES_PER_S.source
    c = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", 1980.0)
    assert c.provenance["weights_load_s"] == tables.COLD_START_SOURCE


def test_cold_start_cli_flag_reaches_physics() -> None:
    from streams.cli import build_parser
    from streams.replay.cli import _physics

    args = build_parser().parse_args(["replay", "--cold-start-s", "300"])
    assert _physics(args).cold_start_s == 300.0
    assert _physics(build_parser().parse_args(["replay"])).cold_start_s is None


def test_precision_reload_pays_the_cold_start_too() -> None:
    """A precision change restarts the pod with other weights: the reload waits the same cold start."""
    for physics, expect in ((None, tables.weights_load_s(M8, 1, "fp8")), (Physics(cold_start_s=60.0), 60.0)):
        rt = _runtime([(1.0, 100, 2)], _plan(1), physics)
        rt.advance(30.0)
        rt.apply_plan(Plan(pools=(PoolPlan(SITE, M8, "H100", 1, 1, 1, "fp8", 256, 1980.0),), routing=Routing.LEAST_LOAD,
                           ordering=Ordering.EDF, batch_admission=BatchAdmission.PRESSURE, autoscale=False,
                           label="test: fp8"))  # fmt: skip
        (r,) = np.flatnonzero(rt.rep.state == st.LOADING)
        assert rt.rep.ready_at[r] == pytest.approx(30.0 + expect)
