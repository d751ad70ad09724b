"""SM-clock scaling of step-time coefficients (modeled).

A coefficient c measured at the maximum clock f_max becomes c x (f_max / f) ** a at clock f:

* compute-bound prefill terms (per_prefill_token_s, per_prefill_attn_s): a = 1.0. A 70% power cap on a
  DGX-H100 made prefill 1.30x slower (Splitwise, REFERENCES.md), i.e. an effective clock ~0.77 f_max.
* memory-bound decode terms (base_s, per_seq_s, per_kv_token_s): a = 0.1. Lowering the SM clock 16x cut
  decode energy 42% for only 1-6% more latency (arXiv 2501.08219); the 70% cap left decode unchanged
  (Splitwise). With a = 0.1 the full H100 range (1,980 -> 1,095 MHz) costs +6% decode time, the top of
  that 1-6% band; the A100 range (1,410 -> 1,005 MHz) costs +3.4%.
"""

from __future__ import annotations

from schemas.fleet import SM_CLOCK_RANGE_MHZ, GpuType
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


def clock_factor(term: str, gpu: str, sm_clock_mhz: float) -> float:
    """Multiplier (>= 1) on coefficient `term` at `sm_clock_mhz` relative to the maximum clock.

    Examples
    --------
    >>> round(clock_factor("per_prefill_token_s", "H100", 990.0 * 1.5), 3)
    1.333
    >>> round(clock_factor("per_seq_s", "H100", 1095.0), 3)
    1.061
    """
    ratio = check_clock(gpu, sm_clock_mhz)
    exponent = PREFILL_CLOCK_EXPONENT if term in PREFILL_TERMS else DECODE_CLOCK_EXPONENT
    return ratio**exponent.value
