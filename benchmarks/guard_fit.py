"""Choose the scale-up guard's constants (optimizer/scale_guard.py) on the week-before hours, not the windows.

For each market and seed it builds the hours one week before the default window of `--year` (streams/replay/tuning.py
`week_before`: the data production-tuned tunes on), or with `--source window` that year's default windows
themselves (for a year other than the one replayed: 2022), and replays production's plan on the ground truth, as
deployed and with each guard setting of the grid (step x growth x target x backlog) applied at every period
boundary from the live replicas (warm + loading) and the waiting sequences of the run's last minute. Every replay
is repeated on `--replicates` noise replicates (arrivals shifted by under 1 ms, streams/replay/branching.py): a
whole window's gp/$ moves several % with the event order alone, so each setting's difference against production
is paired on the same replicate and averaged.

With `--engine tuned` the guarded plan is the one the aurelius arms guard: production's plan at the week-before
search's engine settings (streams/replay/tuning.py `tune_static`, the search production-tuned runs: weights, KV
dtype, chunked-prefill token budget, and the SM clock share it prices best at each period's published price,
optimizer/clock_price.py), and production-tuned (the searched configuration) is a reference beside production and
naive. The search measures on the week before's first 15 minutes (4 draws), the fit on its 3 hours and noise
replicates, so production-tuned is in-sample there: a fit that must not be worse than it is a conservative one.
With `--engine tuned-policy` the guarded plan is production-tuned's own (the searched configuration with its batch
cap and its price rule for deferrable work, the clock repriced per period as the arms do, `at_clock`): the plan the
aurelius arms guard (optimizer/wiring.py `TUNED_REFERENCE`).

Per market and setting it prints the mean rented and owned gp/$ difference against production and each class's
violation-rate difference (pp), and the naive reference's (a static fleet, replayed on the same hours: on the owned
basis, where holding capacity costs only its energy, it can be the strongest reference); the chosen setting has the
highest mean gain over the markets on `--basis` (rented by default, or owned) among those no class of which is worse
than the strongest reference's on that basis (production's, or naive's where naive makes more) by more than
`--slack-pp` in any market.

    python benchmarks/guard_fit.py --out benchmarks/results/guard_fit_week_before.json
    python benchmarks/guard_fit.py --year 2022 --source window --out benchmarks/results/guard_fit_2022_windows.json
    python benchmarks/guard_fit.py --engine tuned --backlogs 0 --out benchmarks/results/guard_fit_week_before_tuned.json
    python benchmarks/guard_fit.py --engine tuned-policy --backlogs 0 --growths 1 --steps 1 --targets 0.65,0.7,0.75,0.8
    python benchmarks/guard_fit.py --engine tuned-policy --markets ERCOT --all-sites --backlogs 0 --growths 1 --steps 1

Runs the ground truth: a measurement tool, never imported by the planner.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np

from optimizer.baselines.tuned import TunedProductionPolicy, with_clock_share, with_precision, with_token_budget
from optimizer.registry import create
from optimizer.scale_guard import ENERGY_RULES, GuardInputs, ScaleGuard, priced_target
from schemas.cost import COST_BASES, energy_breakeven_usd_mwh
from schemas.fleet import MARKETS, FleetSpec, default_fleet
from streams.replay import memo
from streams.replay.branching import live_replicas, noise_shifts
from streams.replay.driver import run_replay
from streams.replay.metrics import summarize
from streams.replay.tuning import Tuning, week_before
from streams.workload.builder import Workload, build_workload
from streams.workload.residency import with_residency
from worldmodel.groundtruth.runtime import Physics

CLASSES = ("code", "chat", "batch")
#: the setting name of the naive reference's rows (a static fleet at mean load: the strongest owned reference
#: wherever holding the fleet costs little)
NAIVE = "naive"
#: the setting name of production-tuned's rows (`--engine tuned`: the week-before search's configuration)
TUNED = "production-tuned"
#: the rows that are references, never chosen: the strongest on the basis is the bound on every class
REFERENCES = (NAIVE, TUNED)


def _noisy(wl: Workload, r: int) -> Workload:
    """`wl` with every arrival shifted later by a noise replicate's shifts of seed `r` (0: as recorded;
    streams/replay/branching.noise_shifts, as the branches shift the runtime's arrivals)."""
    if r == 0:
        return wl
    import polars as pl

    arr = wl.requests["arrival_s"].to_numpy()
    return replace(wl, requests=wl.requests.with_columns(pl.Series("arrival_s", arr + noise_shifts(arr.shape[0], r))))


def waiting(run: Any, window_s: float = 60.0) -> dict[tuple[str, str, str], float]:
    """Per pool, the sequences waiting over the run's last `window_s` s of telemetry (count: each replica's mean,
    summed), what the world model's snapshot reads from the same records (optimizer.world_adapter `waiting`)."""
    rt, logs = run.runtime, run.runtime.logs
    n = int(logs.n_tel[0])
    if n == 0:
        return {}
    t = logs.tel_t[:n]
    recent = t > t.max() - window_s
    reps, w = logs.tel_rep[:n][recent], logs.tel_waiting[:n][recent].astype(float)
    per_rep = np.bincount(reps, weights=w, minlength=rt.rep.pool.shape[0])
    ticks = np.bincount(reps, minlength=rt.rep.pool.shape[0])
    mean = np.divide(per_rep, ticks, out=np.zeros_like(per_rep), where=ticks > 0)
    sums = np.bincount(rt.rep.pool, weights=mean, minlength=len(rt.pool_keys))
    return {key: float(sums[p]) for p, key in enumerate(rt.pool_keys)}


def period_prices(wl: Workload, period_s: float = 300.0) -> list[float | None]:
    """Per period of `wl` (and 24 h of drain), its hour's published (day-ahead) price ($/MWh; None: none
    published), as the planner's forecast carries it at the period's decision."""
    p = wl.prices.sort("interval_start")
    starts, prices = p["interval_start"].to_list(), p["lmp_usd_mwh"].to_list()
    n = int(np.ceil(wl.requests["arrival_s"].max() / period_s)) + 1 if wl.requests.height else 0
    out: list[float | None] = []
    for k in range(n + 24 * 12):
        t = wl.window.start + timedelta(seconds=k * period_s)
        now = [v for s, v in zip(starts, prices, strict=True) if s <= t < s + timedelta(hours=1)]
        out.append(now[-1] if now else None)
    return out


def at_engine(plan: Any, tuning: Tuning, price_usd_mwh: float | None) -> Any:
    """`plan` at the week-before search's engine settings, as the aurelius arms run their reference's
    (optimizer/aurelius.py `_at_reference_engine`, `_at_reference_clock`): weights, KV dtype, token budget, and
    the clock share priced best at `price_usd_mwh` ($/MWh; None: none published, the full clock)."""
    cfg = tuning.config
    plan = with_token_budget(with_precision(plan, cfg.precision, cfg.kv_dtype), cfg.max_num_batched_tokens)
    return at_clock(plan, tuning, price_usd_mwh)


def at_clock(plan: Any, tuning: Tuning, price_usd_mwh: float | None) -> Any:
    """`plan` at the clock share the search's clock axis prices best at `price_usd_mwh` ($/MWh; None: none
    published, or no clock axis: `plan` as it is), as the aurelius arms reprice their reference's clock."""
    if tuning.clock is None or price_usd_mwh is None:
        return plan
    share = tuning.clock.share_at(price_usd_mwh)
    return plan if share >= 1.0 else with_clock_share(plan, share)


def _figures(wl: Workload, initial: dict, guard: ScaleGuard | None, physics: Physics,
             energy_target: float | None = None, rule: str = "step", tuning: Tuning | None = None,
             base: str = "production", fleet: FleetSpec | None = None, all_sites: bool = False) -> dict[str, float]:
    """One replay of `base`'s plan (production's, or TUNED's) under `guard` (production's at `tuning`'s engine
    settings when given, `at_engine`; TUNED's at its clock repriced, `at_clock`); with
    `energy_target`, the guard's target moves from its own to that one with each period's price against the fleet's
    energy break-even (`schemas.cost.energy_breakeven_usd_mwh`) by `rule` (optimizer/scale_guard.priced_target);
    on `fleet` (None: the default fleet), every site serving (`all_sites`, the three-site mode) or the workload's."""
    fleet = fleet or default_fleet()
    prices = period_prices(wl) if energy_target is not None or tuning is not None else []
    breakeven = energy_breakeven_usd_mwh(fleet.gpus_by_type())

    def intercept(k: int, run: Any, plan: Any) -> Any:
        if tuning is not None:
            price = prices[min(k, len(prices) - 1)]
            plan = at_clock(plan, tuning, price) if base == TUNED else at_engine(plan, tuning, price)
        if guard is None:
            return plan
        inputs = GuardInputs(live_replicas(run), {}, waiting(run))
        if not prices or guard.target is None or energy_target is None:
            return guard.apply(plan, inputs)
        share = replace(inputs, price_usd_mwh=prices[min(k, len(prices) - 1)], breakeven_usd_mwh=breakeven)
        target = priced_target(guard.target, energy_target, share.energy_share, rule)
        return replace(guard, target=target).apply(plan, inputs)

    return _replayed(wl, base, initial, physics, intercept, tuning=tuning, fleet=fleet, all_sites=all_sites)


def _replayed(wl: Workload, policy: str, initial: dict, physics: Physics, intercept: Any = None,
              tuning: Tuning | None = None, fleet: FleetSpec | None = None, all_sites: bool = False) \
        -> dict[str, float]:
    """gp/$ on both bases and each class's violation rate (%) of one replay of `policy` (a registry name; TUNED
    runs `tuning`'s configuration) on `fleet` (None: the default fleet; `all_sites`: every site serves, the
    three-site mode) from `initial`, each plan through `intercept` when given."""
    pol = TunedProductionPolicy(config=tuning.config) if policy == TUNED and tuning is not None else create(policy)
    run = run_replay(wl, pol, fleet or default_fleet(), period_s=300.0, physics=physics, initial_replicas=initial,
                     intercept=intercept, all_sites=all_sites)  # fmt: skip
    s = summarize(run)
    out = {"gp": s["gp_per_dollar"], "gp_owned": s["gp_per_dollar_owned"]}
    for c in CLASSES:
        out[c] = s["classes"].get(c, {}).get("sla_violation_rate", 0.0) * 100.0
    return out


def job_fleet(market: str, all_sites: bool) -> FleetSpec:
    """The fleet `aurelius replay` runs the job on: one site per market in the default order, or in the three-site
    mode (`all_sites`) the job's market first (`--markets MARKET,...`, the site whose window is replayed).

    >>> [s.region for s in job_fleet("ERCOT", True).sites] == [s.region for s in default_fleet(("ERCOT", "PJM",
    ...                                                                                           "CAISO")).sites]
    True
    """
    if not all_sites:
        return default_fleet()
    return default_fleet((market, *(s.market for s in default_fleet().sites if s.market != market)))


def searched(market: str, window_start: Any, seed: int, physics: Physics, all_sites: bool = False) -> Tuning:
    """The week-before search of the replay's job (`memo.tuning` with the replay's defaults: the same cache entry
    as `aurelius replay`'s)."""
    return memo.tuning(market, window_start, job_fleet(market, all_sites), seed=seed, physics=physics,
                       all_sites=all_sites)


def _label(market: str, rule: str, all_sites: bool) -> str:
    """A job's row label: the market, its window rule unless "max", "three-site" in that mode.

    >>> _label("PJM", "max", False), _label("CAISO", "median", False), _label("ERCOT", "max", True)
    ('PJM', 'CAISO/median', 'ERCOT/three-site')
    """
    return (market if rule == "max" else f"{market}/{rule}") + ("/three-site" if all_sites else "")


def measure(job: tuple[str, int, int, int, list[tuple[int, float, float, int]], int, str, str, str, bool]) \
        -> list[dict[str, Any]]:
    """Every setting of the grid (and production, setting None) on one market and seed's week-before hours (or
    window, `source` "window") of the year's window chosen by `rule` ("max" or "median", streams/workload); with
    `engine` "tuned" at the week-before search's engine settings, production-tuned beside (module docstring); with
    `all_sites` the three-site mode's (one shared workload with residency, every site's fleet)."""
    market, seed, periods, replicates, grid, year, source, rule, engine, all_sites = job
    physics = Physics()
    fleet = job_fleet(market, all_sites)
    window_start = build_workload(market, year, rule=rule, periods=1, seed=seed).window.start
    tuning = searched(market, window_start, seed, physics, all_sites) if engine != "deployed" else None
    if source == "window":
        wl = build_workload(market, year, rule=rule, periods=periods, seed=seed)
        if all_sites:
            wl = with_residency(wl, fleet, market, seed=seed)
        initial = memo.lead_in(market, wl.window.start, fleet, seed=seed, physics=physics, all_sites=all_sites)
    else:
        wl, initial = week_before(market, window_start, fleet, seed=seed, physics=physics, periods=periods,
                                  all_sites=all_sites)  # fmt: skip
    rows = []
    label = _label(market, rule, all_sites)
    for r in range(1, replicates + 1):
        noisy = _noisy(wl, r)
        for ref in REFERENCES if tuning is not None else (NAIVE,):
            rows.append({"market": label, "seed": seed, "replicate": r, "setting": ref,
                         **_replayed(noisy, ref, initial, physics, tuning=tuning, fleet=fleet,
                                     all_sites=all_sites)})  # fmt: skip
        for setting in [None, *grid]:
            guard = None if setting is None else ScaleGuard(step=setting[0], growth=setting[1], target=setting[2],
                                                            backlog=bool(setting[3]))
            energy, rule = setting[4:6] if setting is not None and len(setting) > 4 else (None, "step")
            rows.append({"market": label, "seed": seed, "replicate": r, "setting": setting,
                         **_figures(noisy, initial, guard, physics, energy, rule,
                                    tuning if setting is not None else None,
                                    TUNED if engine == "tuned-policy" and setting is not None
                                    else "production", fleet, all_sites)})  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per setting and market: mean paired differences against production (ratio for gp/$, pp for classes)."""
    base = {(r["market"], r["seed"], r["replicate"]): r for r in rows if r["setting"] is None}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for r in rows:
        if r["setting"] is None:
            continue
        b = base[(r["market"], r["seed"], r["replicate"])]
        d = {"gp": r["gp"] / b["gp"] - 1.0, "gp_owned": r["gp_owned"] / b["gp_owned"] - 1.0,
             **{c: r[c] - b[c] for c in CLASSES}}  # fmt: skip
        out.setdefault(_name(r["setting"]), {}).setdefault(r["market"], []).append(d)  # type: ignore[arg-type]
    return {s: {m: {k: float(np.mean([d[k] for d in ds])) for k in ds[0]} for m, ds in by.items()}
            for s, by in out.items()}  # fmt: skip


def choose(tab: dict[str, dict[str, dict[str, float]]], slack_pp: float, basis: str = "rented") -> str | None:
    """The setting with the highest mean gain over the markets on `basis` ("rented" or "owned"), no class worse
    by more than `slack_pp` than the strongest reference's on that basis in any market (production's, or naive's or
    production-tuned's where it makes more on `basis`; the references are never chosen).

    >>> tab = {"naive": {"PJM": {"gp": -0.4, "gp_owned": 0.09, "code": -2.4, "chat": -14.3, "batch": 0.0}},
    ...        "a": {"PJM": {"gp": 0.17, "gp_owned": 0.11, "code": -1.1, "chat": -15.7, "batch": 0.0}},
    ...        "b": {"PJM": {"gp": -0.14, "gp_owned": 0.13, "code": -2.6, "chat": -18.9, "batch": 0.0}}}
    >>> choose(tab, 0.1, "rented"), choose(tab, 0.1, "owned")  # owned: naive is the strongest, "a" breaks its code
    ('a', 'b')
    >>> tab["production-tuned"] = {"PJM": {"gp": 0.1, "gp_owned": 0.0, "code": -1.5, "chat": -16.0, "batch": 0.0}}
    >>> choose(tab, 0.1, "rented")  # production-tuned is the strongest rented: "a" is 0.3 pp worse on chat
    'b'
    """
    key = "gp" if basis == "rented" else "gp_owned"
    zero = dict.fromkeys(("gp", "gp_owned", *CLASSES), 0.0)

    def strongest(market: str) -> dict[str, float]:  # production's row is all zeros (the differences' base)
        rows = [tab[ref][market] for ref in REFERENCES if market in tab.get(ref, {})]
        return max([zero, *rows], key=lambda v: v[key])

    ok = {s: float(np.mean([v[key] for v in by.values()])) for s, by in tab.items() if s not in REFERENCES
          and all(v[c] - strongest(m)[c] <= slack_pp for m, v in by.items() for c in CLASSES)}  # fmt: skip
    return max(ok, key=ok.__getitem__) if ok else None


def _name(setting: tuple[int, float, float, int] | tuple[int, float, float, int, float, str] | list | str) -> str:
    if isinstance(setting, str):
        return setting
    step, growth, target, backlog = setting[:4]
    name = f"step{step}-growth{growth:g}-target{target:g}" + ("-backlog" if backlog else "")
    if len(setting) <= 4:
        return name
    return name + (f"-above-breakeven{setting[4]:g}" if setting[5] == "step" else f"-to{setting[4]:g}-by-price")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markets", default=",".join(MARKETS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--year", type=int, default=2023, help="the year whose default windows (or week before) fit")
    ap.add_argument("--source", choices=("week-before", "window"), default="week-before",
                    help="the week before each default window, or the window itself (another year's)")
    ap.add_argument("--window-rules", default="max", help="comma-separated window rules whose week before (or "
                    "window) fits: max (the default windows), median; rows of a rule other than max are keyed "
                    "MARKET/RULE, each a market of the choice")
    ap.add_argument("--periods", type=int, default=36, help="periods of the fitted window (count)")
    ap.add_argument("--replicates", type=int, default=3, help="noise replicates per replay (count)")
    ap.add_argument("--steps", default="1,2")
    ap.add_argument("--growths", default="1.0,1.5")
    ap.add_argument("--targets", default="0.6,0.7,0.8")
    ap.add_argument("--backlogs", default="0,1", help="the backlog term off (0) and on (1)")
    ap.add_argument("--energy-targets", default="",
                    help="also each setting with its target replaced by each of these as the period's price reaches "
                         "the fleet's energy break-even (schemas.cost.energy_breakeven_usd_mwh), by each rule")
    ap.add_argument("--energy-rules", default="step", help="comma-separated rules (optimizer/scale_guard."
                    f"ENERGY_RULES: {', '.join(ENERGY_RULES)}) by which an energy target replaces the setting's")
    ap.add_argument("--engine", choices=("deployed", "tuned", "tuned-policy"), default="deployed",
                    help="guard production's plan as deployed, at the week-before search's engine settings, or "
                         "production-tuned's own plan as the aurelius arms do; production-tuned a reference "
                         "beside the last two (module docstring)")
    ap.add_argument("--all-sites", action="store_true", help="the three-site mode: one shared workload of each "
                    "market's week before (or window) with residency, served by every site's fleet, that market's "
                    "site first, as `aurelius replay --sites three --markets MARKET,...` runs it")
    ap.add_argument("--basis", choices=COST_BASES, default="rented", help="the cost basis the setting is chosen on")
    ap.add_argument("--slack-pp", type=float, default=0.1, help="a class may be worse than production's by (pp)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    grid = list(itertools.product([int(s) for s in args.steps.split(",")], [float(g) for g in args.growths.split(",")],
                                  [float(t) for t in args.targets.split(",")],
                                  [int(b) for b in args.backlogs.split(",")]))  # fmt: skip
    grid += [(*g, float(e), rule) for g in list(grid) for e in args.energy_targets.split(",") if e
             for rule in args.energy_rules.split(",")]  # fmt: skip
    rules = args.window_rules.split(",")
    jobs = [(m, int(s), args.periods, args.replicates, grid, args.year, args.source, rule, args.engine,
             args.all_sites)
            for rule in rules for m in args.markets.split(",") for s in args.seeds.split(",")]  # fmt: skip
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = [r for rs in ex.map(measure, jobs) for r in rs]
    tab = table(rows)
    markets = [_label(m, rule, args.all_sites) for rule in rules for m in args.markets.split(",")]
    print(f"{'setting':<44}" + "".join(f"{m + ' gp':>14}{'own':>7}{'chat':>7}{'code':>7}" for m in markets))
    for s, by in tab.items():
        print(f"{s:<44}" + "".join(f"{by[m]['gp'] * 100:>+13.1f}%{by[m]['gp_owned'] * 100:>+6.1f}%"
                                   f"{by[m]['chat']:>+7.2f}{by[m]['code']:>+7.2f}" for m in markets))  # fmt: skip
    chosen = choose(tab, args.slack_pp, args.basis)
    print(f"chosen ({args.basis}): {chosen} ({time.perf_counter() - t0:.0f} s)")
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "config": vars(args), "chosen": chosen, "table": tab, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
