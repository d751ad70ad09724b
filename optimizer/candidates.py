"""Physics-guided candidate generation: read the regime, propose the coupled bundles it implies.

Always proposed: the reference policy's plan, the previous plan, a max-packing plan (fp8 where allowed, the
largest KV-feasible batch, maximum clock, fewest replicas the MILP finds) and the same at the precision in
force (no reload, which would requeue the requests in flight), a min-energy plan (lowest clock,
fewest replicas meeting the TPOT SLO) and the MILP's sizing at low/mid/high clock in each allowed precision.
The regime adds bundles: an expensive hour adds packing variants with the deferral schedule's admission,
a cheap one adds headroom (lower target utilisation), high load or a wide forecast interval adds ceiling.
The full mode adds the lever spread around the reference (optimizer/lever_spread.py: capacity released as well
as added, autoscaler target, batch cap, precision with KV dtype, clock, deferral, token budget), the plans the
ruler branches, each with its measured margin (optimizer/margins.py).
The clock-only ablation proposes the reference plan at every clock step and nothing else. With several sites
(the three-site mode, with `site_placement`) every plan is also proposed placed: the work that may run anywhere
moving to the site with the lowest forecast price, the pricier sites kept for the arrivals pinned to their
region.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from optimizer.capacity_milp import SizingPool, size_capacity
from optimizer.deferral_lp import risk_adjusted_price
from optimizer.lever_spread import lever_spread
from optimizer.levers import LeverSpace, PoolLevers, plan_key
from optimizer.price_regime import CHEAP_PERCENTILE, EXPENSIVE_PERCENTILE, price_percentile
from optimizer.replica_capacity import idle_power_w, kv_sequences, replica_power_w, replica_rps
from schemas.cost import CostConfig, marginal_gpu_usd_per_h
from schemas.fleet import GPUS_PER_NODE, FleetSpec, GpuType, kv_dtype_for
from schemas.forecast import DisturbanceForecast
from schemas.plan import BatchAdmission, Plan, PoolPlan
from worldmodel.period_cost import market_price
from worldmodel.servingmodel import ServingModel

#: PUE: the operator cost model's value (schemas/cost.py, tagged modeled).
PUE: float = CostConfig().pue.value


@dataclass(frozen=True)
class Regime:
    """What the period looks like.

    price_percentile : risk-adjusted price of the period within the recent price history (0-1).
    price_trend : mean forecast price over the horizon / this period's, minus 1 (ratio).
    load_ratio : forecast demand (80% upper) / capacity of the previous plan's ceilings (ratio).
    kv_pressure : largest max_batch / KV-feasible sequences over the previous plan's pools (ratio).
    confidence : the forecasters' confidence (0-1).
    """

    price_percentile: float
    price_trend: float
    load_ratio: float
    kv_pressure: float
    confidence: float

    @property
    def expensive(self) -> bool:
        return self.price_percentile >= EXPENSIVE_PERCENTILE

    @property
    def cheap(self) -> bool:
        return self.price_percentile <= CHEAP_PERCENTILE


@dataclass(frozen=True)
class GenerationInputs:
    """Everything candidate generation reads.

    forecasts : this period first, then the next ones (the deferral horizon).
    price_history_usd_mwh : recent hourly prices known as of the decision ($/MWh).
    tpot_slo_s : per model, the tightest interactive TPOT SLO (s); absent = no TPOT bound.
    admission : this period's batch admission from the deferral LP (None keeps each plan's own).
    swap_budget : replicas that may change per period (count).
    deferrable_class, deferrable_release_rps : the deferrable class and the rate the deferral schedule
        releases this period (requests/s); None sizes for its forecast arrivals as they come.
    current_replicas : warm + loading replicas per pool now (count; empty when unknown).
    site_placement : with several sites, also propose every plan placed (`_placed`).
    gpu_usd_per_gpu_h : what a GPU held warm costs beyond its energy per type ($/GPU-hour, the cost basis's
        `schemas.cost.marginal_gpu_usd_per_h`): the capacity sizing's replica cost.
    """

    fleet: FleetSpec
    space: LeverSpace
    reference: Plan
    previous: Plan
    forecasts: tuple[DisturbanceForecast, ...]
    price_history_usd_mwh: tuple[float, ...]
    tpot_slo_s: Mapping[str, float]
    admission: BatchAdmission | None
    swap_budget: int
    risk_aversion: float = 0.5
    deferrable_class: str = "batch"
    deferrable_release_rps: float | None = None
    serving: ServingModel = field(default_factory=ServingModel)
    current_replicas: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    site_placement: bool = False
    gpu_usd_per_gpu_h: Mapping[str, float] = field(default_factory=lambda: marginal_gpu_usd_per_h("rented"))


def read_regime(inp: GenerationInputs) -> Regime:
    """Summarise price level and trend, load vs capacity, KV pressure and confidence."""
    now = inp.forecasts[0]
    p_now = risk_adjusted_price(now.price_usd_mwh, inp.risk_aversion)
    pct = price_percentile(p_now, inp.price_history_usd_mwh)
    ahead = [risk_adjusted_price(f.price_usd_mwh, inp.risk_aversion) for f in inp.forecasts]
    trend = float(np.mean(ahead)) / p_now - 1.0 if abs(p_now) > 1e-9 else 0.0
    demand = _demand_by_model(now, "hi80")
    cap: dict[str, float] = {}
    kv = 0.0
    for p in inp.previous.pools:
        inp_t, out_t = _sizes(now, p.model)
        cap[p.model] = cap.get(p.model, 0.0) + p.replica_ceiling * replica_rps(
            inp.serving, p, inp_t, out_t, inp.tpot_slo_s.get(p.model)
        )
        fits = kv_sequences(inp.serving, p, inp_t + 0.5 * out_t)
        kv = max(kv, p.max_batch / fits if fits > 0 else math.inf)
    load = max((d / cap[m] if cap.get(m) else math.inf) for m, d in demand.items()) if demand else 0.0
    return Regime(pct, trend, load, kv, now.confidence)


def generate(inp: GenerationInputs, mode: str = "full") -> list[Plan]:
    """Coupled candidate plans for this period, deduplicated, labelled, known-strong ones first.

    Parameters
    ----------
    inp : the regime's inputs and the plans in play.
    mode : "full", "no-deferral", "fixed-grid" (same bundles) or "clock-only" (reference x clock steps).
    """
    out: list[Plan] = [replace(inp.reference, label="reference"), _previous(inp)]
    if mode == "clock-only":
        for i in range(len(inp.space.pools[0].clocks_mhz)):
            out.append(_at_clock_level(inp.reference, inp.space, i, "reference@clock"))
        return _dedupe(out)
    regime = read_regime(inp)
    n_clk = len(inp.space.pools[0].clocks_mhz)
    # label, clock level, fp8 (None: the precision in force, no reload), packed batch, target u
    profiles: list[tuple[str, int, bool | None, bool, float]] = [
        ("max-packing", n_clk - 1, True, True, 0.85),
        ("max-packing-no-reload", n_clk - 1, None, True, 0.85),
        ("min-energy", 0, True, True, 0.8),
        ("milp-mid-fp8", n_clk // 2, True, True, 0.8),
        ("milp-mid-bf16", n_clk // 2, False, False, 0.8),
        ("milp-max-bf16", n_clk - 1, False, False, 0.8),
    ]
    if regime.expensive:
        profiles.append(("expensive-pack", n_clk - 2, True, True, 0.9))
    profiles.append(
        (
            "headroom",
            n_clk - 1,
            True,
            True,
            0.6 if regime.cheap or regime.load_ratio > 0.9 or regime.confidence < 0.8 else 0.7,
        )
    )
    for label, level, fp8, packed, u in profiles:
        plan = _milp_plan(inp, label, level, fp8, packed, u)
        if plan is not None:
            out.append(plan)
    if inp.admission is not None:
        out = [
            replace(p, batch_admission=inp.admission) if p.label not in ("reference", "previous") else p for p in out
        ]
        out.append(replace(inp.reference, batch_admission=inp.admission, label="reference+deferral"))
    if mode == "full":  # capacity both ways and one lever at a time around the reference (the ruler's spread)
        live = {k: int(v) for k, v in inp.current_replicas.items()}
        out += [p for _, p in lever_spread(inp.reference, {}, None, live, k_min=0)]
    if inp.site_placement and len({p.site for p in inp.reference.pools}) > 1:
        prices = site_prices(inp)
        out += [_placed(inp, p, prices) for p in out]
    return _dedupe(out)


#: Share of a pricier site's replicas (of a model, beyond its pinned need) a placed plan starts at the cheapest
#: site per period (ratio). Measured on the three-site windows (1 h, seed 0): capping the pricier sites at their
#: pinned need at once starved the work while the cheap site's replicas cold-started (the backlog trigger then
#: scaled every site up: 221.5 GPU-h against production's 86.9); draining a quarter per period while the cheap
#: site starts as many raised chat violations 0.9% -> 2.7% (ERCOT window); starting them without draining
#: keeps the SLA but holds both copies a while (105.5 GPU-h against 83.0).
MOVE_SHARE = 0.25


def site_prices(inp: GenerationInputs, periods: int | None = None) -> dict[str, float]:
    """Risk-adjusted mean energy price over the first `periods` forecast periods (all: None) of each site the
    reference uses ($/MWh): the site's market price where the forecast carries it (`other_markets`), else the
    forecast's own."""
    market = {s.name: s.market for s in inp.fleet.sites}
    out = {}
    for site in dict.fromkeys(p.site for p in inp.reference.pools):
        vals = []
        for f in inp.forecasts[:periods]:
            vals.append(risk_adjusted_price(market_price(f, market.get(site))[0], inp.risk_aversion))
        out[site] = float(np.mean(vals))
    return out


def _placed(inp: GenerationInputs, plan: Plan, prices: Mapping[str, float], target_u: float = 0.7) -> Plan:
    """`plan` with the work that may run anywhere moving to the cheapest site.

    Every other site keeps, per model, its first pool with a floor sized for the arrivals pinned to its region
    (the 80% upper forecast at `target_u`; residency keeps them there) and a ceiling at what runs there now
    (it may shrink, not grow); its further pools of the model hold nothing. The cheapest site's first pool of
    each model is floored at what runs there plus `MOVE_SHARE` of the replicas the other sites hold beyond
    their pinned need: the replicas start (cold) at the cheap site while the old ones keep serving, and the
    router's spreading lets the pricier sites' own autoscalers scale down. Pools are listed cheapest first."""
    order = sorted(range(len(plan.pools)), key=lambda i: (prices.get(plan.pools[i].site, math.inf), i))
    pools = [plan.pools[i] for i in order]
    now = inp.forecasts[0]
    demand = _demand_by_model(now, "hi80")
    region = {s.name: s.region for s in inp.fleet.sites}
    cheapest = pools[0].site if pools else ""

    def running(site: str, model: str) -> int:
        return sum(c for key, c in inp.current_replicas.items() if key[0] == site and key[1] == model)

    moved: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    for k, p in enumerate(pools):
        if p.site == cheapest:
            continue
        if (p.site, p.model) in seen:
            pools[k] = replace(p, replica_floor=0, replica_ceiling=0)
            continue
        seen.add((p.site, p.model))
        share = now.pinned_share.get((p.model, region.get(p.site, "")), 0.0)
        inp_t, out_t = _sizes(now, p.model)
        rps = replica_rps(inp.serving, p, inp_t, out_t, inp.tpot_slo_s.get(p.model))
        need = min(max(p.replica_floor, math.ceil(share * demand.get(p.model, 0.0) / max(rps * target_u, 1e-9))),
                   inp.space.pool(p.key).max_replicas)
        now_there = running(p.site, p.model)
        moved[p.model] = moved.get(p.model, 0) + math.ceil(MOVE_SHARE * max(now_there - need, 0))
        pools[k] = replace(p, replica_floor=need, replica_ceiling=max(need, now_there))
    for k, p in enumerate(pools):
        if p.site == cheapest and p.model in moved:
            n = min(running(p.site, p.model) + moved.pop(p.model), inp.space.pool(p.key).max_replicas)
            pools[k] = replace(p, replica_floor=max(p.replica_floor, n), replica_ceiling=max(p.replica_ceiling, n))
    return replace(plan.with_pools(tuple(pools)), label=f"{plan.label}@cheap-site")


def _previous(inp: GenerationInputs) -> Plan:
    """The plan in force, re-bounded: its precision, batch, clock and admission, with the reference's floors
    and ceilings where it autoscales. A floor is re-decided every period (the MILP plans size one for the
    coming demand); carried forward it would pin replicas the autoscaler would otherwise release."""
    prev = inp.previous
    if not prev.autoscale:
        return replace(prev, label="previous")
    ref = {p.key: p for p in inp.reference.pools}
    pools = tuple(
        replace(p, replica_floor=ref[p.key].replica_floor, replica_ceiling=ref[p.key].replica_ceiling)
        if p.key in ref else p
        for p in prev.pools
    )
    return replace(prev.with_pools(pools), label="previous")


def _milp_plan(
    inp: GenerationInputs, label: str, level: int, fp8: bool | None, packed: bool, target_u: float
) -> Plan | None:
    """Set every pool's clock level, precision (fp8 where allowed, bf16, or with `fp8` None the precision in
    force: a reload requeues the requests in flight) and batch, then size replicas with the MILP."""
    now = inp.forecasts[0]
    prices = site_prices(inp, periods=1)
    prev = {p.key: p for p in inp.previous.pools}
    pools: list[PoolPlan] = []
    sizing: list[SizingPool] = []
    reloads = 0
    for p in inp.reference.pools:
        lv = inp.space.pool(p.key)
        was = prev.get(p.key)
        if fp8 is None:
            precision = was.precision if was is not None else p.precision
        elif fp8 and "fp8" in lv.precisions:
            precision = "fp8"
        else:
            precision = "bf16" if "bf16" in lv.precisions else lv.precisions[0]
        q = replace(p, precision=precision, kv_dtype=kv_dtype_for(precision, p.kv_dtype),
                    sm_clock_mhz=lv.clocks_mhz[min(level, len(lv.clocks_mhz) - 1)])
        inp_t, out_t = _sizes(now, p.model)
        batch = _packed_batch(inp.serving, q, lv, inp_t + 0.5 * out_t) if packed else min(256, lv.max_batches[-1])
        q = replace(q, max_batch=batch)
        if was is not None and was.precision != q.precision:
            reloads += was.replica_floor
        power = replica_power_w(inp.serving, q, target_u)
        rps = replica_rps(inp.serving, q, inp_t, out_t, inp.tpot_slo_s.get(p.model))
        added_w = replica_power_w(inp.serving, q, 1.0) - q.tp * idle_power_w(q.gpu)
        cost_usd_h = q.tp * inp.gpu_usd_per_gpu_h[p.gpu] + power * PUE * prices[p.site] / 1e6
        sizing.append(
            SizingPool(p.key, q.tp, rps, added_w, cost_usd_h, was.replica_floor if was else 0, lv.max_replicas)
        )
        pools.append(q)
    if reloads > inp.swap_budget:
        return None
    demand = _demand_by_model(now, "point", inp.deferrable_class, inp.deferrable_release_rps)
    site_names = {p.site for p in pools}
    sites = [s for s in inp.fleet.sites if s.name in site_names]
    gpus = {(s.name, str(g.gpu)): s.gpus(GpuType(g.gpu)) for s in sites for g in s.groups}
    base = {s.name: sum(g.nodes * GPUS_PER_NODE * idle_power_w(str(g.gpu)) for g in s.groups) for s in sites}
    sol = size_capacity(
        sizing, demand, gpus, {s.name: s.power_cap_w for s in sites}, base, inp.swap_budget - reloads, target_u
    )
    if sol is None:
        return None
    surge = _surge_ratio(now)
    ref_ceiling = {p.key: p.replica_ceiling for p in inp.reference.pools}
    ref_floor = {p.key: p.replica_floor for p in inp.reference.pools}
    floors = _prewarm_floors(inp, {q.key: sol.replicas[q.key] for q in pools})
    # no arrivals forecast (the drain): only held deferrable work is left, and the ceiling is what releasing it
    # scales the fleet to, so the sized count (at least the reference's floor: every model stays served) caps it
    drain = now.drain
    sized = []
    for q in pools:
        n = sol.replicas[q.key]
        # the autoscaler's room above the floor: at least the reference's (an unused ceiling costs nothing on
        # either basis; a tight one turns a burst the forecast missed into TTFT violations)
        headroom = max(math.ceil(n * surge) + (1 if n else 0), ref_ceiling.get(q.key, 0))
        room = max(n, floors[q.key], ref_floor[q.key]) if drain else headroom
        ceiling = min(inp.space.pool(q.key).max_replicas, room)
        sized.append(replace(q, replica_floor=floors[q.key], replica_ceiling=ceiling))
    return replace(inp.reference.with_pools(tuple(sized)), label=label)


def _prewarm_floors(inp: GenerationInputs, sized: dict[tuple[str, str, str], int]) -> dict[tuple[str, str, str], int]:
    """Floors from the MILP's counts only for a model it sizes above the replicas running now (a pre-warm the
    autoscaler would not do yet); for the others the reference's floors. A floor at or below the running count
    adds nothing this period, and it persists: it pins replicas the autoscaler would release when demand falls,
    and a floor raised on one pool while the model's total stays moves replicas (the runtime stops one with its
    sequences in flight; requeued, they trip the backlog trigger; CAISO, 1 h, seed 1: 36.6 -> 68.5 GPUs)."""
    ref = {p.key: p.replica_floor for p in inp.reference.pools}
    if not inp.current_replicas:  # unknown: the MILP's counts as they are
        return dict(sized)
    out = {}
    for model in {k[1] for k in sized}:
        keys = [k for k in sized if k[1] == model]
        prewarm = sum(sized[k] for k in keys) > sum(inp.current_replicas.get(k, 0) for k in keys)
        out.update({k: sized[k] if prewarm else min(sized[k], ref.get(k, 0)) for k in keys})
    return out


def _at_clock_level(plan: Plan, space: LeverSpace, level: int, label: str) -> Plan:
    pools = tuple(replace(p, sm_clock_mhz=space.pool(p.key).clocks_mhz[level]) for p in plan.pools)
    return replace(plan.with_pools(pools), label=f"{label}{level}")


def _packed_batch(sm: ServingModel, p: PoolPlan, lv: PoolLevers, context_tokens: float) -> int:
    """The largest batch step whose KV fits at the mean context (at least the smallest step)."""
    fits = kv_sequences(sm, p, context_tokens)
    ok = [b for b in lv.max_batches if b <= fits]
    return ok[-1] if ok else lv.max_batches[0]


def _sizes(f: DisturbanceForecast, model: str) -> tuple[float, float]:
    """Arrival-weighted mean input and output tokens of a model's classes (tokens)."""
    ds = [d for d in f.demand if d.model == model]
    w = sum(max(d.arrivals_per_s.point, 1e-9) for d in ds)
    if not ds:
        return 1.0, 1.0
    return (
        sum(max(d.arrivals_per_s.point, 1e-9) * d.input_tokens_mean for d in ds) / w,
        sum(max(d.arrivals_per_s.point, 1e-9) * d.output_tokens_mean for d in ds) / w,
    )


def _demand_by_model(
    f: DisturbanceForecast, which: str, deferrable_class: str = "", deferrable_rps: float | None = None
) -> dict[str, float]:
    """Forecast arrivals per model (requests/s), `which` of point / hi80 / hi95; the deferrable class at
    `deferrable_rps` when given (what the deferral schedule releases this period)."""
    out: dict[str, float] = {}
    for d in f.demand:
        rate = max(getattr(d.arrivals_per_s, which), 0.0)
        if d.request_class == deferrable_class and deferrable_rps is not None:
            rate = deferrable_rps
        out[d.model] = out.get(d.model, 0.0) + rate
    return out


def _surge_ratio(f: DisturbanceForecast) -> float:
    """95% upper / point of total demand: how far the autoscaler may need to go above the floor (ratio)."""
    pt = sum(max(d.arrivals_per_s.point, 0.0) for d in f.demand)
    hi = sum(max(d.arrivals_per_s.hi95, 0.0) for d in f.demand)
    return max(hi / pt, 1.0) if pt > 0 else 1.0


def _dedupe(plans: Sequence[Plan]) -> list[Plan]:
    seen: set[tuple[object, ...]] = set()
    out = []
    for p in plans:
        k = plan_key(p)
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out
