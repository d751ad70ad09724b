"""The SM clock by energy price: the week-before measurement of each clock share, repriced at the period's price.

The week-before tuning (streams/replay/tuning.py) serves the site's own past traffic at each SM clock share it
searches, everything else as its configuration stood at that axis, on the ground truth, and records what each
share served and drew: SLA-met requests, GPU cost on both bases ($) and energy (MWh, PUE included). It chose by
gp/$ at the week before's prices. A lower clock trades SLA-met requests for energy, so which share pays depends
on the price: the same measurement repriced at a period's forecast price gives that period's gp/$,

    gp(share, P) = sla_met / (gpu_usd + energy_mwh x P)

(gpu_usd on the operator's cost basis). The aurelius arms run the guarded reference plan at the share of highest
repriced gp/$ among those the tuning's SLA gate passed (per class within 0.1 pp of the deployed configuration's
violation rate on the week before) and that beat the full clock at that price on every workload draw the tuning
pooled (`per_draw`): a lower clock is a deviation from how the fleet runs, taken only where the week before's
evidence for it does not hang on one draw (the pooled lead of 0.85 over 1.0 on PJM's default week before, 0.9%,
came from three of four draws). Ties keep the higher clock. Only data from before the window, and the period's
price as forecast (the published day-ahead price where there is one), enter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.cost import COST_BASES


@dataclass(frozen=True)
class ClockMeasurement:
    """One clock share served on the week before: share (SM clock / max), sla_met (requests), gpu_usd and
    gpu_usd_owned (GPU cost, $, rented and owned basis), energy_mwh (MWh, PUE included), within_sla (passed the
    tuning's per-class gate), all pooled over the tuning's draws; per_draw the same four quantities per draw
    (sla_met, gpu_usd, gpu_usd_owned, energy_mwh), empty where one draw was measured."""

    share: float
    sla_met: float
    gpu_usd: float
    gpu_usd_owned: float
    energy_mwh: float
    within_sla: bool
    per_draw: tuple[tuple[float, float, float, float], ...] = ()

    def gp_at(self, price_usd_mwh: float, basis: str = "rented") -> float:
        """SLA-met requests per dollar with the energy bought at `price_usd_mwh` ($/MWh), on `basis` (req/$)."""
        return _gp(self.sla_met, self.gpu_usd, self.gpu_usd_owned, self.energy_mwh, price_usd_mwh, basis)

    def draws_at(self, price_usd_mwh: float, basis: str = "rented") -> tuple[float, ...]:
        """`gp_at` on each draw (req/$); the pooled value alone where one draw was measured."""
        if not self.per_draw:
            return (self.gp_at(price_usd_mwh, basis),)
        return tuple(_gp(*d, price_usd_mwh, basis) for d in self.per_draw)


def _gp(sla_met: float, gpu_usd: float, gpu_usd_owned: float, energy_mwh: float, price_usd_mwh: float,
        basis: str) -> float:  # fmt: skip
    if basis not in COST_BASES:
        raise ValueError(f"cost basis {basis!r} is not one of {COST_BASES}")
    usd = (gpu_usd_owned if basis == "owned" else gpu_usd) + energy_mwh * price_usd_mwh
    return sla_met / usd if usd > 0 else 0.0


@dataclass(frozen=True)
class ClockPrices:
    """The week before's clock-share measurements (module docstring).

    >>> rows = (ClockMeasurement(1.0, 1000, 1.0, 1.2, 0.0010, True),
    ...         ClockMeasurement(0.85, 990, 1.0, 1.2, 0.0008, True),
    ...         ClockMeasurement(0.7, 950, 1.0, 1.2, 0.0006, False))
    >>> prices = ClockPrices(rows)
    >>> prices.share_at(50.0), prices.share_at(4000.0)  # cheap energy: full clock; a spike: the lower clock pays
    (1.0, 0.85)
    >>> prices.share_at(1e6)  # 0.7 would pay more still, but failed the SLA gate on the week before
    0.85
    >>> split = ClockPrices((ClockMeasurement(1.0, 1000, 1.0, 1.2, 0.0010, True, ((600, .5, .6, .0005),
    ...                                                                          (400, .5, .6, .0005))),
    ...                      ClockMeasurement(0.85, 950, 1.0, 1.2, 0.0008, True, ((620, .5, .6, .0004),
    ...                                                                          (330, .5, .6, .0004)))))
    >>> [round(r.gp_at(4000.0)) for r in split.rows], [[round(g) for g in r.draws_at(4000.0)] for r in split.rows]
    ([200, 226], [[240, 160], [295, 157]])
    >>> split.share_at(4000.0)  # pooled, 0.85 pays; on the second draw it loses to the full clock
    1.0
    """

    rows: tuple[ClockMeasurement, ...]

    def share_at(self, price_usd_mwh: float, basis: str = "rented") -> float:
        """The clock share of highest repriced gp/$ among those within SLA that beat the full clock's row on every
        draw at that price (ties: the higher clock); 1.0 without any."""
        full = max(self.rows, key=lambda r: r.share)
        top = full.draws_at(price_usd_mwh, basis)

        def beats_full(r: ClockMeasurement) -> bool:
            mine = r.draws_at(price_usd_mwh, basis)
            return r is full or (len(mine) == len(top) and all(a > b for a, b in zip(mine, top, strict=True)))

        ok = [r for r in self.rows if r.within_sla and beats_full(r)]
        if not ok:
            return 1.0
        best = max(ok, key=lambda r: (r.gp_at(price_usd_mwh, basis), r.share))
        return best.share

    def as_dict(self) -> list[dict[str, Any]]:
        """The measurements as recorded (decision records, results.json)."""
        return [{"share": r.share, "sla_met": r.sla_met, "gpu_usd": r.gpu_usd, "gpu_usd_owned": r.gpu_usd_owned,
                 "energy_mwh": r.energy_mwh, "within_sla": r.within_sla, "per_draw": [list(d) for d in r.per_draw]}
                for r in self.rows]  # fmt: skip
