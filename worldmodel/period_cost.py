"""The power, energy and cost of one control period (step 5 of worldmodel/forward.py): the non-GPU power of the
nodes hosting replicas, idle GPUs, PUE, each site's energy at its market's price ($/MWh), and the GPUs' rent or
ownership through schemas/cost.py."""

from __future__ import annotations

import math
from collections.abc import Mapping

from schemas import cost
from schemas.fleet import GPUS_PER_NODE as _GPUS_PER_NODE
from schemas.fleet import default_fleet, gpus_by_type
from schemas.forecast import DisturbanceForecast, Interval
from worldmodel.outcomes import Scenario
from worldmodel.servingmodel import ServingModel, clock_or_max
from worldmodel.snapshot import FleetSnapshot


def account_period(
    out: Scenario,
    sm: ServingModel,
    snap: FleetSnapshot,
    fc: DisturbanceForecast,
    scenario: str,
    power_w: dict[str, float],
    gpus_used: dict[tuple[str, str], float],
    gpu_hours: dict[str, float],
    cost_config: cost.CostConfig,
    site_markets: Mapping[str, str],
    idle_power: bool,
) -> None:
    """Fill `out`'s peak power (W), GPU-hours, energy (kWh) and costs ($) of a period of `fc.period_s` s.

    Parameters
    ----------
    power_w : the serving GPUs' power per site (W); node overheads and idle GPUs are added to it.
    gpus_used : GPUs hosting replicas per (site, gpu type) (count, averaged over the period).
    gpu_hours : GPU-hours per gpu type.
    site_markets : the market each site's energy is priced at.
    idle_power : count the site's GPUs hosting no replica at idle power.
    """
    T = fc.period_s
    for key, n in gpus_used.items():  # every node hosting a replica draws its overhead
        nodes = _nodes_on(n, *snap.placement.get(key, (0, 0)))
        power_w[key[0]] = power_w.get(key[0], 0.0) + nodes * sm.node_overhead_w(key[1])
    if idle_power:
        for (site, gpu), n in snap.inventory.items():
            idle = max(n - gpus_used.get((site, gpu), 0.0), 0.0)
            power_w[site] = power_w.get(site, 0.0) + idle * sm.gpu_power_w(gpu, clock_or_max(gpu, None), 0.0)
    total_w = sum(power_w.values())
    out.peak_power_w = total_w
    out.gpu_hours = sum(gpu_hours.values())
    out.energy_kwh = total_w * T / 3.6e6 * cost_config.pue.value
    out.energy_cost_usd = sum(
        cost.energy_cost_usd(w / 1e3, T / 3600.0, _price(fc, site_markets.get(site), scenario), cost_config)
        for site, w in power_w.items()
    )
    rented = cost.gpu_cost_rented_usd(gpu_hours, cost_config)
    owned = cost.gpu_cost_owned_usd(gpus_by_type(snap.inventory), T / 3600.0, cost_config)
    out.cost_usd = max(rented + out.energy_cost_usd, 1e-9)
    out.cost_owned = max(owned + out.energy_cost_usd, 1e-9)


def market_price(fc: DisturbanceForecast, market: str | None) -> tuple[Interval, bool]:
    """A market's price for the period ($/MWh) and whether it was published: from `fc.other_markets` where the
    forecast carries the market, else the forecast's own price."""
    for m in fc.other_markets:
        if m.market == market:
            return m.price_usd_mwh, m.published
    return fc.price_usd_mwh, fc.price_published


def default_site_markets() -> dict[str, str]:
    """The market of each site of the operator's default fleet."""
    return {s.name: s.market for s in default_fleet().sites}


def _price(fc: DisturbanceForecast, market: str | None, scenario: str) -> float:
    """The energy price of a site on `market` in this scenario ($/MWh): the market's, the 95% bound where
    unpublished."""
    price, published = market_price(fc, market)
    return price.hi95 if scenario == "hi95" and not published else price.point


def _nodes_on(gpus: float, gpus_now: int, nodes_now: int) -> int:
    """Nodes hosting `gpus` GPUs of one (site, gpu type) over the period (count), from the `nodes_now` nodes its
    `gpus_now` GPUs sit on at the snapshot: growth fills their free GPUs before it powers a node (first fit);
    a release empties at most one node per 8 GPUs released (the runtime stops the least-loaded replica,
    wherever it sits), never fewer than packed nodes."""
    packed = math.ceil(gpus / _GPUS_PER_NODE - 1e-9)
    if nodes_now <= 0:
        return packed
    if gpus >= gpus_now:
        spare = nodes_now * _GPUS_PER_NODE - gpus_now
        return nodes_now + math.ceil(max(gpus - gpus_now - spare, 0.0) / _GPUS_PER_NODE - 1e-9)
    return max(packed, nodes_now - math.floor((gpus_now - gpus) / _GPUS_PER_NODE))


