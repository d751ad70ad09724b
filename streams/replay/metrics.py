"""Cost and metrics exactly as DESIGN.md defines them, from one run's ground-truth logs.

- offered: requests arriving in the window; sla_met: offered requests that met their SLA (unfinished
  requests count as violations); sla_violation_rate = (offered - sla_met) / offered.
- cost (rented basis) = GPU-hours of warm or loading GPUs x rental rate + energy + switch (loading time is
  charged as GPU-hours and energy, and reported apart as switch_usd).
- cost (owned basis) = every GPU of the site for the whole horizon x amortized rate + energy.
- energy = site IT power (W) x PUE x hours x the price of the hour it is drawn in ($/MWh / 1000).
- gp_per_dollar = sla_met / cost_usd; tokens_sla_met_per_dollar = output tokens of SLA-met requests / cost.
The horizon is the window plus its drain.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import polars as pl

from schemas.cost import CostConfig, energy_cost_usd, gpu_cost_owned_usd, gpu_cost_rented_usd
from schemas.protocol import CLASSES
from streams.replay.driver import RunResult
from worldmodel.groundtruth.observe import met
from worldmodel.groundtruth.state import TEL_DT

PROVENANCE = {
    "offered": "trace-derived",
    "completed": "modeled",
    "sla_met": "modeled",
    "sla_violation_rate": "modeled",
    "unfinished": "modeled",
    "ttft_p99_ms": "modeled",
    "tpot_p99_ms": "modeled",
    "gpu_hours": "modeled",
    "energy_mwh": "benchmark-calibrated + modeled (power curve, PUE)",
    "cost_usd": "modeled (rental rates) x trace-derived prices",
    "cost_usd_owned": "modeled (amortized price)",
    "gp_per_dollar": "modeled",
    "gp_per_dollar_owned": "modeled",
    "tokens_sla_met_per_dollar": "modeled",
    "energy_share": "modeled",
    "window.mean_price_usd_mwh": "trace-derived",
}


def hourly_price(prices: pl.DataFrame, start_ts: float, t_s: np.ndarray) -> np.ndarray:
    """Realized price ($/MWh) of the hour each instant (s after the UTC epoch second start_ts) falls in."""
    prices = prices.sort("interval_start")
    starts = prices["interval_start"].dt.epoch("us").to_numpy() / 1e6
    values = prices["lmp_usd_mwh"].to_numpy()
    ts = start_ts + t_s
    idx = np.searchsorted(starts, ts, side="right") - 1
    if (idx < 0).any():
        raise ValueError("a simulated instant precedes the price series")
    ends = prices["interval_end"].dt.epoch("us").to_numpy() / 1e6
    if (ts >= ends[idx]).any():
        raise ValueError("a simulated instant falls in a price gap; choose another window")
    return values[idx]


def site_row_prices(run: RunResult) -> np.ndarray:
    """Price ($/MWh) of each 10 s site accounting row: its site's market, the hour the energy was drawn in."""
    logs = run.runtime.logs
    n = int(logs.n_site[0])
    t_mid = logs.site_t[:n] - TEL_DT / 2
    site = logs.site_idx[:n]
    out = np.empty(n)
    start_ts = run.workload.window.start.timestamp()
    for s, prices in enumerate(run.site_prices):
        mask = site == s
        out[mask] = hourly_price(prices, start_ts, t_mid[mask])
    return out


def request_outcomes(run: RunResult) -> dict[str, np.ndarray]:
    """Per-request arrays: class, ttft_s, tpot_s, done flag, sla_met, output tokens."""
    req = run.runtime.req
    ttft = req.first - req.arrival
    tpot = np.where(req.out > 1, (req.done - req.first) / np.maximum(req.out - 1, 1), 0.0)
    sla = met(req.cls, ttft, tpot, req.done, req.deadline, run.runtime.slo_ttft_s, run.runtime.slo_tpot_s)
    return {
        "cls": req.cls,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "done": ~np.isnan(req.done),
        "sla_met": sla,
        "out": req.out,
    }


def _p99_ms(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, 99) * 1000.0) if x.size else None


def summarize(run: RunResult, cost: CostConfig | None = None) -> dict[str, Any]:
    """results.json figures of one run (see the module docstring for definitions)."""
    cost = cost or CostConfig()
    logs = run.runtime.logs
    o = request_outcomes(run)
    n_site = int(logs.n_site[0])
    it_kw = logs.site_it_w[:n_site] / 1000.0
    hours = TEL_DT / 3600.0
    price = site_row_prices(run)
    energy_usd = energy_cost_usd(it_kw, hours, price, cost)
    energy_mwh = float((it_kw * cost.pue.value * hours).sum() / 1000.0)
    gpu_hours = _gpu_hours_by_type(run)
    loading_hours = float(logs.site_gpus_loading[:n_site].sum() * hours)
    gpu_usd = gpu_cost_rented_usd(gpu_hours, cost)
    horizon_h = run.end_s / 3600.0
    owned_usd = gpu_cost_owned_usd(fleet_gpus(run), horizon_h, cost)
    total = gpu_usd + energy_usd
    total_owned = owned_usd + energy_usd
    if total <= 0 or total_owned <= 0:
        raise AssertionError(
            f"operator cost must stay positive (rented {total:.2f}, owned {total_owned:.2f})"
        )
    switch_usd = loading_hours * _mean_rate(gpu_hours, cost)
    offered = int(o["cls"].shape[0])
    sla_met = int(o["sla_met"].sum())
    completed = int(o["done"].sum())
    tokens = float(o["out"][o["sla_met"]].sum())
    classes = {}
    for k, name in enumerate(CLASSES):
        m = o["cls"] == k
        n = int(m.sum())
        if n == 0:
            continue
        classes[name] = {
            "offered": n,
            "completed": int(o["done"][m].sum()),
            "sla_met": int(o["sla_met"][m].sum()),
            "unfinished": int(n - o["done"][m].sum()),
            "sla_violation_rate": float((n - o["sla_met"][m].sum()) / n),
            "ttft_p99_ms": _p99_ms(o["ttft_s"][m]),
            "tpot_p99_ms": _p99_ms(o["tpot_s"][m]),
        }
    interactive = o["cls"] != 2
    return {
        "offered": offered,
        "completed": completed,
        "sla_met": sla_met,
        "unfinished": offered - completed,
        "sla_violation_rate": (offered - sla_met) / offered if offered else 0.0,
        "gp_per_dollar": sla_met / total,
        "tokens_sla_met_per_dollar": tokens / total,
        "cost_usd": total,
        "cost_usd_owned": total_owned,
        "gp_per_dollar_owned": sla_met / total_owned,
        "gpu_cost_usd": gpu_usd,
        "energy_cost_usd": energy_usd,
        "switch_usd": switch_usd,
        "energy_mwh": energy_mwh,
        "energy_share": energy_usd / total,
        "energy_share_owned": energy_usd / total_owned,
        "gpu_hours": float(sum(gpu_hours.values())),
        "gpu_hours_by_type": gpu_hours,
        "ttft_p99_ms": _p99_ms(o["ttft_s"][interactive]),
        "tpot_p99_ms": _p99_ms(o["tpot_s"][interactive]),
        "horizon_h": horizon_h,
        "classes": classes,
        "wall_s": run.wall_s,
    }


def _gpu_hours_by_type(run: RunResult) -> dict[str, float]:
    """Warm or loading GPU-hours per GPU type, from the telemetry the simulator emitted."""
    rt, logs = run.runtime, run.runtime.logs
    n = int(logs.n_tel[0])
    pool = rt.rep.pool[logs.tel_rep[:n]]
    gpus = rt.pools.tp[pool] * TEL_DT / 3600.0
    out = {}
    for p, (_, _, g) in enumerate(rt.pool_keys):
        out[g] = out.get(g, 0.0) + float(gpus[pool == p].sum())
    return out


def _mean_rate(gpu_hours: dict[str, float], cost: CostConfig) -> float:
    total = sum(gpu_hours.values())
    if total == 0:
        return 0.0
    return gpu_cost_rented_usd(gpu_hours, cost) / total


def per_period(run: RunResult, period_s: float = 300.0) -> pl.DataFrame:
    """Per-period aggregates for replay.duckdb: arrivals, completions, SLA met, energy, GPU-hours, price."""
    rt, logs = run.runtime, run.runtime.logs
    o = request_outcomes(run)
    req = rt.req
    k_arr = (req.arrival // period_s).astype(np.int64)
    n_site = int(logs.n_site[0])
    site_t = logs.site_t[:n_site]
    k_site = ((site_t - 1e-9) // period_s).astype(np.int64)
    n_periods = int(max(k_site.max(initial=0), k_arr.max(initial=0))) + 1
    it_kwh = logs.site_it_w[:n_site] * TEL_DT / 3.6e6
    price = site_row_prices(run)
    start = run.workload.window.start
    return pl.DataFrame(
        {
            "market": run.market,
            "policy": run.policy,
            "seed": run.seed,
            "period": np.arange(n_periods),
            "period_start": [start + timedelta(seconds=k * period_s) for k in range(n_periods)],
            "arrivals": np.bincount(k_arr, minlength=n_periods),
            "sla_met": np.bincount(k_arr, weights=o["sla_met"].astype(float), minlength=n_periods),
            "it_energy_kwh": np.bincount(k_site, weights=it_kwh, minlength=n_periods),
            "gpus_mean": np.bincount(k_site, weights=logs.site_gpus[:n_site], minlength=n_periods)
            / np.maximum(np.bincount(k_site, minlength=n_periods) / len(rt.sites), 1),
            "price_usd_mwh": np.bincount(k_site, weights=price, minlength=n_periods)
            / np.maximum(np.bincount(k_site, minlength=n_periods), 1),
        }
    )


def period_costs(run: RunResult, period_s: float = 300.0, cost: CostConfig | None = None) -> pl.DataFrame:
    """Per-period energy and rented cost, on the same 10 s site ticks and prices as :func:`summarize`.

    A tick at t belongs to the period containing (t - 10 s, t]; summed over periods the columns equal
    summarize's ``energy_mwh`` x 1000, ``energy_cost_usd``, ``gpu_hours_by_type`` and ``cost_usd``.

    Returns
    -------
    Frame with period, energy_kwh (site IT energy x PUE, kWh), energy_usd ($), gpu_hours_<type> (GPU-h of
    warm or loading GPUs), gpu_usd ($, rented) and cost_usd ($, rented basis).
    """
    cost = cost or CostConfig()
    rt, logs = run.runtime, run.runtime.logs
    n_site = int(logs.n_site[0])
    site_t = logs.site_t[:n_site]
    k_site = ((site_t - 1e-9) // period_s).astype(np.int64)
    n_tel = int(logs.n_tel[0])
    k_tel = ((logs.tel_t[:n_tel] - 1e-9) // period_s).astype(np.int64)
    n = int(max(k_site.max(initial=-1), k_tel.max(initial=-1))) + 1
    kwh = logs.site_it_w[:n_site] * TEL_DT / 3.6e6 * cost.pue.value
    usd = kwh * site_row_prices(run) / 1000.0
    out: dict[str, Any] = {
        "period": np.arange(n),
        "energy_kwh": np.bincount(k_site, weights=kwh, minlength=n),
        "energy_usd": np.bincount(k_site, weights=usd, minlength=n),
    }
    pool = rt.rep.pool[logs.tel_rep[:n_tel]]
    gpu_h = rt.pools.tp[pool] * TEL_DT / 3600.0
    gpu_usd = np.zeros(n)
    for g in sorted({g for _, _, g in rt.pool_keys}):
        mask = np.isin(pool, [p for p, (_, _, gg) in enumerate(rt.pool_keys) if gg == g])
        out[f"gpu_hours_{g}"] = np.bincount(k_tel[mask], weights=gpu_h[mask], minlength=n)
        gpu_usd += out[f"gpu_hours_{g}"] * cost.rented_usd_per_gpu_h[g].value
    out["gpu_usd"] = gpu_usd
    out["cost_usd"] = gpu_usd + out["energy_usd"]
    return pl.DataFrame(out)


def fleet_gpus(run: RunResult) -> dict[str, int]:
    """GPUs of each type in the run's site inventory (the owned basis charges all of them)."""
    out: dict[str, int] = {}
    for site in run.runtime.sites:
        for g in site.groups:
            out[str(g.gpu)] = out.get(str(g.gpu), 0) + g.nodes * 8
    return out


def cost_between(run: RunResult, t_lo: float, t_hi: float, cost: CostConfig | None = None) -> dict[str, float]:
    """Cost of the interval (t_lo, t_hi] (s since window start) of a run, on both bases, as :func:`summarize`
    charges it: the 10 s site and telemetry rows whose tick falls in the interval (a tick at t covers
    (t - 10 s, t]), the same prices, rental rates and amortization. Used by the counterfactual branches
    (streams/replay/branching.py), which cost a branch from its fork point on.

    Returns
    -------
    gpu_hours, energy_mwh, gpu_usd, energy_usd, cost_usd (rented: GPU-hours x rate + energy) and
    cost_usd_owned (every inventory GPU for t_hi - t_lo at the amortized rate + energy).
    """
    cost = cost or CostConfig()
    rt, logs = run.runtime, run.runtime.logs
    hours = TEL_DT / 3600.0
    n_site = int(logs.n_site[0])
    site_t = logs.site_t[:n_site]
    s_in = (site_t > t_lo) & (site_t <= t_hi)
    it_kw = logs.site_it_w[:n_site][s_in] / 1000.0
    energy_usd = energy_cost_usd(it_kw, hours, site_row_prices(run)[s_in], cost)
    n_tel = int(logs.n_tel[0])
    tel_t = logs.tel_t[:n_tel]
    t_in = (tel_t > t_lo) & (tel_t <= t_hi)
    pool = rt.rep.pool[logs.tel_rep[:n_tel][t_in]]
    gpus = rt.pools.tp[pool] * hours
    gpu_hours: dict[str, float] = {}
    for p, (_, _, g) in enumerate(rt.pool_keys):
        gpu_hours[g] = gpu_hours.get(g, 0.0) + float(gpus[pool == p].sum())
    gpu_usd = gpu_cost_rented_usd(gpu_hours, cost)
    owned_usd = gpu_cost_owned_usd(fleet_gpus(run), (t_hi - t_lo) / 3600.0, cost)
    return {
        "gpu_hours": float(sum(gpu_hours.values())),
        "energy_mwh": float((it_kw * cost.pue.value * hours).sum() / 1000.0),
        "gpu_usd": gpu_usd,
        "energy_usd": energy_usd,
        "cost_usd": gpu_usd + energy_usd,
        "cost_usd_owned": owned_usd + energy_usd,
    }
