"""Self-calibration: CUSUM detects drift and not noise, correction reduces error, state round-trips."""

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from worldmodel.selfcal import Cusum, EwmaStat, Quantity, SelfCalibrator
from worldmodel.servingmodel import PoolConfig, ServingModel
from worldmodel.snapshot import snapshot
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn
from worldmodel.state.calibration import period_residuals, record

T0 = datetime(2023, 7, 1, tzinfo=UTC)
NOISE = 0.03  # per-sample log noise of observed step time


def _stream(cal, rng, n, scale, start=0):
    """Feed n decode residuals whose truth is `scale` x the prior; return the alarms."""
    alarms = []
    for i in range(n):
        obs = 0.02 * scale * math.exp(rng.normal(0.0, NOISE))
        _, alarm = cal.observe(
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


def test_residuals_and_state_round_trip():
    ws = WorldState.open(":memory:")
    arr = syn.arrivals(T0, 300, rate_per_s=2.0)
    ws.ingest(
        {
            "request_arrival": arr,
            "request_completion": syn.completions(arr, tpot_s=0.05),
            "gpu_telemetry": syn.telemetry(T0, 8 * 8 * 120, hosts=8),
            "fleet_event": syn.fleet_events(T0 - timedelta(minutes=1), 1),
        }
    )
    end = T0 + timedelta(minutes=10)
    res = period_residuals(ws, ServingModel(), T0, end)
    assert set(res["quantity"]) == {"decode", "prefill", "power"}
    assert (res["predicted"] > 0).all() and (res["observed"] > 0).all()
    cal = SelfCalibrator()
    scored, _ = cal.observe_frame(res, end)
    before = ws.digest()
    record(ws, cal, scored, end)
    assert ws.digest() != before
    snap = snapshot(ws, end)
    decode = cal.factor(Quantity.DECODE, "H100", "llama-3.1-70b")
    assert snap.corrections.decode[("H100", "llama-3.1-70b")] == pytest.approx(decode)
    assert snap.risk_band == 1.0
