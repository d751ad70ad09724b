"""Static hardware and model figures for the serving physics, each with a unit, provenance tag and source.

Memory sizes use decimal GB (1e9 bytes); KV sizes per token are in bytes (KiB = 1024 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.fleet import (
    PRECISIONS_BY_GPU,
    SM_CLOCK_RANGE_MHZ,
    VLLM_MAX_NUM_BATCHED_TOKENS,
    GpuType,
    Precision,
    kv_storage,
)
from schemas.models import model_spec
from schemas.provenance import Provenance, Tagged

GB = 1e9
REFS = "REFERENCES.md"
#: The project's H200 run (benchmarks/results/gpu_calibration_h200.json, power.phases): idle P0 board power
#: 129.0 W (nvidia-smi power.draw mean; NVML 127.4 W, energy counter 124.5 W) at a 700 W limit.
_H200_IDLE = "measured H200 idle 129 W (benchmarks/results/gpu_calibration_h200.json)"


@dataclass(frozen=True)
class GpuSpec:
    """Per-GPU datasheet and power figures."""

    memory_gb: float
    hbm_tb_s: float
    bf16_tflops: float
    tdp_w: Tagged
    idle_w: Tagged
    node_idle_w: Tagged


GPUS: dict[GpuType, GpuSpec] = {
    GpuType.H100: GpuSpec(
        memory_gb=80.0,
        hbm_tb_s=3.35,
        bf16_tflops=989.0,
        tdp_w=Tagged(700.0, "W", Provenance.MODELED, f"H100 SXM TDP ({REFS}, datasheet)"),
        idle_w=Tagged(
            129.0,
            "W",
            Provenance.MODELED,
            f"{_H200_IDLE}; transferred to H100 SXM (same GH100 die, SXM board and 700 W limit)",
        ),
        node_idle_w=Tagged(2800.0, "W", Provenance.MODELED, f"Splitwise idle DGX-H100 server ({REFS})"),
    ),
    GpuType.A100: GpuSpec(
        memory_gb=80.0,
        hbm_tb_s=2.04,
        bf16_tflops=312.0,
        tdp_w=Tagged(400.0, "W", Provenance.MODELED, f"A100 SXM TDP ({REFS})"),
        idle_w=Tagged(
            round(129.0 / 700.0 * 400.0, 1),
            "W",
            Provenance.MODELED,
            f"{_H200_IDLE} as a share of the power limit (0.184), applied to the A100's 400 W; no A100 idle row",
        ),
        node_idle_w=Tagged(1500.0, "W", Provenance.MODELED, f"Splitwise idle DGX-A100 server ({REFS})"),
    ),
}

#: Fraction of GPU memory the engine may use (vLLM gpu_memory_utilization default).
GPU_MEMORY_UTILIZATION = 0.9

# Cold start of one replica, from the autoscaler's decision to a ready engine (s). FROZEN 2026-12-01 before any
# aurelius run under the new ground truth, and not revisited to suit a result; docs/physics.md has the sources.
# A replica is a vLLM pod on a Kubernetes node the site already owns (no node provisioning) whose image is
# already on the node (a static fleet pulls it once; Anyscale 2024 measured 4-5 min for a ~12 GB vLLM image
# when it is not): pod start, then the weights from cloud storage, then engine init.
#: Pod scheduling and container start with the image present (Kubernetes SLO: stateless pod startup, image
#: pull excluded, <= 5 s at the 99th percentile).
POD_START_S = Tagged(
    5.0, "s", Provenance.MODELED, "Kubernetes pod-startup SLO, image pre-pulled (<= 5 s p99)"
)
#: Weights from cloud object storage into GPU memory, per replica (B/s): Anyscale measured 4 min 25 s to
#: download and initialize Llama-2-70B (140 GB fp16) on a p4de node (2023, "Loading Llama-2 70b 20x faster"),
#: and 4-5 min for vLLM to load Meta-Llama-3-70B-Instruct (~140 GB) from cloud storage on Kubernetes (2024,
#: "Autoscaling Large AI Models up to 5.1x Faster"): 140 GB / 265 s = 0.53 GB/s.
WEIGHT_FETCH_BYTES_PER_S = Tagged(
    140.0 * GB / 265.0,
    "B/s",
    Provenance.MODELED,
    "Anyscale: Llama-2/3-70B, 140 GB from cloud storage to ready in 4 min 25 s (4-5 min) -> 0.53 GB/s",
)
#: vLLM V1 engine init beyond the weights: torch.compile (~39 s measured for a 35B model, route179.dev 2026),
#: CUDA-graph capture and KV-cache profiling (tens of seconds; CPU-bound, arXiv 2606.07362). The Anyscale
#: figures above predate vLLM's torch.compile, so it is added on top.
ENGINE_INIT_S = Tagged(
    60.0,
    "s",
    Provenance.MODELED,
    "vLLM V1 torch.compile ~39 s (route179.dev) + CUDA-graph capture and KV profiling (arXiv 2606.07362)",
)
COLD_START_SOURCE = (
    f"modeled, frozen: pod start {POD_START_S.value:.0f} s (Kubernetes SLO) + weight bytes / "
    f"{WEIGHT_FETCH_BYTES_PER_S.value / GB:.2f} GB/s (Anyscale 70B cold loads) + {ENGINE_INIT_S.value:.0f} s "
    "vLLM engine init (torch.compile, CUDA graphs); a precision reload pays the same (new pod, new weights)"
)

#: FP8 (W8A8 linears) speed-up over bf16 per coefficient, measured on a lent H200 with Llama-3.1-8B shapes
#: (benchmarks/gpu_calibration.py, 2026-11-30; benchmarks/results/gpu_calibration_h200.json): full decode
#: step 1.06x at batch 1 up to 1.13x at batch 256, prefill 1.23x at 2k-8k tokens, attention and KV cache
#: kept in bf16. A lower bound (unfused activation quantization, a research stack, H200 not H100): the truth's
#: default fp8 gain is the roofline construction of `worldmodel.physics` (docs/physics.md, "Lever table");
#: these ratios are the lower-bound sensitivity (`fp8_speedup_scale` = FP8_H200_LOWER_BOUND_SCALE).
_H200 = "measured H200 (benchmarks/gpu_calibration.py), lower bound"
FP8_SPEEDUP_H200: dict[str, Tagged] = {
    "base_s": Tagged(1.06, "x", Provenance.MEASURED, f"{_H200}: decode step at batch 1"),
    "per_seq_s": Tagged(1.13, "x", Provenance.MEASURED, f"{_H200}: decode step at batch 256"),
    "per_kv_token_s": Tagged(1.0, "x", Provenance.MEASURED, f"{_H200}: KV cache kept in bf16"),
    "per_prefill_token_s": Tagged(1.23, "x", Provenance.MEASURED, f"{_H200}: prefill of 2k-8k tokens"),
    "per_prefill_attn_s": Tagged(1.0, "x", Provenance.MODELED, "attention kept in bf16 (FlashAttention-2)"),
}
#: `fp8_speedup_scale` at which the 70B H100 TP4 decode step at batch 16-64 gains what the H200 measured
#: (1.06-1.13x): the lower-bound sensitivity (tests/worldmodel/test_physics.py pins the correspondence).
FP8_H200_LOWER_BOUND_SCALE = 0.2

#: Prefill speed-up of fp8 weights (W8A8 GEMMs) over bf16 on H100, applied to per_prefill_token_s (the
#: linear layers); attention stays bf16. Fitted to the published TTFT ratio: the roofline (fp8 peak 2x bf16)
#: bounds it at 2.0, and the non-GEMM share of a prefill token (all-reduce, norms, activation quantization)
#: keeps real engines below it.
PREFILL_FP8_GAIN = Tagged(
    1.53,
    "x",
    Provenance.MODELED,
    f"TensorRT-LLM Llama-3.3-70B TP4 H100, FP8 vs FP16 TTFT 1.53x ({REFS}, 'Levers, as measured elsewhere')",
)

def gpu_spec(gpu: str) -> GpuSpec:
    """The datasheet figures of `gpu` ('H100' | 'A100'); ValueError for any other name."""
    try:
        return GPUS[GpuType(gpu)]
    except ValueError as exc:
        raise ValueError(f"unknown GPU type {gpu!r}; expected one of {[g.value for g in GpuType]}") from exc


def check_precision(gpu: str, precision: str) -> Precision:
    """Validate that `gpu` supports `precision`; A100 has no FP8 tensor cores (ValueError)."""
    prec = Precision(precision)
    if prec not in PRECISIONS_BY_GPU[GpuType(gpu)]:
        raise ValueError(f"{gpu} does not support {precision}; supported: {PRECISIONS_BY_GPU[GpuType(gpu)]}")
    return prec


def kv_storage_precision(gpu: str, precision: str, kv_dtype: str = "auto") -> Precision:
    """The dtype the KV cache is stored in for weights `precision` on `gpu` and vLLM `kv_dtype` ('auto' | 'fp8'):
    `schemas.fleet.kv_storage` once `gpu` is checked to run `precision` (ValueError). Any pair vLLM runs is
    simulated (an operator's recorded fleet may run an fp8 cache beside bf16 weights); which pairs plans may
    choose is the policy gate's question (`schemas.fleet.kv_dtype_offered`).

    >>> kv_storage_precision("H100", "fp8", "fp8"), kv_storage_precision("H100", "fp8", "auto")
    (<Precision.FP8: 'fp8'>, <Precision.BF16: 'bf16'>)
    """
    check_precision(gpu, precision)
    return kv_storage(kv_dtype)


def token_budget(gpu: str) -> float:
    """The engine's chunked-prefill token budget per iteration on `gpu` (tokens): vLLM V1's default
    max_num_batched_tokens for the GPU type (`schemas.fleet.VLLM_MAX_NUM_BATCHED_TOKENS`, tagged, cited).

    >>> token_budget("H100"), token_budget("A100")
    (8192.0, 2048.0)
    """
    return VLLM_MAX_NUM_BATCHED_TOKENS[GpuType(gpu)].value


def max_clock_mhz(gpu: str) -> float:
    """The default (maximum) SM boost clock of `gpu` in MHz."""
    return float(SM_CLOCK_RANGE_MHZ[GpuType(gpu)][1])


def kv_capacity_tokens(model: str, gpu: str, tp: int, precision: str, *, kv_dtype: str = "auto") -> float:
    """KV-cache tokens per replica after weights at 0.9 memory utilization.

    Parameters
    ----------
    model : str
        Served model name.
    gpu : str
        GPU type.
    tp : int
        Tensor parallelism (GPUs per replica).
    precision : str
        Weight precision, 'bf16' or 'fp8' (fp8 halves the weight bytes).
    kv_dtype : str
        KV-cache dtype as vLLM names it: 'auto' (bf16) or 'fp8' (fp8 weights only; halves the KV bytes).

    Returns
    -------
    float
        Tokens (floored); 0 if the weights do not fit.

    Examples
    --------
    >>> round(kv_capacity_tokens("llama-3.1-70b", "H100", 4, "bf16"))
    448303
    >>> round(kv_capacity_tokens("llama-3.1-70b", "H100", 4, "fp8")), round(
    ...     kv_capacity_tokens("llama-3.1-70b", "H100", 4, "fp8", kv_dtype="fp8"))
    (663604, 1327209)
    """
    spec, prec = model_spec(model), check_precision(gpu, precision)
    kv = kv_storage_precision(gpu, precision, kv_dtype)
    free = tp * gpu_spec(gpu).memory_gb * GB * GPU_MEMORY_UTILIZATION - spec.weight_bytes(prec)
    return float(max(0.0, free) // spec.kv_bytes_per_token(kv))


#: Fraction of datasheet HBM bandwidth achievable (AIConfigurator's empirical factor, REFERENCES.md).
HBM_EFFICIENCY = 0.8


def roofline_floors(model: str, gpu: str, tp: int, precision: str, kv_dtype: str = "auto") -> dict[str, float]:
    """Physical lower bounds (s) on the context-dependent coefficients, used as floors when fitting.

    per_kv_token_s >= KV bytes per token (in the KV-cache dtype) / TP / (0.8 x HBM bandwidth);
    per_prefill_token_s >= 2 x params / TP / peak tensor FLOP/s (fp8 peak is 2x bf16); per_prefill_attn_s >=
    4 x layers x hidden / TP / bf16 peak (QK^T and PV, attention kept in bf16). They keep long-context
    extrapolation physical where the measured rows cannot separate these terms from the others.

    >>> f = roofline_floors("llama-3.1-70b", "H100", 4, "fp8")
    >>> round(f["per_kv_token_s"] * 1e9, 2), round(roofline_floors("llama-3.1-70b", "H100", 4, "fp8", "fp8")[
    ...     "per_kv_token_s"] * 1e9, 2)  # ns per KV token: bf16 KV ("auto"), then fp8 KV
    (30.57, 15.28)
    """
    spec, g, prec = model_spec(model), gpu_spec(gpu), Precision(precision)
    kv = kv_storage_precision(gpu, precision, kv_dtype)
    peak = g.bf16_tflops * 1e12
    return {
        "per_kv_token_s": spec.kv_bytes_per_token(kv) / tp / (HBM_EFFICIENCY * g.hbm_tb_s * 1e12),
        "per_prefill_token_s": 2.0 * spec.params / tp / (peak * (2.0 if prec == Precision.FP8 else 1.0)),
        "per_prefill_attn_s": 4.0 * spec.layers * spec.hidden / tp / peak,
    }


def weights_load_s(model: str, tp: int, precision: str) -> float:
    """Cold start of one replica (s): pod start + the weights from cloud storage + vLLM engine init.

    The replica's weights are fetched once per replica (not per GPU); `tp` is kept for the call signature
    (the fetch is bound by the node's network and storage, not by the GPUs). A precision reload is a restart of
    the pod with other weights and pays the same. Frozen with its sources (COLD_START_SOURCE).

    Examples
    --------
    >>> round(weights_load_s("llama-3.1-70b", 4, "bf16")), round(weights_load_s("llama-3.1-8b", 1, "bf16"))
    (332, 95)
    """
    del tp
    weights = model_spec(model).weight_bytes(Precision(precision))
    return POD_START_S.value + weights / WEIGHT_FETCH_BYTES_PER_S.value + ENGINE_INIT_S.value
