"""Serving physics: held-out fit bound, monotonicity, clock, precision, KV capacity, power."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.fleet import VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS, default_max_num_seqs
from schemas.models import MODELS
from worldmodel.physics import COEFF_FIELDS, StepCoefficients, gpu_power_w, node_overhead_w, step_coefficients
from worldmodel.physics.calibrate import MEASURED_CONFIGS, fitted
from worldmodel.physics.tables import (
    FP8_H200_LOWER_BOUND_SCALE,
    HBM_EFFICIENCY,
    kv_capacity_tokens,
    roofline_floors,
)

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


def _iteration_1k1k_s(c: StepCoefficients, batch: int) -> float:
    """Closed-loop 1k/1k iteration: decode of `batch` at mean context 1,536 + the prefill of batch/1024
    requests amortized into it (the AIConfigurator TPOT mapping, worldmodel.physics.calibrate)."""
    return _decode_s(c, batch, 1024 + 512) + batch / 1024 * (_prefill_s(c, 1024) - c.base_s)


def _max_throughput(c: StepCoefficients) -> float:
    """Tokens/s of one replica at the largest 1k/1k batch its KV cache holds (capped at vLLM's 1024 sequences)."""
    batch = min(1024, int(0.95 * c.kv_capacity_tokens // 2048))
    return batch / _iteration_1k1k_s(c, batch)


REPLAY_BATCHES = (1, 16, 64, 256)


def test_fp8_gain_within_the_published_range():
    """70B TP4 on H100 (the replay's 70B pool): fp8 keeps the AIConfigurator fit, bf16 adds the extra weight
    bytes at the fit's HBM efficiency and the published TTFT ratio on the linear prefill. Published
    (REFERENCES.md): TensorRT-LLM Llama-3.3-70B TP4 H100 FP8 vs FP16 throughput 1.37x, ITL 1.18x, TTFT 1.53x,
    2.14x with an fp8 KV cache; vLLM docs: up to 1.6x."""
    bf16 = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    fp8 = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX)
    fp8kv = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX, kv_dtype="fp8")
    # the fp8 pool is the measured fit: AIConfigurator vLLM fp8 TP4 1k/1k at concurrency 64, TPOT 19.5 ms
    assert _iteration_1k1k_s(fp8, 64) * 1e3 == pytest.approx(19.5, rel=0.10)
    itl = [_decode_s(bf16, b) / _decode_s(fp8, b) for b in REPLAY_BATCHES]
    assert all(1.15 <= g <= 1.65 for g in itl), itl  # between the published ITL 1.18x and vLLM's "up to 1.6x"
    assert all(a > b for a, b in zip(itl, itl[1:], strict=False))  # the weight-bytes gain fades as KV grows
    # throughput at the KV-limited batch: fitted to nothing, checked against the published 1.37x and 2.14x
    assert _max_throughput(fp8) / _max_throughput(bf16) == pytest.approx(1.37, rel=0.08)
    assert 1.37 < _max_throughput(fp8kv) / _max_throughput(bf16) <= 2.14
    # prefill: the linear term carries the published TTFT ratio (attention stays bf16)
    assert bf16.per_prefill_token_s / fp8.per_prefill_token_s == pytest.approx(1.53, rel=1e-12)
    assert _prefill_s(bf16, 2048) / _prefill_s(fp8, 2048) == pytest.approx(1.53, rel=0.03)
    none = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX, fp8_speedup_scale=0.0)
    assert _decode_s(none, 64) == pytest.approx(_decode_s(bf16, 64))
    assert _prefill_s(none, 2048) == pytest.approx(_prefill_s(bf16, 2048))


def test_h200_lower_bound_sensitivity():
    """`fp8_speedup_scale` = FP8_H200_LOWER_BOUND_SCALE puts the 70B decode gain where the lent H200 measured
    the 8B decode step (1.06x at batch 1 to 1.13x at 256, benchmarks/results/gpu_calibration_h200.json)."""
    bf16 = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    lb = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", H100_MAX, fp8_speedup_scale=FP8_H200_LOWER_BOUND_SCALE)
    gains = [_decode_s(bf16, b) / _decode_s(lb, b) for b in REPLAY_BATCHES]
    assert all(1.04 <= g <= 1.14 for g in gains), gains


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-70b", 2), ("llama-3.1-70b", 4), ("llama-3.1-70b", 8),
                                           ("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-8b", 4),
                                           ("llama-3.1-8b", 8)])  # fmt: skip
@pytest.mark.parametrize(("precision", "kv_dtype"), [("bf16", "auto"), ("fp8", "auto"), ("fp8", "fp8")])
def test_decode_respects_the_hbm_roofline(model, tp, precision, kv_dtype):
    """Batch-1 decode reads the weight shard and the context's KV at no more than the 0.8 of HBM peak that
    AIConfigurator finds achievable (bf16 70B used to reach 89%), and KV reads sit at or above their floor."""
    spec = MODELS[model]
    c = step_coefficients(model, "H100", tp, precision, H100_MAX, kv_dtype=kv_dtype)
    kv = "fp8" if kv_dtype == "fp8" else "bf16"
    ctx = 1536
    read = (spec.weight_bytes(precision) + ctx * spec.kv_bytes_per_token(kv)) / tp / (3.35e12)
    assert read / _decode_s(c, 1, ctx) <= HBM_EFFICIENCY + 1e-6
    floor = roofline_floors(model, "H100", tp, precision, kv_dtype)["per_kv_token_s"]
    assert c.per_kv_token_s >= floor * (1 - 1e-12)


@pytest.mark.parametrize(("model", "tp"), [("llama-3.1-70b", 4), ("llama-3.1-70b", 8), ("llama-3.1-8b", 1)])
def test_kv_dtype_capacity_and_read_time_agree(model, tp):
    """One KV dtype for both: an fp8 KV cache doubles the tokens that fit beside the same fp8 weights and
    halves per_kv_token_s; every other step term is unchanged; bytes per token x tokens = the same memory."""
    auto = step_coefficients(model, "H100", tp, "fp8", H100_MAX)
    fp8kv = step_coefficients(model, "H100", tp, "fp8", H100_MAX, kv_dtype="fp8")
    assert fp8kv.per_kv_token_s == pytest.approx(auto.per_kv_token_s / 2, rel=1e-12)
    assert fp8kv.kv_capacity_tokens == pytest.approx(2 * auto.kv_capacity_tokens, abs=1.0)
    for term in ("base_s", "per_seq_s", "per_prefill_token_s", "per_prefill_attn_s", "weights_load_s"):
        assert getattr(fp8kv, term) == getattr(auto, term), term
    spec, free = MODELS[model], tp * 80e9 * 0.9 - MODELS[model].weight_bytes("fp8")
    for c, kv in ((auto, "bf16"), (fp8kv, "fp8")):
        assert c.kv_capacity_tokens == free // spec.kv_bytes_per_token(kv)
        # KV read time per token follows the same bytes: seconds per byte equal across the two dtypes
        assert c.per_kv_token_s / spec.kv_bytes_per_token(kv) == pytest.approx(
            auto.per_kv_token_s / spec.kv_bytes_per_token("bf16"), rel=1e-12)
    # bf16 weights run an "auto" (bf16) KV cache: the same read time per KV token as fp8 weights with "auto"
    bf16 = step_coefficients(model, "H100", tp, "bf16", H100_MAX)
    assert bf16.per_kv_token_s == pytest.approx(auto.per_kv_token_s, rel=1e-12)
    assert bf16.kv_capacity_tokens == (tp * 80e9 * 0.9 - spec.weight_bytes("bf16")) // spec.kv_bytes_per_token("bf16")


def test_any_kv_dtype_vllm_runs_is_simulated_and_unknown_ones_raise():
    """bf16 weights beside an fp8 cache (vLLM runs it; the fleet's plans do not choose it, the policy gate's
    question) store KV in fp8: twice the tokens of the bf16 cache in the same free memory, half the read time."""
    spec = MODELS["llama-3.1-8b"]
    free = 80e9 * 0.9 - spec.weight_bytes("bf16")
    assert kv_capacity_tokens("llama-3.1-8b", "H100", 1, "bf16", kv_dtype="fp8") == free // spec.kv_bytes_per_token(
        "fp8")
    fp8_kv = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX, kv_dtype="fp8")
    auto = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX)
    assert fp8_kv.per_kv_token_s < auto.per_kv_token_s
    with pytest.raises(ValueError, match="KV-cache dtype"):
        step_coefficients("llama-3.1-8b", "H100", 1, "fp8", H100_MAX, kv_dtype="int8")
    with pytest.raises(ValueError, match="fp8"):
        step_coefficients("llama-3.1-8b", "A100", 1, "fp8", 1410.0, kv_dtype="fp8")


def test_token_budget_follows_the_gpu_type():
    """vLLM V1 defaults (OpenAI server): 8192 tokens per iteration on >= 70 GiB non-A100 GPUs, 2048 on A100."""
    assert step_coefficients("llama-3.1-70b", "H100", 4, "bf16", H100_MAX).token_budget == 8192
    assert step_coefficients("llama-3.1-8b", "H100", 1, "fp8", H100_MAX, kv_dtype="fp8").token_budget == 8192
    assert step_coefficients("llama-3.1-70b", "A100", 8, "bf16", 1410.0).token_budget == 2048
    assert step_coefficients("llama-3.1-8b", "A100", 1, "bf16", 1410.0).token_budget == 2048
    assert (default_max_num_seqs("H100"), default_max_num_seqs("A100")) == (1024, 256)
    assert all(t.source.startswith("vllm-project/vllm vllm/engine/arg_utils.py") for t in (
        *VLLM_MAX_NUM_BATCHED_TOKENS.values(), *VLLM_MAX_NUM_SEQS.values()))


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
    # 8B bf16 TP1: 72 GB - 16.06 GB over 128 KiB/token; fp8 halves the weight bytes, an fp8 KV cache the KV bytes
    assert kv_capacity_tokens("llama-3.1-8b", "H100", 1, "bf16") == (72e9 - 16.06e9) // (128 * 1024)
    assert kv_capacity_tokens("llama-3.1-8b", "H100", 1, "fp8") == (72e9 - 8.03e9) // (128 * 1024)
    assert kv_capacity_tokens("llama-3.1-8b", "H100", 1, "fp8", kv_dtype="fp8") == (72e9 - 8.03e9) // (64 * 1024)
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
