"""Operator cost model (DESIGN.md "Objective and gates"): GPU cost on two bases, energy cost, switch cost.

Operator cost = GPU cost + energy cost + switch cost, in US dollars.

* GPU cost, `rented` basis: every warm or loading GPU-hour x the rental rate of its type.
* GPU cost, `owned` basis: every GPU of the fleet for the whole horizon x the amortized rate
  (purchase price / (4 years x 8,760 h)).
* Energy cost: site IT power (kW) x PUE x hours x the price of the hour it is drawn in ($/MWh / 1,000).
  Negative prices credit energy; the total must stay positive (asserted by `total_cost`).
* Switch cost: the simulator charges loading GPUs as GPU-hours and their draw as energy, so it needs no
  separate term; `switch_usd` reports the GPU-hour and energy cost of loading time, already contained in
  gpu_usd and energy_usd, for transparency. It is not added to the total a second time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schemas.fleet import GPUS_PER_NODE, NODE_PEAK_W, GpuType
from schemas.provenance import Provenance, Tagged

HOURS_PER_YEAR = 8760.0
#: The cost bases (the vocabulary's one home): `rented` charges the GPU-hours held, `owned` the whole fleet.
COST_BASES: tuple[str, ...] = ("rented", "owned")
_SRC = "DESIGN.md cost-model defaults"


def _rate(price_usd: float, years: float) -> float:
    return price_usd / (years * HOURS_PER_YEAR)


@dataclass(frozen=True)
class CostConfig:
    """Cost-model defaults, each a Tagged value with unit and source (all modeled)."""

    rented_usd_per_gpu_h: dict[str, Tagged] = field(
        default_factory=lambda: {
            "H100": Tagged(2.50, "USD/GPU-h", Provenance.MODELED, _SRC),
            "A100": Tagged(1.50, "USD/GPU-h", Provenance.MODELED, _SRC),
        }
    )
    purchase_usd_per_gpu: dict[str, Tagged] = field(
        default_factory=lambda: {
            "H100": Tagged(30000.0, "USD/GPU", Provenance.MODELED, _SRC),
            "A100": Tagged(15000.0, "USD/GPU", Provenance.MODELED, _SRC),
        }
    )
    amortization_years: Tagged = Tagged(4.0, "years", Provenance.MODELED, _SRC)
    pue: Tagged = Tagged(1.3, "1", Provenance.MODELED, _SRC)

    def owned_usd_per_gpu_h(self, gpu: str) -> float:
        """Amortized owned rate ($/GPU-hour): purchase price / (years x 8,760 h)."""
        return _rate(self.purchase_usd_per_gpu[gpu].value, self.amortization_years.value)

    def as_dict(self) -> dict[str, object]:
        """Every default with unit, tag and source, for results.json provenance."""
        return {
            "rented_usd_per_gpu_h": {k: v.as_dict() for k, v in self.rented_usd_per_gpu_h.items()},
            "purchase_usd_per_gpu": {k: v.as_dict() for k, v in self.purchase_usd_per_gpu.items()},
            "amortization_years": self.amortization_years.as_dict(),
            "pue": self.pue.as_dict(),
        }


DEFAULT_COST = CostConfig()


def energy_cost_usd(
    site_it_power_kw: np.ndarray | float,
    hours: np.ndarray | float,
    price_usd_mwh: np.ndarray | float,
    config: CostConfig = DEFAULT_COST,
) -> float:
    """Energy cost (USD) = sum(site IT power x PUE x hours x price / 1,000).

    Parameters
    ----------
    site_it_power_kw : array or float
        Site IT power per interval (kW), before PUE.
    hours : array or float
        Interval lengths (h).
    price_usd_mwh : array or float
        Wholesale price of each interval's hour ($/MWh); negative prices credit energy.
    config : CostConfig
        Supplies the PUE.

    Returns
    -------
    float
        US dollars (negative when negative prices dominate).

    Examples
    --------
    >>> round(energy_cost_usd(1000.0, 1.0, 50.0), 2)  # 1 MW x 1.3 x 1 h x $50/MWh
    65.0
    """
    kwh = (
        np.asarray(site_it_power_kw, dtype=np.float64)
        * config.pue.value
        * np.asarray(hours, dtype=np.float64)
    )
    return float(np.sum(kwh * np.asarray(price_usd_mwh, dtype=np.float64) / 1000.0))


def gpu_cost_rented_usd(gpu_hours_by_type: dict[str, float], config: CostConfig = DEFAULT_COST) -> float:
    """Rented GPU cost (USD): warm or loading GPU-hours per type x rental $/GPU-hour.

    Examples
    --------
    >>> gpu_cost_rented_usd({"H100": 10.0, "A100": 4.0})
    31.0
    """
    return float(sum(h * config.rented_usd_per_gpu_h[g].value for g, h in gpu_hours_by_type.items()))


def gpu_cost_owned_usd(
    fleet_gpus_by_type: dict[str, int], horizon_h: float, config: CostConfig = DEFAULT_COST
) -> float:
    """Owned GPU cost (USD): every fleet GPU for the whole horizon x amortized $/GPU-hour.

    Examples
    --------
    >>> round(gpu_cost_owned_usd({"H100": 8}, 3.0), 4)  # 8 x 3 h x 30,000 / 35,040 h
    20.5479
    """
    return float(sum(n * horizon_h * config.owned_usd_per_gpu_h(g) for g, n in fleet_gpus_by_type.items()))


def marginal_gpu_usd_per_h(basis: str, config: CostConfig = DEFAULT_COST) -> dict[str, float]:
    """What holding one more GPU warm for an hour costs beyond its energy, per GPU type ($/GPU-hour), on cost basis
    `basis` (`COST_BASES`): the rental rate on the rented basis; nothing on the owned basis, whose every GPU is
    paid for over the horizon whether it runs or not. The planner prices capacity and held work with it.

    Examples
    --------
    >>> marginal_gpu_usd_per_h("rented")["H100"], marginal_gpu_usd_per_h("owned")["H100"]
    (2.5, 0.0)
    """
    if basis not in COST_BASES:
        raise ValueError(f"cost basis {basis!r} not in {COST_BASES}")
    return {g: (t.value if basis == "rented" else 0.0) for g, t in config.rented_usd_per_gpu_h.items()}


def energy_breakeven_usd_mwh(gpus_by_type: dict[str, int], config: CostConfig = DEFAULT_COST) -> float:
    """The energy price ($/MWh) at which the fleet `gpus_by_type` (count per GPU type) drawing its full power
    (`schemas.fleet.NODE_PEAK_W` per 8 GPUs, x PUE) for an hour costs as much in energy as its amortized owned
    price for that hour: below it the fleet's capital dominates what a held GPU costs, above it its energy.

    Examples
    --------
    >>> round(energy_breakeven_usd_mwh({"H100": 8}), 1), round(energy_breakeven_usd_mwh({"A100": 8}), 1)
    (719.5, 645.0)
    """
    kw = sum(n * NODE_PEAK_W[GpuType(g)] / GPUS_PER_NODE / 1000.0 for g, n in gpus_by_type.items())
    usd_h = sum(n * config.owned_usd_per_gpu_h(g) for g, n in gpus_by_type.items())
    return usd_h / (kw * config.pue.value) * 1000.0 if kw > 0 else float("inf")


class NonPositiveCostError(ValueError):
    """Operator cost came out <= 0: the accounting is broken (energy credits cannot exceed GPU cost)."""


@dataclass(frozen=True)
class CostBreakdown:
    """Operator cost over the accounting horizon (USD); energy_share = energy_usd / total_usd."""

    gpu_usd: float
    energy_usd: float
    switch_usd: float
    total_usd: float
    energy_share: float


def total_cost(gpu_usd: float, energy_usd: float, switch_usd: float = 0.0) -> CostBreakdown:
    """Combine the cost terms; the total is gpu_usd + energy_usd and must be > 0.

    Parameters
    ----------
    gpu_usd : float
        GPU cost on the chosen basis (USD), loading GPU-hours included.
    energy_usd : float
        Energy cost (USD), may be negative under negative prices; loading draw included.
    switch_usd : float
        GPU-hour and energy cost of loading time (USD), already inside the two terms above; reported only.

    Returns
    -------
    CostBreakdown

    Raises
    ------
    NonPositiveCostError
        If the total is not positive.

    Examples
    --------
    >>> total_cost(90.0, 10.0, 5.0).energy_share
    0.1
    """
    total = gpu_usd + energy_usd
    if not total > 0.0:
        raise NonPositiveCostError(
            f"operator cost must be > 0, got {total:.6g} USD (gpu {gpu_usd:.6g}, energy {energy_usd:.6g})"
        )
    return CostBreakdown(gpu_usd, energy_usd, switch_usd, total, energy_usd / total)
