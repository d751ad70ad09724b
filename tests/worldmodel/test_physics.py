"""Serving physics: held-out fit bound, monotonicity, clock, precision, KV capacity, power."""

from __future__ import annotations

import numpy as np
import pytest

from worldmodel.physics import COEFF_FIELDS, StepCoefficients, gpu_power_w, node_overhead_w, step_coefficients
from worldmodel.physics.calibrate import MEASURED_CONFIGS, fitted
from worldmodel.physics.tables import kv_capacity_tokens

H100_MAX, H100_MIN = 1980.0, 1095.0


def _decode_s(c: StepCoefficients, batch: int, ctx: float = 1536.0) -> float:
    return c.base_s + batch * c.per_seq_s + batch * ctx * c.per_kv_token_s


def _prefill_s(c: StepCoefficients, tokens: int) -> float:
    return c.base_s + tokens * c.per_prefill_token_s + tokens * tokens / 2 * c.per_prefill_attn_s


def _pooled_heldout_ape(dataset: str, metric: str) -> float:
    apes = []
    for cfg in (c for c in MEASURED_CONFIGS if c[0] == dataset):
        f = fitted(*cfg)
        rows = getattr(f, metric)
        apes.append(np.abs(rows.x[rows.held_out] @ f.theta / rows.y_s[rows.held_out] - 1))
    return 100 * float(np.median(np.concatenate(apes)))


# Bounds: Splitwise repeats scatter up to ~5% (prefill std/mean at prompt >= 4k, batch >= 16) and the
# linear-plus-quadratic prefill cannot follow the memory-bound knee below 512 tokens; AIConfigurator TTFT
# carries closed-loop admission effects that no step model reproduces (TTFT rising with osl at fixed isl
# and concurrency). Observed: decode 3-4%, prefill 15-16%; the bounds leave room for noise, not for a break.
@pytest.mark.parametrize("dataset", ["splitwise", "aiconfigurator"])
def test_heldout_error_bound(dataset):
    assert _pooled_heldout_ape(dataset, "decode") <= 10.0
    assert _pooled_heldout_ape(dataset, "prefill") <= 20.0


@pytest.mark.parametrize("cfg", MEASURED_CONFIGS, ids=lambda c: "-".join(map(str, c)))
def test_heldout_error_bound_per_config(cfg):
    f = fitted(*cfg)
    assert f.prefill.held_out.any() and f.decode.held_out.any()
    assert f.mape("decode") <= 10.0
    assert f.mape("prefill") <= 30.0


def test_heldout_rows_are_whole_configuration_points():
    f = fitted("splitwise", "llama-3.1-70b", "H100", 4, "bf16")
    keys = [tuple(r) for r in f.decode.x]
    held = {k for k, h in zip(keys, f.decode.held_out, strict=True) if h}
    assert held and all(not (k in held and not h) for k, h in zip(keys, f.decode.held_out, strict=True))


def test_array_order_and_provenance():
    c = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    assert c.as_array().dtype == np.float64
    assert list(c.as_array()) == [getattr(c, f) for f in COEFF_FIELDS]
    assert set(c.provenance) == set(COEFF_FIELDS)
    assert c.provenance["base_s"].startswith("modeled")
    fp8 = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX)
    assert fp8.provenance["base_s"].startswith("benchmark-calibrated")


@pytest.mark.parametrize(
    "args",
    [
        ("llama-3.1-70b", "H100", 4, "bf16"),
        ("llama-3.1-70b", "A100", 8, "bf16"),
        ("llama-3.1-8b", "A100", 1, "bf16"),
    ],
)
def test_more_batch_longer_iteration(args):
    c = step_coefficients(*args, 1410.0 if args[1] == "A100" else H100_MAX)
    times = [_decode_s(c, b) for b in (1, 8, 32, 64, 128, 256)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    assert _prefill_s(c, 4096) > _prefill_s(c, 1024) > _prefill_s(c, 128)


def test_lower_clock_slows_prefill_not_decode():
    hi = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    lo = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MIN)
    prefill_ratio = _prefill_s(lo, 4096) / _prefill_s(hi, 4096)
    decode_ratio = _decode_s(lo, 64) / _decode_s(hi, 64)
    # prefill runs at the power-limited 1,579 MHz at the default clock, so the lowest clock costs 1579 / 1095
    assert 1.3 < prefill_ratio < 1579.0 / H100_MIN + 1e-9
    assert 1.0 < decode_ratio <= 1.065  # arXiv 2501.08219: 1-6% more latency


def test_fp8_faster_than_bf16_consistent_with_aiconfigurator():
    bf16 = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    fp8 = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX)
    # AIConfigurator vLLM fp8 TP4, isl 1024 / osl 1024 at concurrency 64: TPOT 19.5 ms, with the prefill of
    # 64/1024 requests amortized into each iteration.
    tpot = _decode_s(fp8, 64, 1024 + 512) + 64 / 1024 * (_prefill_s(fp8, 1024) - fp8.base_s)
    assert tpot * 1e3 == pytest.approx(19.5, rel=0.10)
    speedup = _decode_s(bf16, 64) / _decode_s(fp8, 64)
    # the measured H200 decode-step gain (benchmarks/results/gpu_calibration_h200.json): 1.06x-1.13x
    assert 1.05 < speedup < 1.15
    none = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX, fp8_speedup_scale=0.0)
    assert _decode_s(none, 64) == pytest.approx(_decode_s(bf16, 64))


def test_a100_has_no_fp8():
    with pytest.raises(ValueError, match="fp8"):
        step_coefficients("llama-3.1-8b", "A100", 1, "fp8", 1410.0)


def test_clock_out_of_range_and_unknown_tp_raise():
    with pytest.raises(ValueError):
        step_coefficients("llama-3.1-70b", "H100", 4, "bf16", 2500.0)
    with pytest.raises(ValueError):
        step_coefficients("llama-3.1-70b", "H100", 1, "bf16", H100_MAX)


def test_kv_capacity_by_hand():
    # 70B bf16 TP4 on H100: 4 x 80 GB x 0.9 - 70.55e9 x 2 B = 146.9 GB; 80 x 8 x 128 x 2 x 2 B = 320 KiB/token
    assert kv_capacity_tokens("llama-3.1-70b", "H100", 4, "bf16") == (4 * 80e9 * 0.9 - 141.1e9) // (
        320 * 1024
    )
    # 8B bf16 TP1: 72 GB - 16.06 GB over 128 KiB/token; fp8 halves weights and KV bytes
    assert kv_capacity_tokens("llama-3.1-8b", "H100", 1, "bf16") == (72e9 - 16.06e9) // (128 * 1024)
    assert kv_capacity_tokens("llama-3.1-8b", "H100", 1, "fp8") == (72e9 - 8.03e9) // (64 * 1024)
    c = step_coefficients("llama-3.1-70b", "A100", 8, "bf16", 1410.0)
    assert c.kv_capacity_tokens == (8 * 80e9 * 0.9 - 141.1e9) // (320 * 1024)


def test_weights_load_time():
    """Cold start = 5 s pod start + 141.1 GB / (140 GB / 265 s) + 60 s engine init (tables.py, frozen)."""
    c = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    assert c.weights_load_s == pytest.approx(5.0 + 141.1e9 / (140e9 / 265.0) + 60.0)


def test_power_idle_max_and_clock():
    c = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    assert (c.idle_power_w, c.max_power_w) == (129.0, 700.0)
    assert gpu_power_w(c, 0.0, H100_MAX, gpu="H100") == 129.0
    assert gpu_power_w("H100", 1.0, H100_MAX) == pytest.approx(129.0 + 0.99 * 571.0)  # prefill at the limit
    assert gpu_power_w("A100", 1.0, 1410.0) == pytest.approx(73.7 + 0.99 * 326.3)
    # below the power-limited clock (1,579 MHz) prefill power falls as (f / f_pl) ** gamma
    half = gpu_power_w("H100", 1.0, 1579.0 / 2 + 300.0, clock_power_exponent=2.0)
    assert half == pytest.approx(129.0 + 0.99 * 571.0 * ((1579.0 / 2 + 300.0) / 1579.0) ** 2)
    assert gpu_power_w("H100", 1.0, H100_MIN) < gpu_power_w("H100", 1.0, H100_MAX)
    with pytest.raises(ValueError):
        gpu_power_w(c, 0.5, H100_MAX)


def test_node_power_matches_splitwise_idle():
    assert node_overhead_w("H100") + 8 * gpu_power_w("H100", 0.0, H100_MAX) == pytest.approx(2800.0)
    assert node_overhead_w("A100") + 8 * gpu_power_w("A100", 0.0, 1410.0) == pytest.approx(1500.0)


@pytest.mark.parametrize("gpu", ["H100", "A100"])
def test_the_fleets_node_peak_is_what_the_ground_truth_draws_at_full_load(gpu):
    """One figure for a node's peak (schemas.fleet.NODE_PEAK_W, which sizes the site power cap): the ground
    truth's busy node at maximum clock draws exactly it (8 GPUs at util 1 plus the node's non-GPU power)."""
    from schemas.fleet import GPUS_PER_NODE, NODE_PEAK_W, GpuType
    from worldmodel.physics.tables import max_clock_mhz

    drawn = GPUS_PER_NODE * gpu_power_w(gpu, 1.0, max_clock_mhz(gpu)) + node_overhead_w(gpu)
    assert NODE_PEAK_W[GpuType(gpu)] == pytest.approx(drawn, rel=1e-12)
