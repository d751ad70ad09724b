"""Serving physics of the ground truth: per-iteration step-time coefficients, KV capacity, load time, power.

The simulator evaluates, per iteration of one replica (s):

    t = base_s + per_seq_s x n_decode + per_kv_token_s x kv_tokens_in_batch
        + per_prefill_token_s x prefill_tokens + per_prefill_attn_s x prefill_tokens x context_tokens

where kv_tokens_in_batch is the summed context of the decoding sequences and context_tokens the mean
attended context per prefill token (cached prefix + already prefilled + chunk / 2). How each pool's
coefficients are obtained (measured fits, the harmonization of two engine generations, modeled transfers)
is in docs/physics.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np

from schemas.fleet import VLLM_MAX_NUM_BATCHED_TOKENS, GpuType, Precision
from schemas.models import MODEL_SOURCE, model_spec
from schemas.provenance import Provenance, Tagged
from worldmodel.physics import clock, tables
from worldmodel.physics.calibrate import AICONFIGURATOR, fitted, splitwise_a100_ratio
from worldmodel.physics.power import gpu_power_w, node_overhead_w
from worldmodel.physics.tables import kv_capacity_tokens, weights_load_s

#: Order of `StepCoefficients.as_array()` (float64), fixed for the numba simulator.
COEFF_FIELDS: tuple[str, ...] = (
    "base_s",
    "per_seq_s",
    "per_kv_token_s",
    "per_prefill_token_s",
    "per_prefill_attn_s",
    "kv_capacity_tokens",
    "weights_load_s",
    "idle_power_w",
    "max_power_w",
    "token_budget",
)
STEP_TERMS: tuple[str, ...] = COEFF_FIELDS[:5]
DECODE_A100_PER_H100 = Tagged(1.64, "x", Provenance.MODELED, "REFERENCES.md (Splitwise): H100 vs A100 bandwidth")
PREFILL_A100_PER_H100 = Tagged(3.43, "x", Provenance.MODELED, "REFERENCES.md (Splitwise): H100 vs A100 compute")

__all__ = [
    "COEFF_FIELDS",
    "StepCoefficients",
    "gpu_power_w",
    "kv_capacity_tokens",
    "node_overhead_w",
    "step_coefficients",
    "weights_load_s",
]


@dataclass(frozen=True)
class StepCoefficients:
    """Coefficients of one pool configuration (model, GPU, TP, weight precision, KV dtype, SM clock).

    Times in seconds (per iteration, per sequence, per KV token, per prefill token, per prefill token x
    context token), capacity in tokens per replica, power in watts per GPU, token_budget in prefill tokens
    per iteration (the engine's max_num_batched_tokens for the GPU type). `provenance` maps every field to
    "tag: source".
    """

    base_s: float
    per_seq_s: float
    per_kv_token_s: float
    per_prefill_token_s: float
    per_prefill_attn_s: float
    kv_capacity_tokens: float
    weights_load_s: float
    idle_power_w: float
    max_power_w: float
    token_budget: float
    provenance: dict[str, str] = field(default_factory=dict, compare=False)

    def as_array(self) -> np.ndarray:
        """The coefficients as float64 in `COEFF_FIELDS` order."""
        return np.array([getattr(self, f) for f in COEFF_FIELDS], dtype=np.float64)


def _fp8_gain(gain: float, scale: float) -> float:
    return 1.0 + (gain - 1.0) * scale


def _hbm_efficiency(model: str, tp: int, per_kv_token_s: float) -> float:
    """HBM efficiency a fit achieves on its pure byte-streaming term: bf16 KV bytes / TP / per_kv_token_s /
    datasheet bandwidth (the measured engines ran a bf16 KV cache)."""
    spec = model_spec(model)
    return spec.kv_bytes_per_token(Precision.BF16) / tp / per_kv_token_s / (tables.gpu_spec("H100").hbm_tb_s * 1e12)


def _weight_bytes_delta_s(model: str, tp: int, eta: float) -> float:
    """Seconds per iteration to stream the extra bf16 weight bytes over fp8 of one GPU's shard at efficiency eta."""
    spec = model_spec(model)
    extra = (spec.weight_bytes(Precision.BF16) - spec.weight_bytes(Precision.FP8)) / tp
    return extra / (eta * tables.gpu_spec("H100").hbm_tb_s * 1e12)


@cache
def _h100_terms(model: str, tp: int) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """(bf16 terms, fp8 gain per term, provenance per precision) on H100 at the maximum clock, bf16 KV.

    One measured precision per model; the other is the roofline difference at the fit's own efficiency:
    decode streams the other precision's extra (or missing) weight bytes at the HBM efficiency the fit
    achieves on its KV term; decode GEMMs stay weight-bandwidth-bound below the ridge point (about 295
    sequences on H100 for bf16 and fp8 alike), so per_seq_s is shared; the linear-layer prefill term gains
    PREFILL_FP8_GAIN (published TTFT ratio); attention runs in bf16 and KV reads follow the KV dtype only.
    """
    measured = "fp8" if model == "llama-3.1-70b" else "bf16"
    fit = fitted(AICONFIGURATOR, model, "H100", tp, measured)
    theta = fit.theta[:5].copy()
    eta = _hbm_efficiency(model, tp, float(theta[2]))
    delta = _weight_bytes_delta_s(model, tp, eta)
    pre = tables.PREFILL_FP8_GAIN
    engine = "vLLM" if measured == "fp8" else "TRT-LLM"
    fit_src = f"AIConfigurator {engine} {measured} TP{tp} fit (bf16 KV)"
    rule = (
        f"{'+' if measured == 'fp8' else '-'} the {'extra' if measured == 'fp8' else 'saved'} weight bytes at the "
        f"fit's HBM efficiency {eta:.2f} on base_s ({1e3 * delta:.2f} ms), per_prefill_token_s "
        f"{'x' if measured == 'fp8' else '/'} {pre.value} ({pre.source}); per_seq_s, per_kv_token_s and "
        "per_prefill_attn_s as fitted"
    )
    if measured == "fp8":
        fp8 = theta
        bf16 = theta + np.array([delta, 0.0, 0.0, 0.0, 0.0])
        bf16[3] = theta[3] * pre.value
        prov = {
            "fp8": f"{Provenance.BENCHMARK_CALIBRATED}: {fit_src}",
            "bf16": f"{Provenance.MODELED}: {fit_src} {rule}",
        }
    else:
        bf16 = theta
        fp8 = theta - np.array([delta, 0.0, 0.0, 0.0, 0.0])
        fp8[3] = theta[3] / pre.value
        prov = {
            "bf16": f"{Provenance.BENCHMARK_CALIBRATED}: {fit_src}",
            "fp8": f"{Provenance.MODELED}: {fit_src} {rule}",
        }
    if fp8[0] <= 0.0:
        raise ValueError(f"{model} TP{tp}: the fit's base_s is below the weight-streaming time it must contain")
    gain = np.divide(bf16, fp8, out=np.ones(5), where=fp8 > 0)
    return bf16, gain, prov


@cache
def _bf16_terms(model: str, gpu: str, tp: int) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """bf16 step terms at the maximum clock with a bf16 KV cache, the fp8 gain per term (H100; ones on A100)
    and the provenance of each precision's terms."""
    bf16, gain, prov = _h100_terms(model, tp)
    if gpu == GpuType.H100:
        return bf16, gain, prov
    if model == "llama-3.1-70b":
        r_dec, r_pre = splitwise_a100_ratio(tp)
        src = f"{prov['bf16']} x Splitwise llama2-70b A100/H100 TP{tp} ratios (decode {r_dec:.2f}, prefill {r_pre:.2f})"
        r = np.array([r_dec, r_dec, r_dec, r_pre, r_pre])
    else:
        r = np.array([DECODE_A100_PER_H100.value] * 3 + [PREFILL_A100_PER_H100.value] * 2)
        src = f"{prov['bf16']} x REFERENCES.md A100/H100 ratios (bandwidth 1.64, compute 3.43)"
    return bf16 * r, np.ones(5), {"bf16": f"{Provenance.MODELED}: {src.split(': ', 1)[1]}"}


def step_coefficients(
    model: str,
    gpu: str,
    tp: int,
    precision: str,
    sm_clock_mhz: float,
    *,
    kv_dtype: str = "auto",
    fp8_speedup_scale: float = 1.0,
) -> StepCoefficients:
    """Step-time, capacity, load and power coefficients of one pool configuration.

    Parameters
    ----------
    model : str
        'llama-3.1-8b' or 'llama-3.1-70b'.
    gpu : str
        'H100' or 'A100'.
    tp : int
        Tensor parallelism (GPUs per replica); measured TPs: 8B 1/2/4/8, 70B 2/4/8.
    precision : str
        Weight precision, 'bf16' or 'fp8' (fp8 on H100 only; ValueError on A100).
    sm_clock_mhz : float
        Locked SM clock (MHz), within the GPU's range; prefill terms scale ~ (f_max/f)^1,
        decode terms ~ (f_max/f)^0.1.
    kv_dtype : str
        KV-cache dtype as vLLM names it: 'auto' (bf16) or 'fp8' (fp8 weights only, ValueError with bf16).
        KV capacity and per_kv_token_s both follow it: fp8 doubles the tokens that fit beside the weights'
        free memory and halves the bytes read per KV token.
    fp8_speedup_scale : float
        Sensitivity on the fp8-weights gain per term: gain = 1 + (g - 1) x scale, g the default gain
        (bf16 / fp8, docs/physics.md); 0 = no gain, `tables.FP8_H200_LOWER_BOUND_SCALE` = the H200-measured
        lower bound. The fp8 KV cache's halved bytes are not scaled.

    Returns
    -------
    StepCoefficients
        Seconds per iteration term, tokens of KV capacity, seconds of load time, watts per GPU, tokens of
        prefill budget per iteration.

    Examples
    --------
    >>> def decode_ms(c, b, ctx=1536):
    ...     return 1e3 * (c.base_s + b * c.per_seq_s + b * ctx * c.per_kv_token_s)
    >>> fp8 = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", 1980.0)
    >>> bf16 = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", 1980.0)
    >>> fp8kv = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", 1980.0, kv_dtype="fp8")
    >>> [round(decode_ms(c, 64), 1) for c in (bf16, fp8, fp8kv)]  # ms, batch 64 at 1.5k context
    [24.0, 17.4, 15.9]
    >>> fp8kv.per_kv_token_s / fp8.per_kv_token_s, round(fp8kv.kv_capacity_tokens / fp8.kv_capacity_tokens, 4)
    (0.5, 2.0)
    """
    gpu_t, prec = GpuType(gpu), tables.check_precision(gpu, precision)
    kv_prec = tables.kv_storage_precision(gpu, precision, kv_dtype)
    model_spec(model)
    try:
        bf16, gain, prov_by_prec = _bf16_terms(model, gpu_t, tp)
    except ValueError as exc:
        raise ValueError(f"no calibrated step model for {model} on {gpu} at TP{tp}: {exc}") from exc
    prov: dict[str, str] = {}
    values: dict[str, float] = {}
    kv_ratio = model_spec(model).kv_bytes_per_token(kv_prec) / model_spec(model).kv_bytes_per_token(Precision.BF16)
    for i, term in enumerate(STEP_TERMS):
        v = float(bf16[i])
        if prec == Precision.FP8:
            g = _fp8_gain(float(gain[i]), fp8_speedup_scale)
            v /= g
            src = prov_by_prec["fp8"] if fp8_speedup_scale == 1.0 else (
                f"{Provenance.MODELED}: bf16 ({prov_by_prec['bf16']}) / fp8 gain {g:.3f} "
                f"(1 + ({gain[i]:.3f} - 1) x scale {fp8_speedup_scale})"
            )
        else:
            src = prov_by_prec["bf16"]
        if term == "per_kv_token_s" and kv_prec == Precision.FP8:
            v *= kv_ratio
            src = f"{Provenance.MODELED}: {src.split(': ', 1)[1]} x fp8/bf16 KV bytes {kv_ratio}"
        factor = clock.clock_factor(term, gpu, sm_clock_mhz)
        values[term] = v * factor
        prov[term] = f"{src}; clock x{factor:.3f} (modeled, worldmodel.physics.clock)"
    spec = tables.gpu_spec(gpu)
    values["kv_capacity_tokens"] = kv_capacity_tokens(model, gpu, tp, precision, kv_dtype=kv_dtype)
    prov["kv_capacity_tokens"] = (
        f"modeled: {tp} x 80 GB x 0.9 - {precision} weights, / {kv_prec} KV bytes per token ({MODEL_SOURCE})"
    )
    values["weights_load_s"] = weights_load_s(model, tp, precision)
    prov["weights_load_s"] = tables.COLD_START_SOURCE
    values["idle_power_w"] = spec.idle_w.value
    prov["idle_power_w"] = f"{spec.idle_w.provenance}: {spec.idle_w.source}"
    values["max_power_w"] = spec.tdp_w.value
    prov["max_power_w"] = (
        f"{spec.tdp_w.provenance}: {spec.tdp_w.source}; Splitwise A100 peak_power ~1.0 x TDP"
    )
    budget = VLLM_MAX_NUM_BATCHED_TOKENS[gpu_t]
    values["token_budget"] = budget.value
    prov["token_budget"] = f"{budget.provenance}: {budget.source}"
    return StepCoefficients(**values, provenance=prov)
