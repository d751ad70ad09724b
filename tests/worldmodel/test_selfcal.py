"""Self-calibration: CUSUM detects drift and not noise, correction reduces error, state round-trips."""

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from worldmodel.drift import Cusum
from worldmodel.estimators import EwmaStat
from worldmodel.selfcal import TAIL_LEVELS, Quantity, SelfCalibrator, model_key
from worldmodel.servingmodel import Corrections, PoolConfig, ServingModel
from worldmodel.snapshot import snapshot
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn
from worldmodel.state.calibration import (
    PREFILL_BUSY_MAX,
    InteractiveCompletions,
    implied_decode_step,
    learn_tails,
    period_residuals,
    record,
)
from worldmodel.tails import chunk_mix, tpot_quantile

T0 = datetime(2023, 7, 1, tzinfo=UTC)
NOISE = 0.03  # per-sample log noise of observed step time


def _stream(cal, rng, n, scale, start=0):
    """Feed n decode residuals whose truth is `scale` x the prior; return the alarms."""
    alarms = []
    for i in range(n):
        obs = 0.02 * scale * math.exp(rng.normal(0.0, NOISE))
        _, alarm = cal.update(
            Quantity.DECODE, "H100", "node-001", "llama-3.1-70b", 0.02, obs, T0 + timedelta(seconds=start + i)
        )
        if alarm:
            alarms.append(alarm)
    return alarms


def test_cusum_fires_on_thermal_drift_quickly():
    rng = np.random.default_rng(7)
    cal = SelfCalibrator()
    assert _stream(cal, rng, 300, 1.0) == []
    assert cal.risk_band() == 1.0
    alarms = _stream(cal, rng, 100, 1.08, start=300)  # +8 % step time, sustained
    assert alarms, "drift not detected"
    first = alarms[0]
    assert first.direction == 1 and first.samples - 300 <= 10
    assert cal.risk_band() > 1.0


def test_cusum_quiet_on_pure_noise():
    rng = np.random.default_rng(11)
    cal = SelfCalibrator()
    assert _stream(cal, rng, 10_000, 1.0) == []
    assert cal.risk_band() == 1.0


def test_cusum_textbook_behaviour():
    c = Cusum(k=0.5, h=4.0)
    assert [c.update(1.5) for _ in range(5)] == [0, 0, 0, 0, 1]  # S+ = 1, 2, 3, 4, 5 > 4
    assert (c.pos, c.neg, c.alarms) == (0.0, 0.0, 1)
    assert [c.update(-2.5) for _ in range(3)] == [0, 0, -1]  # S- = 2, 4, 6


def test_correction_reduces_error_after_drift():
    rng = np.random.default_rng(3)
    cal = SelfCalibrator()
    _stream(cal, rng, 200, 1.0)
    _stream(cal, rng, 60, 1.08, start=200)
    truth = 0.02 * 1.08
    before = abs(0.02 - truth) / truth
    after = abs(0.02 * cal.factor(Quantity.DECODE, "H100", "llama-3.1-70b") - truth) / truth
    assert after < before / 4
    # the forward model sees it through the serving model's corrections
    sm = ServingModel().with_corrections(cal.corrections())
    cfg = PoolConfig("H100", "llama-3.1-70b", 4, "bf16", 1980)
    assert sm.decode_step_s(cfg, 8, 1000) / ServingModel().decode_step_s(cfg, 8, 1000) == pytest.approx(
        1.08, rel=0.02
    )


def test_ewma_stats_merge_like_pooled():
    rng = np.random.default_rng(0)
    xs, ys = rng.normal(0, 1, 30), rng.normal(2, 1, 50)
    a, b = EwmaStat(0.01), EwmaStat(0.01)
    for x in xs:
        a.update(x)
    for y in ys:
        b.update(y)
    a += b
    both = np.concatenate([xs, ys])
    assert a.n == 80 and a.mean == pytest.approx(both.mean()) and a.var == pytest.approx(both.var())


def test_the_decode_residual_predicts_at_the_kv_dtype_the_fleet_reports():
    """A replica of fp8 weights reporting an fp8 KV cache is predicted as one (half the KV bytes a decode step
    reads), so its residual does not read the cache's speed-up as a faster engine and fold it into the fp8 factor
    that the planner then applies to fp8 plans on top of their own cache."""
    predicted = {}
    for precision, kv in (("fp8", "auto"), ("fp8", "fp8"), ("bf16", "fp8")):  # the last: vLLM runs it, we read it
        ws = WorldState.open(":memory:")
        arr = syn.arrivals(T0, 300, rate_per_s=2.0)
        ws.update({
            "request_arrival": arr,
            "request_completion": syn.completions(arr, tpot_s=0.05, prefill_s_per_token=2e-5),
            "gpu_telemetry": syn.telemetry(T0, 8 * 8 * 120, hosts=8),
            "fleet_event": syn.fleet_events(T0 - timedelta(minutes=1), 1, precision=precision, kv_cache_dtype=kv),
        })  # fmt: skip
        res = period_residuals(ws, ServingModel(), T0, T0 + timedelta(minutes=10))
        dec = res.filter(pl.col("quantity") == "decode")
        predicted[precision, kv] = float(dec["predicted"][0])
    assert predicted["fp8", "fp8"] < 0.95 * predicted["fp8", "auto"]
    assert predicted["bf16", "fp8"] > predicted["fp8", "fp8"]  # bf16 weights read twice the weight bytes


def test_residuals_and_state_round_trip():
    ws = WorldState.open(":memory:")
    arr = syn.arrivals(T0, 300, rate_per_s=2.0)
    ws.update(
        {
            "request_arrival": arr,
            "request_completion": syn.completions(arr, tpot_s=0.05, prefill_s_per_token=2e-5),
            "gpu_telemetry": syn.telemetry(T0, 8 * 8 * 120, hosts=8),
            "fleet_event": syn.fleet_events(T0 - timedelta(minutes=1), 1),
        }
    )
    end = T0 + timedelta(minutes=10)
    res = period_residuals(ws, ServingModel(), T0, end)
    assert set(res["quantity"]) == {"decode", "prefill", "power"}
    assert (res["predicted"] > 0).all() and (res["observed"] > 0).all()
    cal = SelfCalibrator()
    scored, _ = cal.update_frame(res, end)
    before = ws.digest()
    record(ws, cal, scored, end)
    assert ws.digest() != before
    snap = snapshot(ws, end)
    key = model_key("llama-3.1-70b", "bf16")  # decode/prefill tracks are kept per precision
    decode = cal.factor(Quantity.DECODE, "H100", key)
    assert snap.corrections.decode[("H100", "llama-3.1-70b", "bf16")] == pytest.approx(decode)
    assert snap.risk_band == 1.0
    # the TPOT tail shape learned from the completions survives the state round trip
    learn_tails(ws, cal, T0, end)
    record(ws, cal, scored, end)
    tail = snapshot(ws, end).corrections.tpot_tail
    assert set(tail) == set(cal.corrections().tpot_tail) and tail
    for c, table in tail.items():
        assert [lv for lv, _ in table] == list(TAIL_LEVELS)
        assert [r for _, r in table] == pytest.approx([r for _, r in cal.corrections().tpot_tail[c]])


def _one_replica_state(rate_per_s: float, n: int) -> WorldState:
    """One 70B H100 replica serving `n` chat requests at `rate_per_s`, TPOT 50 ms."""
    ws = WorldState.open(":memory:")
    arr = syn.arrivals(T0, n, rate_per_s=rate_per_s)
    ws.update(
        {
            "request_arrival": arr,
            "request_completion": syn.completions(arr, tpot_s=0.05),
            "gpu_telemetry": syn.telemetry(T0, 8 * 120, hosts=1),
            "fleet_event": syn.fleet_events(T0 - timedelta(minutes=1), 1),
        }
    )
    return ws


def test_step_residuals_discount_prefill_share_and_skip_busy_replicas():
    """The decode residual compares the step implied by the median TPOT under chunk interference (below the
    raw median when prompts share the replica); a replica whose prompts keep prefill busy past
    PREFILL_BUSY_MAX gives no step-time residual (contention is not speed)."""
    end = T0 + timedelta(minutes=20)
    period_s = (end - T0).total_seconds()
    sm = ServingModel()
    cfg = PoolConfig("H100", "llama-3.1-70b", 4, "bf16", 1980.0)
    light = _one_replica_state(3.0, 3000)
    comp = light.frame("SELECT * FROM request_completion WHERE event_at < $e", {"e": end})
    busy = comp.height * sm.prefill_s(cfg, float((comp["input_tokens"] - comp["cached_input_tokens"]).mean()))
    assert 0.1 < busy / period_s < PREFILL_BUSY_MAX
    dec = period_residuals(light, sm, T0, end).filter(pl.col("quantity") == "decode")
    median = float(comp["tpot_s"].median())
    assert 0.3 * median < dec["observed"][0] < 0.95 * median  # the chunk stalls are not the decode step's
    # a faster prefill (a correction the calibrator learned) leaves more of the median TPOT to the decode step
    fast = sm.with_corrections(Corrections(prefill={("H100", "llama-3.1-70b", "bf16"): 0.5}))
    assert period_residuals(light, fast, T0, end).filter(pl.col("quantity") == "decode")["observed"][0] > (
        dec["observed"][0]
    )
    # deferrable prompts served on the replica load its prefill too, though their TTFT is left out
    arr_b = syn.arrivals(T0, 1200, request_class="batch", rate_per_s=1.0, seed=5, deadline_s=3600)
    light.update({"request_arrival": arr_b, "request_completion": syn.completions(arr_b, tpot_s=0.05, seed=5)})
    loaded = period_residuals(InteractiveCompletions(light), sm, T0, end).filter(pl.col("quantity") == "decode")
    assert loaded["observed"][0] < dec["observed"][0]
    busy_ws = _one_replica_state(20.0, 6000)  # ~20 req/s of ~1.1k new tokens: prefill busy well above the cap
    kinds = set(period_residuals(busy_ws, sm, T0, T0 + timedelta(minutes=5))["quantity"])
    assert kinds == {"power"}


@pytest.mark.parametrize("fixed_s", [0.005, 0.05])
def test_prefill_residual_is_the_compute_slope_whatever_the_fixed_part(fixed_s):
    """TTFT = a fixed part (decode step, step in flight) + compute: the prefill residual is the compute's ratio
    to the prior (here 0.6x its slope), not the fixed part read as compute of a small prompt."""
    sm = ServingModel()
    cfg = PoolConfig("H100", "llama-3.1-70b", 4, "bf16", 1980.0)
    slope = 0.6 * (sm.prefill_s(cfg, 1500.0) - sm.prefill_s(cfg, 500.0)) / 1000.0
    ws = WorldState.open(":memory:")
    arr = syn.arrivals(T0, 600, rate_per_s=1.0)
    ws.update(
        {
            "request_arrival": arr,
            "request_completion": syn.completions(arr, ttft_s=fixed_s, tpot_s=0.05, prefill_s_per_token=slope),
            "gpu_telemetry": syn.telemetry(T0, 8 * 120, hosts=1),
            "fleet_event": syn.fleet_events(T0 - timedelta(minutes=1), 1),
        }
    )
    res = period_residuals(ws, sm, T0, T0 + timedelta(minutes=10)).filter(pl.col("quantity") == "prefill")
    assert res.height == 1
    assert res["observed"][0] / res["predicted"][0] == pytest.approx(0.6, rel=0.1)


def test_implied_decode_step_inverts_the_interference_median():
    for rate, step in ((0.0, 0.03), (2.0, 0.03), (5.0, 0.05)):
        mixed = chunk_mix(rate, 0.2, 1.5, step)
        median = tpot_quantile(mixed, 0.10, 240.0, 0.8, 0.5)
        assert implied_decode_step(median, 0.04, rate, 0.2, 1.5, 240.0, 0.8) == pytest.approx(step, rel=0.01)
        assert median >= step * 0.99


def test_unobserved_precision_gets_a_partial_credit_and_observed_its_own_factor():
    # fp8 weights with an fp8 KV cache: every byte a decode step reads halves, the roofline gain `_decode_gain` is
    cfg8 = PoolConfig("H100", "llama-3.1-8b", 1, "fp8", 1980, "fp8")
    cfg16 = replace(cfg8, precision="bf16", kv_dtype="auto")
    roof = ServingModel()  # no corrections: the full roofline gain (what an uncalibrated model assumes)
    gain = roof.decode_step_s(cfg16, 8, 1500) / roof.decode_step_s(cfg8, 8, 1500)
    half = ServingModel(corrections=Corrections(precision_credit=0.5))
    assert half.decode_step_s(cfg16, 8, 1500) / half.decode_step_s(cfg8, 8, 1500) == pytest.approx(gain**0.5)
    none = ServingModel(corrections=Corrections().pessimistic())
    assert none.decode_step_s(cfg8, 8, 1500) == pytest.approx(none.decode_step_s(cfg16, 8, 1500))
    # bf16 observed 1.2x its roofline; fp8 then observed at 0.9 of bf16's true speed: both used as measured
    seen = Corrections(decode={("H100", "llama-3.1-8b", "bf16"): 1.2}, precision_credit=0.5)
    sm = ServingModel(corrections=seen)
    assert sm.decode_step_s(cfg16, 8, 1500) == pytest.approx(1.2 * roof.decode_step_s(cfg16, 8, 1500))
    assert sm.decode_step_s(cfg8, 8, 1500) == pytest.approx(1.2 * roof.decode_step_s(cfg16, 8, 1500) / gain**0.5)
    both = Corrections(decode={("H100", "llama-3.1-8b", "bf16"): 1.2, ("H100", "llama-3.1-8b", "fp8"): 2.0})
    sm = ServingModel(corrections=both)
    assert sm.decode_step_s(cfg8, 8, 1500) == pytest.approx(2.0 * roof.decode_step_s(cfg8, 8, 1500))


def test_residual_tracks_are_keyed_by_precision():
    cal = SelfCalibrator()
    for _ in range(5):
        cal.update(Quantity.DECODE, "H100", "n1", model_key("llama-3.1-8b", "fp8"), 0.01, 0.018, T0)
        cal.update(Quantity.DECODE, "H100", "n1", model_key("llama-3.1-8b", "bf16"), 0.02, 0.02, T0)
    dec = cal.corrections().decode
    assert dec[("H100", "llama-3.1-8b", "fp8")] == pytest.approx(1.8)
    assert dec[("H100", "llama-3.1-8b", "bf16")] == pytest.approx(1.0)


def test_learned_tail_skips_small_periods_and_tracks_the_shape():
    cal = SelfCalibrator()
    cal.update_tail("code", TAIL_LEVELS, tuple(1.0 + i for i in range(len(TAIL_LEVELS))), 10)
    assert not cal.corrections().tpot_tail  # too few completions
    ratios = tuple(1.0 + 0.5 * i for i in range(len(TAIL_LEVELS)))
    cal.update_tail("code", TAIL_LEVELS, ratios, 1000)
    assert cal.corrections().tpot_tail["code"] == tuple(zip(TAIL_LEVELS, ratios, strict=True))


def test_a_periods_residuals_are_learned_in_one_order_whatever_order_they_arrive_in():
    """A node hosting several replicas gives its track several residuals a period; the moving averages depend on
    their order, and the state's query returns rows in whatever order DuckDB's threads produce, so the calibrator
    takes them in one canonical order: the same rows shuffled give the same corrections and scores."""
    at = datetime(2023, 7, 1, tzinfo=UTC)
    rng = np.random.default_rng(3)
    n = 24
    frame = pl.DataFrame({
        "quantity": ["decode"] * n, "gpu_type": ["H100"] * n, "node": [f"node-{i % 3}" for i in range(n)],
        "model": [model_key("llama-3.1-8b", "bf16")] * n, "predicted": [0.01] * n,
        "observed": (0.01 * np.exp(rng.normal(0.0, 0.3, n))).tolist(),
    })  # fmt: skip
    runs = []
    for order in (np.arange(n), rng.permutation(n), np.arange(n)[::-1]):
        cal = SelfCalibrator(warmup=4)
        scored, _ = cal.update_frame(frame[order.tolist()], at)
        runs.append((cal.corrections().decode, scored["z"].to_list()))
    assert runs[0] == runs[1] == runs[2]
