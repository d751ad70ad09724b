"""GPU and node power (W): idle plus a utilization- and clock-dependent dynamic part.

P_gpu = idle + (max - idle) x util x (f / f_max) ** gamma, per GPU, where util is the fraction of time the
replica's GPUs are computing (0-1). gamma = 2.2 (modeled): dynamic CMOS power ~ f V^2 with the voltage
following the clock over the upper DVFS range (cubic) and flat at the bottom (linear); 2-2.5 is the usual
fit over datacenter GPU clock ranges. The replay varies it with `clock_power_exponent`.

Node power adds `node_overhead_w` (CPUs, NVSwitches, NICs, fans), held constant and set so that an idle
8-GPU node draws the Splitwise idle figure (REFERENCES.md: ~1,500 W A100, ~2,800 W H100).

Measured context (Splitwise A100 rows, peak_power / average_power are fractions of the 400 W TDP): peak
reaches 0.98-1.09 of TDP in every configuration (so max_power_w = TDP), while the run-averaged draw of a
continuously busy replica is 0.43 (TP8) to 0.74 (TP2) of TDP at batch 1 and 0.46-0.79 at batch 16: small-batch
decode keeps a GPU busy without drawing its full power. Simulators wanting that effect should pass util as
busy fraction x an activity factor.
"""

from __future__ import annotations

from typing import Protocol

from schemas.fleet import GPUS_PER_NODE
from schemas.provenance import Provenance, Tagged
from worldmodel.physics.tables import gpu_spec, max_clock_mhz

CLOCK_POWER_EXPONENT = Tagged(
    2.2, "1", Provenance.MODELED, "P_dyn ~ f V^2, V tracking f over the upper DVFS range; typical 2-2.5"
)


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
) -> float:
    """Power of one GPU (W).

    Parameters
    ----------
    coeffs_or_gpu : StepCoefficients or str
        Coefficients of the pool (idle_power_w, max_power_w) or a GPU type name ('H100' | 'A100').
    util : float
        Fraction of time the GPU is computing, in [0, 1].
    sm_clock_mhz : float
        SM clock (MHz); the dynamic part scales as (f / f_max) ** gamma.
    clock_power_exponent : float, optional
        gamma; default `CLOCK_POWER_EXPONENT` (2.2, modeled).
    gpu : str, optional
        GPU type, required with coefficients (they do not carry the maximum clock).

    Returns
    -------
    float
        Watts per GPU.

    Examples
    --------
    >>> gpu_power_w("H100", 1.0, 1980.0)
    700.0
    >>> round(gpu_power_w("H100", 0.5, 1980.0 / 2, clock_power_exponent=2.0), 1)
    148.8
    """
    if not 0.0 <= util <= 1.0:
        raise ValueError(f"util must be in [0, 1], got {util}")
    if isinstance(coeffs_or_gpu, str):
        spec = gpu_spec(coeffs_or_gpu)
        idle, peak, gpu = spec.idle_w.value, spec.tdp_w.value, coeffs_or_gpu
    elif gpu is None:
        raise ValueError("gpu_power_w needs gpu= (for its maximum clock) when given coefficients")
    else:
        idle, peak = coeffs_or_gpu.idle_power_w, coeffs_or_gpu.max_power_w
    gamma = CLOCK_POWER_EXPONENT.value if clock_power_exponent is None else clock_power_exponent
    return idle + (peak - idle) * util * (sm_clock_mhz / max_clock_mhz(gpu)) ** gamma


def node_overhead_w(gpu: str) -> float:
    """Non-GPU power of one 8-GPU node (W): Splitwise idle node power - 8 x GPU idle, held constant.

    Examples
    --------
    >>> node_overhead_w("H100"), node_overhead_w("A100")
    (2240.0, 1100.0)
    """
    spec = gpu_spec(gpu)
    return spec.node_idle_w.value - GPUS_PER_NODE * spec.idle_w.value
