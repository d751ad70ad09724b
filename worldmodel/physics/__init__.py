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

from schemas.fleet import GpuType, Precision
from schemas.models import MODEL_SOURCE, model_spec
from schemas.provenance import Provenance
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
)
STEP_TERMS: tuple[str, ...] = COEFF_FIELDS[:5]
DECODE_A100_PER_H100 = 1.64  # REFERENCES.md (Splitwise): H100 vs A100 bandwidth
PREFILL_A100_PER_H100 = 3.43  # REFERENCES.md (Splitwise): H100 vs A100 compute

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
    """Coefficients of one pool configuration (model, GPU, TP, precision, SM clock).

    Times in seconds (per iteration, per sequence, per KV token, per prefill token, per prefill token x
    context token), capacity in tokens per replica, power in watts per GPU. `provenance` maps every field
    to "tag: source".
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
    provenance: dict[str, str] = field(default_factory=dict, compare=False)

    def as_array(self) -> np.ndarray:
        """The coefficients as float64 in `COEFF_FIELDS` order."""
        return np.array([getattr(self, f) for f in COEFF_FIELDS], dtype=np.float64)


def _fp8_speedup(term: str, scale: float) -> float:
    return 1.0 + (tables.FP8_SPEEDUP[term].value - 1.0) * scale


@cache
def _bf16_terms(model: str, gpu: str, tp: int) -> tuple[np.ndarray, str, str]:
    """bf16 step terms at the maximum clock, with their provenance tag and source."""
    if model == "llama-3.1-70b":
        fit = fitted(AICONFIGURATOR, model, "H100", tp, "fp8")
        theta = fit.theta[:5] * np.array([tables.FP8_SPEEDUP[t].value for t in STEP_TERMS])
        src = f"AIConfigurator vLLM fp8 TP{tp} fit x modeled fp8 speed-up (bf16 = one engine generation)"
        if gpu == GpuType.A100:
            r_dec, r_pre = splitwise_a100_ratio(tp)
            theta = theta * np.array([r_dec, r_dec, r_dec, r_pre, r_pre])
            src += (
                f" x Splitwise llama2-70b A100/H100 TP{tp} ratios (decode {r_dec:.2f}, prefill {r_pre:.2f})"
            )
        return theta, str(Provenance.MODELED), src
    fit = fitted(AICONFIGURATOR, model, "H100", tp, "bf16")
    if gpu == GpuType.H100:
        return (
            fit.theta[:5],
            str(Provenance.BENCHMARK_CALIBRATED),
            f"AIConfigurator TRT-LLM bf16 TP{tp} TPOT fit",
        )
    r = np.array([DECODE_A100_PER_H100] * 3 + [PREFILL_A100_PER_H100] * 2)
    src = f"AIConfigurator H100 TP{tp} fit x REFERENCES.md A100/H100 ratios (bandwidth 1.64, compute 3.43)"
    return fit.theta[:5] * r, str(Provenance.MODELED), src


def step_coefficients(
    model: str, gpu: str, tp: int, precision: str, sm_clock_mhz: float, *, fp8_speedup_scale: float = 1.0
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
        'bf16' or 'fp8' (fp8 on H100 only; ValueError on A100).
    sm_clock_mhz : float
        Locked SM clock (MHz), within the GPU's range; prefill terms scale ~ (f_max/f)^1,
        decode terms ~ (f_max/f)^0.1.
    fp8_speedup_scale : float
        Sensitivity on the modeled fp8 speed-up: speed-up = 1 + (s - 1) x scale (0 = no speed-up).

    Returns
    -------
    StepCoefficients
        Seconds per iteration term, tokens of KV capacity, seconds of load time, watts per GPU.

    Examples
    --------
    >>> c = step_coefficients("llama-3.1-70b", "H100", 4, "fp8", 1980.0)
    >>> round(1e3 * (c.base_s + 64 * c.per_seq_s + 64 * 1536 * c.per_kv_token_s), 1)  # ms, batch 64 @1.5k ctx
    17.5
    """
    gpu_t, prec = GpuType(gpu), tables.check_precision(gpu, precision)
    model_spec(model)
    try:
        theta, tag, src = _bf16_terms(model, gpu_t, tp)
    except ValueError as exc:
        raise ValueError(f"no calibrated step model for {model} on {gpu} at TP{tp}: {exc}") from exc
    prov: dict[str, str] = {}
    values: dict[str, float] = {}
    for i, term in enumerate(STEP_TERMS):
        v, t_src = float(theta[i]), src
        if prec == Precision.FP8:
            v /= _fp8_speedup(term, fp8_speedup_scale)
            t_src += f" / fp8 speed-up {tables.FP8_SPEEDUP[term].value} (scale {fp8_speedup_scale})"
        factor = clock.clock_factor(term, gpu, sm_clock_mhz)
        values[term] = v * factor
        fit_tag = (
            str(Provenance.BENCHMARK_CALIBRATED) if _is_measured(model, prec, fp8_speedup_scale) else tag
        )
        prov[term] = f"{fit_tag}: {t_src}; clock x{factor:.3f} (modeled, worldmodel.physics.clock)"
    spec = tables.gpu_spec(gpu)
    values["kv_capacity_tokens"] = kv_capacity_tokens(model, gpu, tp, precision)
    prov["kv_capacity_tokens"] = (
        f"modeled: {tp} x 80 GB x 0.9 - weights, / KV bytes per token ({MODEL_SOURCE})"
    )
    values["weights_load_s"] = weights_load_s(model, tp, precision)
    prov["weights_load_s"] = tables.COLD_START_SOURCE
    values["idle_power_w"] = spec.idle_w.value
    prov["idle_power_w"] = f"{spec.idle_w.provenance}: {spec.idle_w.source}"
    values["max_power_w"] = spec.tdp_w.value
    prov["max_power_w"] = (
        f"{spec.tdp_w.provenance}: {spec.tdp_w.source}; Splitwise A100 peak_power ~1.0 x TDP"
    )
    return StepCoefficients(**values, provenance=prov)


def _is_measured(model: str, prec: Precision, scale: float) -> bool:
    """70B fp8 on H100 at the default speed-up scale reproduces the AIConfigurator fit exactly."""
    return model == "llama-3.1-70b" and prec == Precision.FP8 and scale == 1.0
