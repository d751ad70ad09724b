"""SM-clock scaling of step-time coefficients (modeled), against the clock a busy GPU actually holds.

The step coefficients are calibrated on engines running at their default clocks, where a compute-bound GPU is
already held below its maximum clock by its power limit (the project's H200: bf16 prefill at 1,579 of 1,980
MHz, SW power cap; schemas.fleet.POWER_LIMITED_CLOCK_MHZ). A coefficient c becomes c x factor at a locked clock f:

* compute-bound prefill terms (per_prefill_token_s, per_prefill_attn_s): factor = f_pl / min(f, f_pl), with
  f_pl the GPU's power-limited clock. A clock target at or above f_pl changes nothing; below it prefill time
  scales as 1 / f (exponent 1). Splitwise's 70% power cap on a DGX-H100 made prefill 1.30x slower
  (REFERENCES.md), i.e. ~0.77 of the clock prefill held before.
* memory-bound decode terms (base_s, per_seq_s, per_kv_token_s): factor = (f_max / f) ** 0.1. Decode is not
  power-limited (the H200's batch-64 decode held 1,980 MHz at 664 W); lowering the SM clock 16x cut decode
  energy 42% for only 1-6% more latency (arXiv 2501.08219); the 70% cap left decode unchanged (Splitwise).
  With 0.1 the full H100 range (1,980 -> 1,095 MHz) costs +6% decode time, the A100 range (1,410 -> 1,005
  MHz) +3.4%.
"""

from __future__ import annotations

from schemas.fleet import SM_CLOCK_RANGE_MHZ, GpuType, power_limited_clock_mhz
from schemas.provenance import Provenance, Tagged

PREFILL_CLOCK_EXPONENT = Tagged(
    1.0, "1", Provenance.MODELED, "compute-bound; Splitwise 70% power cap -> prefill 1.30x (REFERENCES.md)"
)
DECODE_CLOCK_EXPONENT = Tagged(
    0.1, "1", Provenance.MODELED, "memory-bound; arXiv 2501.08219 1-6% latency over 16x clock (REFERENCES.md)"
)
#: Which coefficients scale like prefill (compute) and which like decode (memory).
PREFILL_TERMS = ("per_prefill_token_s", "per_prefill_attn_s")
DECODE_TERMS = ("base_s", "per_seq_s", "per_kv_token_s")


def check_clock(gpu: str, sm_clock_mhz: float) -> float:
    """Validate `sm_clock_mhz` against the GPU's settable range (MHz) and return f_max / f (>= 1)."""
    lo, hi = SM_CLOCK_RANGE_MHZ[GpuType(gpu)]
    if not lo <= sm_clock_mhz <= hi:
        raise ValueError(f"SM clock {sm_clock_mhz} MHz outside {gpu} range [{lo}, {hi}] MHz")
    return hi / sm_clock_mhz


def compute_clock_mhz(gpu: str, sm_clock_mhz: float) -> float:
    """The clock a busy GPU holds in compute-bound work at clock target `sm_clock_mhz`: min(target, f_pl).

    Examples
    --------
    >>> compute_clock_mhz("H100", 1980.0), compute_clock_mhz("H100", 1200.0)
    (1579.0, 1200.0)
    """
    check_clock(gpu, sm_clock_mhz)
    return min(sm_clock_mhz, power_limited_clock_mhz(gpu))


def clock_factor(term: str, gpu: str, sm_clock_mhz: float) -> float:
    """Multiplier (>= 1) on coefficient `term` at `sm_clock_mhz` relative to the default (maximum) clock.

    Examples
    --------
    >>> clock_factor("per_prefill_token_s", "H100", 0.85 * 1980.0)  # above the power-limited 1,579 MHz
    1.0
    >>> round(clock_factor("per_prefill_token_s", "H100", 0.7 * 1980.0), 3)
    1.139
    >>> round(clock_factor("per_seq_s", "H100", 1095.0), 3)
    1.061
    """
    ratio = check_clock(gpu, sm_clock_mhz)
    if term in PREFILL_TERMS:
        f_pl = power_limited_clock_mhz(gpu)
        return (f_pl / compute_clock_mhz(gpu, sm_clock_mhz)) ** PREFILL_CLOCK_EXPONENT.value
    return ratio**DECODE_CLOCK_EXPONENT.value
