"""How much of the week-before tuning is the sample: the same search on other draws of the same hours.

`production-tuned` and the aurelius arms' engine settings and clock come from one 15-minute measurement of the
week before (streams/replay/tuning.py, `TUNE_PERIODS` periods of one workload draw). This runs the same search on
R draws of those hours (workload seeds `seed + DRAW_STRIDE x r`; r = 0 is the draw the replay of the window tunes on)
and prints, per draw, the configuration chosen and the clock share the aurelius arms would run at the window's
mean price (`ClockPrices.share_at`). On every draw it also measures draw 0's configuration at each clock share
and the deployed one, and averages them over the draws: per share, mean gp/$ (and its sd over the draws), mean
class violation rates, and the tuning's SLA gate on the means (every class within 0.1 pp of the deployed
configuration's mean). A search whose choice moves from draw to draw is measuring the draw's bursts.

    python benchmarks/tuning_noise.py --markets ERCOT --year 2024 --seeds 0 --draws 4 \
        --out benchmarks/results/tuning_noise.json

Runs the ground truth: a measurement tool, never imported by the planner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import Any

import numpy as np

from optimizer.baselines.tuned import DEPLOYED, StaticConfig
from schemas.fleet import MARKETS, default_fleet
from streams.replay.tuning import AXES, DRAW_STRIDE, SLA_SLACK, measure_config, tune_on, week_before
from streams.workload.builder import build_workload
from worldmodel.groundtruth.runtime import Physics

#: the clock shares the search measures
SHARES: tuple[float, ...] = tuple(float(v) for v in dict(AXES)["clock_share"])  # type: ignore[arg-type]


def draws(market: str, year: int, rule: str, seed: int, n: int) -> dict[str, Any]:
    """The tuning on `n` draws of the week before `market`'s window (module docstring)."""
    fleet, physics = default_fleet(), Physics()
    window = build_workload(market, year, rule=rule, periods=1, seed=seed).window
    rows: list[dict[str, Any]] = []
    first: StaticConfig | None = None
    for r in range(n):
        t0 = time.perf_counter()
        wl, initial = week_before(market, window.start, fleet, seed=seed + DRAW_STRIDE * r, physics=physics)
        tuning = tune_on([(wl, initial)], fleet, window.start - timedelta(days=7), physics=physics)
        first = first or tuning.config
        searched = {json.dumps(m["config"], sort_keys=True): m for m in tuning.table}

        def measured(cfg: StaticConfig) -> dict[str, Any]:  # the search's own row where it ran `cfg` on this draw
            key = json.dumps(cfg.as_dict(), sort_keys=True)
            return searched.get(key) or measure_config(cfg, wl, initial, fleet, physics=physics)  # noqa: B023

        rows.append({"draw": r, "config": tuning.config.as_dict(),
                     "clock_at_window_price": tuning.clock.share_at(window.mean_price_usd_mwh) if tuning.clock
                     else None, "first_config_by_clock": {str(s): measured(replace(first, clock_share=s))
                                                          for s in SHARES},
                     "deployed": measured(DEPLOYED), "wall_s": time.perf_counter() - t0})  # fmt: skip
        print(f"{market} seed {seed} draw {r}: {tuning.config.as_dict()}, clock at the window's price "
              f"{rows[-1]['clock_at_window_price']} ({rows[-1]['wall_s']:.0f} s)", flush=True)
    return {"market": market, "year": year, "rule": rule, "seed": seed,
            "window_price_usd_mwh": window.mean_price_usd_mwh, "draws": rows, "summary": summarize(rows)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How often each configuration is chosen, and draw 0's configuration per clock share averaged over the draws
    (mean gp/$, its sd, mean violation rates, the gate on the means against the deployed configuration's).

    >>> def m(gp, chat):
    ...     return {"gp_per_dollar": gp, "violation": {"chat": chat}}
    >>> rows = [{"config": {"clock_share": 1.0}, "deployed": m(5.0, 0.10),
    ...          "first_config_by_clock": {"1.0": m(10.0, 0.05), "0.7": m(12.0, 0.02)}},
    ...         {"config": {"clock_share": 0.7}, "deployed": m(5.0, 0.12),
    ...          "first_config_by_clock": {"1.0": m(12.0, 0.05), "0.7": m(8.0, 0.30)}}]
    >>> s = summarize(rows)
    >>> len(s["chosen"]), s["by_clock"]["0.7"]["within_sla"], s["by_clock"]["1.0"]["gp_per_dollar"]
    (2, False, 11.0)
    """
    chosen = Counter(json.dumps(r["config"], sort_keys=True) for r in rows)
    base = {c: float(np.mean([r["deployed"]["violation"][c] for r in rows])) for c in rows[0]["deployed"]["violation"]}
    out: dict[str, Any] = {}
    for s in rows[0]["first_config_by_clock"]:
        have = [r["first_config_by_clock"][s] for r in rows]
        viol = {c: float(np.mean([h["violation"][c] for h in have])) for c in have[0]["violation"]}
        gp = [h["gp_per_dollar"] for h in have]
        out[s] = {"gp_per_dollar": float(np.mean(gp)), "gp_per_dollar_sd": float(np.std(gp)), "violation": viol,
                  "within_sla": all(v <= base.get(c, 0.0) + SLA_SLACK for c, v in viol.items())}  # fmt: skip
    return {"chosen": [[k, n] for k, n in chosen.most_common()], "deployed_violation": base, "by_clock": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markets", default=",".join(MARKETS))
    ap.add_argument("--year", type=int, default=2023)
    ap.add_argument("--window-rule", default="max", choices=("max", "median"))
    ap.add_argument("--seeds", default="0", help="the replay jobs' workload seeds (comma-separated)")
    ap.add_argument("--draws", type=int, default=4, help="draws of the week before per job (count)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    jobs = []
    for m in args.markets.split(","):
        for s in args.seeds.split(","):
            jobs.append(draws(m, args.year, args.window_rule, int(s), args.draws))
            j = jobs[-1]["summary"]
            print(f"  {len(j['chosen'])} configurations chosen over {args.draws} draws; deployed "
                  f"{ {c: round(100 * v, 2) for c, v in j['deployed_violation'].items()} }")
            for share, v in j["by_clock"].items():
                print(f"  draw 0's configuration at clock {share}: gp/$ {v['gp_per_dollar']:.1f} "
                      f"(sd {v['gp_per_dollar_sd']:.1f}) { {c: round(100 * x, 2) for c, x in v['violation'].items()} }"
                      f" within SLA {v['within_sla']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "config": vars(args), "jobs": jobs}, f, indent=1)


if __name__ == "__main__":
    main()
