"""GPU and node power (W): idle plus an activity- and clock-dependent dynamic part.

Per GPU, over a telemetry interval in which the replica spends `prefill_share` of the time in compute-bound
(prefill) work and `decode_share` in memory-bound decode steps (the rest idle):

    P = idle + (max - idle) x [prefill_share x A_PREFILL x (min(f, f_pl) / f_pl) ** gamma
                               + decode_share x a_dec(u, n) x (f / f_max) ** gamma]

* A_PREFILL = 0.99 (measured): the project's H200 drew 693 W (bf16) / 694 W (fp8) of its 700 W limit in 8k-token
  prefill, with the clock pulled down to f_pl by the power limit (schemas.fleet.POWER_LIMITED_CLOCK_MHZ); Splitwise
  A100 peak power reaches 0.98-1.09 x TDP in every configuration. A clock target above f_pl changes nothing.
* a_dec(u, n) = c0 + c_bw x u + c_batch x min(1, log2(n) / 8) (`DECODE_POWER_FITS["record"]`), clipped to
  [0, A_PREFILL] (benchmark-calibrated; the power limit caps it, and the fit's points span u = 0.17-0.62, so
  higher u is an extrapolation): u is the
  step's HBM bandwidth utilization (bytes read per GPU per step / step time / datasheet HBM bandwidth), n the
  decoding sequences. Memory-bound decode draws power in proportion to the bandwidth it moves, plus a small
  rise with batch (more tensor-core work per byte). Fitted by least squares to `DECODE_POWER_POINTS`: the H200
  batch-64 decode rows (bf16 664 W, fp8 575 W) and the Splitwise A100 Llama2-70B rows (run-averaged power at
  TP2/4/8, batch 1-16: 0.43-0.79 x TDP). Fit error: RMS 3.1% of TDP, worst 5.5% (H200 bf16, -38 W); see
  `decode_fit_error`.
* gamma = 2.2 (modeled): dynamic CMOS power ~ f V^2 with the voltage following the clock over the upper DVFS
  range; the replay varies it with `clock_power_exponent`.

Idle: the project's H200 measured 129 W (tables.GPUS). Node power adds `node_overhead_w` (CPUs, NVSwitches,
NICs, fans), held constant and set so that an idle 8-GPU node draws the Splitwise idle figure (REFERENCES.md:
~1,500 W A100, ~2,800 W H100).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import numpy as np
from numba import njit

from schemas.fleet import DECODE_POWER_FIT_NAMES, GPU_INDEX, GPUS_PER_NODE, GpuType, power_limited_clock_mhz
from schemas.provenance import Provenance, Tagged
from worldmodel.physics.tables import gpu_spec, max_clock_mhz

CLOCK_POWER_EXPONENT = Tagged(
    2.2, "1", Provenance.MODELED, "P_dyn ~ f V^2, V tracking f over the upper DVFS range; typical 2-2.5"
)
A_PREFILL = Tagged(
    0.99,
    "1",
    Provenance.MEASURED,
    "H200 8k prefill 693 W bf16 / 694 W fp8 of 700 W at idle 129 W (benchmarks/results/gpu_calibration_h200.json)",
)

_KV8 = 32 * 8 * 128 * 2 * 2  # Llama-3.1-8B KV bytes per token (bf16)
_KV70 = 80 * 8 * 128 * 2 * 2  # Llama2-70B KV bytes per token (bf16)
_H200_HBM, _H100_HBM, _A100_HBM = 4.8e12, 3.35e12, 2.039e12  # datasheet HBM B/s
_A100_IDLE_FRAC = 129.0 / 700.0  # the H200's measured idle share of its limit (tables.GPUS, A100 idle)


def _splitwise(tp: int, batch: int, avg_power_frac: float, token_ms: float) -> tuple:
    u = (137.96e9 / tp + batch * 576 * _KV70 / tp) / (token_ms * 1e-3) / _A100_HBM
    return (f"Splitwise A100 llama2-70b TP{tp} b{batch}", u, batch,
            (avg_power_frac - _A100_IDLE_FRAC) / (1.0 - _A100_IDLE_FRAC), 400.0, 400.0 * _A100_IDLE_FRAC)  # fmt: skip


#: (label, HBM utilization u, batch, activity a = (P - idle) / (limit - idle), limit W, idle W). H200: the
#: project's run (8B shapes, batch 64, context 1,025, CUDA-graph decode; bytes = weights + KV read per step).
#: Splitwise: perf_model.csv A100 rows, prompt 512 + 128 output (mean context 576), token_time ms and
#: average_power (fraction of TDP), means over repeats.
DECODE_POWER_POINTS: tuple[tuple, ...] = (
    ("H200 8B bf16 b64", (15.01e9 + 64 * 1025 * _KV8) / 8.6677e-3 / _H200_HBM, 64, (663.6 - 129.0) / 571.0,
     700.0, 129.0),
    ("H200 8B fp8 b64", (6.979e9 + 0.526e9 * 2 + 64 * 1025 * _KV8) / 7.8751e-3 / _H200_HBM, 64,
     (575.5 - 129.0) / 571.0, 700.0, 129.0),
    *(_splitwise(tp, b, p, ms) for tp, b, p, ms in (
        (2, 1, 0.74, 54.8), (2, 2, 0.75, 59.9), (2, 4, 0.74, 60.5), (2, 8, 0.76, 61.6), (2, 16, 0.79, 65.6),
        (4, 1, 0.60, 45.0), (4, 2, 0.61, 45.0), (4, 4, 0.60, 45.2), (4, 8, 0.61, 45.9), (4, 16, 0.64, 48.7),
        (8, 1, 0.43, 44.9), (8, 2, 0.43, 44.5), (8, 4, 0.44, 45.8), (8, 8, 0.43, 46.5), (8, 16, 0.46, 50.4),
    )),
)  # fmt: skip


@njit(cache=True)
def _batch_feature(n: float) -> float:
    return min(1.0, math.log2(max(n, 1.0)) / 8.0)


_A_PREFILL_VALUE = A_PREFILL.value  # a plain float: numba reads module globals as compile-time constants


@njit(cache=True)
def decode_activity_at(c0: float, shift: float, c_bw: float, c_batch: float, hbm_util: float, batch: float) -> float:
    """Dynamic-power activity (0-1) of memory-bound decode from a fit's coefficients (intercept `c0`, the GPU's
    intercept `shift`, HBM slope `c_bw`, batch slope `c_batch`) at HBM utilization `hbm_util` (0-1) and `batch`
    sequences: the one formula `decode_activity` and the simulator's telemetry tick both run.

    >>> round(decode_activity_at(0.1, 0.0, 1.0, 0.2, 0.5, 16.0), 3)  # 0.1 + 0.5 + 0.2 x log2(16) / 8
    0.7
    """
    a = c0 + shift + c_bw * hbm_util + c_batch * _batch_feature(batch)
    return min(_A_PREFILL_VALUE, max(0.0, a))  # no activity draws more than the power limit allows


#: The fleet's own GPU, measured after the record's fit (2026-12-05, benchmarks/results/gpu_calibration_h100.json
#: and _repeat.json, the two runs' means; 8B shapes, batch 64, context 1,025, CUDA-graph decode; u over the H100's
#: 3.35 TB/s). Not in the ruler of record, which reads 0.95 / 0.82 where the H100 drew 0.84 / 0.74
#: (benchmarks/gpu_vs_truth.py); the "h100-measured" sensitivity fits the H100's intercept to them.
H100_DECODE_POWER_POINTS: tuple[tuple, ...] = (
    ("H100 8B bf16 b64", 23.608e9 / 10.898e-3 / _H100_HBM, 64, (610.9 - 129.0) / 571.0, 700.0, 129.0),
    ("H100 8B fp8 b64", 16.629e9 / 9.517e-3 / _H100_HBM, 64, (551.5 - 129.0) / 571.0, 700.0, 129.0),
)


def _fit(points: tuple[tuple, ...]) -> tuple[float, float, float]:
    x = np.array([[1.0, u, _batch_feature(n)] for _, u, n, *_ in points])
    y = np.array([a for _, _, _, a, _, _ in points])
    c = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(c[0]), float(c[1]), float(c[2])


class DecodePowerFit(NamedTuple):
    """a_dec = c0 + shift[GPU_INDEX of the GPU] + c_bw x u + c_batch x min(1, log2(n) / 8) (activity, 0-1)."""

    c0: float
    c_bw: float
    c_batch: float
    shift: tuple[float, ...]  # intercept shift per GPU type, in schemas.fleet.GPU_INDEX order


def _h100_shift(c: tuple[float, float, float]) -> float:
    """Least-squares intercept shift of the fit `c` on the H100 points (the mean residual)."""
    residuals = [a - (c[0] + c[1] * u + c[2] * _batch_feature(n)) for _, u, n, a, *_ in H100_DECODE_POWER_POINTS]
    return float(np.mean(residuals))


_C = _fit(DECODE_POWER_POINTS)
_NO_SHIFT = (0.0,) * len(GPU_INDEX)
#: Decode power fits by name (schemas.fleet.DECODE_POWER_FIT_NAMES): "record" (the ruler of record: the H200 and
#: Splitwise A100 points, one intercept) and "h100-measured" (a sensitivity: the same slopes, the H100's intercept
#: moved onto the fleet GPU's own measured points, `H100_DECODE_POWER_POINTS`; the A100's unchanged).
DECODE_POWER_FITS: dict[str, DecodePowerFit] = dict(
    zip(
        DECODE_POWER_FIT_NAMES,
        (
            DecodePowerFit(*_C, _NO_SHIFT),
            DecodePowerFit(*_C, tuple(_h100_shift(_C) if g == GpuType.H100 else 0.0 for g in GPU_INDEX)),
        ),
        strict=True,
    )
)


def decode_power_fit(name: str) -> DecodePowerFit:
    """The `DECODE_POWER_FITS` entry `name` (benchmark-calibrated: least squares on its points); ValueError naming
    the known fits otherwise."""
    if name not in DECODE_POWER_FITS:
        raise ValueError(f"decode_power_fit {name!r}: one of {list(DECODE_POWER_FIT_NAMES)}")
    return DECODE_POWER_FITS[name]


def decode_activity(hbm_util: float, batch: float, fit: str = "record", gpu: str | None = None) -> float:
    """Dynamic-power activity (0-1) of memory-bound decode at HBM utilization `hbm_util` and `batch` sequences,
    by the `DECODE_POWER_FITS` entry `fit` on `gpu` (None: no GPU's intercept shift).

    Examples
    --------
    >>> decode_activity(0.2, 1) < decode_activity(0.2, 64) < decode_activity(0.6, 64) <= A_PREFILL.value
    True
    >>> round(decode_activity(0.65, 64, "h100-measured", "H100") - decode_activity(0.65, 64, gpu="H100"), 3)
    -0.095
    """
    f = decode_power_fit(fit)
    shift = 0.0 if gpu is None else f.shift[GPU_INDEX[GpuType(gpu)]]
    return decode_activity_at(f.c0, shift, f.c_bw, f.c_batch, float(hbm_util), float(batch))


def decode_fit_error(
    fit: str = "record", points: tuple[tuple, ...] = DECODE_POWER_POINTS, gpu: str | None = None
) -> dict[str, float]:
    """Error of a decode activity fit on `points` (of `gpu`), as a fraction of each GPU's power limit (rms, max)."""
    e = np.array([(decode_activity(u, n, fit, gpu) - a) * (lim - idle) / lim for _, u, n, a, lim, idle in points])
    return {"rms": float(np.sqrt((e**2).mean())), "max": float(np.abs(e).max())}


class _HasPower(Protocol):
    idle_power_w: float
    max_power_w: float


def gpu_power_w(
    coeffs_or_gpu: _HasPower | str,
    util: float,
    sm_clock_mhz: float,
    *,
    clock_power_exponent: float | None = None,
    gpu: str | None = None,
    prefill_share: float | None = None,
    hbm_util: float | None = None,
    batch: float = 1.0,
    decode_power_fit: str = "record",
) -> float:
    """Power of one GPU (W).

    Parameters
    ----------
    coeffs_or_gpu : StepCoefficients or str
        Coefficients of the pool (idle_power_w, max_power_w) or a GPU type name ('H100' | 'A100').
    util : float
        Fraction of time the GPU is busy (prefill or decode), in [0, 1].
    sm_clock_mhz : float
        SM clock target (MHz).
    clock_power_exponent : float, optional
        gamma; default `CLOCK_POWER_EXPONENT` (2.2, modeled).
    gpu : str, optional
        GPU type, required with coefficients (they do not carry the clocks).
    prefill_share : float, optional
        Fraction of time in compute-bound prefill (<= util); default: all of util (the power-limited upper bound).
    hbm_util, batch : float, optional
        HBM bandwidth utilization and batch of the decode steps; with hbm_util None decode counts as activity 1.
    decode_power_fit : str, optional
        The `DECODE_POWER_FITS` entry decode activity is read from ("record", the ruler's).

    Returns
    -------
    float
        Watts per GPU.

    Examples
    --------
    >>> round(gpu_power_w("H100", 1.0, 1980.0))  # busy prefill at the power limit
    694
    >>> gpu_power_w("H100", 1.0, 1980.0) == gpu_power_w("H100", 1.0, 1600.0)  # above the power-limited clock
    True
    >>> round(gpu_power_w("H100", 1.0, 1980.0, prefill_share=0.0, hbm_util=0.3, batch=1))  # small-batch decode
    340
    """
    if not 0.0 <= util <= 1.0:
        raise ValueError(f"util must be in [0, 1], got {util}")
    if isinstance(coeffs_or_gpu, str):
        spec = gpu_spec(coeffs_or_gpu)
        idle, peak, gpu = spec.idle_w.value, spec.tdp_w.value, coeffs_or_gpu
    elif gpu is None:
        raise ValueError("gpu_power_w needs gpu= (for its clocks) when given coefficients")
    else:
        idle, peak = coeffs_or_gpu.idle_power_w, coeffs_or_gpu.max_power_w
    gamma = CLOCK_POWER_EXPONENT.value if clock_power_exponent is None else clock_power_exponent
    pf = util if prefill_share is None else min(max(prefill_share, 0.0), util)
    f_pl = power_limited_clock_mhz(gpu)
    a_dec = 1.0 if hbm_util is None else decode_activity(hbm_util, batch, decode_power_fit, gpu)
    act = pf * A_PREFILL.value * (min(sm_clock_mhz, f_pl) / f_pl) ** gamma
    act += (util - pf) * a_dec * (sm_clock_mhz / max_clock_mhz(gpu)) ** gamma
    return idle + (peak - idle) * act


def node_overhead_w(gpu: str) -> float:
    """Non-GPU power of one 8-GPU node (W): Splitwise idle node power - 8 x GPU idle, held constant.

    Examples
    --------
    >>> node_overhead_w("H100"), node_overhead_w("A100")
    (1768.0, 910.4)
    """
    spec = gpu_spec(gpu)
    return spec.node_idle_w.value - GPUS_PER_NODE * spec.idle_w.value
