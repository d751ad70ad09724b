"""The noise floor of ground-truth branches: what plans with no real effect realize, with and without replicates.

For each market, on the hour one week before its default window, production decides every 5-minute period; at
each decision its plan is branched (the decided period, production for H = 2 more, the drain) beside null
variants whose true effect is nil or nearly so:

- `clock-1mhz`, `clock-5mhz`: the SM clock 1 or 5 MHz under the maximum (decode 0.05 % or 0.25 % slower at most);
- `batch+1`: the batch cap one sequence higher;
- `noise`: production's own plan on noise replicate 1 (arrivals not yet arrived shifted by under 1 ms).

Per null variant it prints the realized gp/$ difference against production's branch (ratio): on the realization
alone (R = 1), and averaged over R noise replicates, each paired with production's branch on the same shifts
(streams/replay/branching.py `branch_mean`). Their spread is how far a single branch's ranking of two plans is
noise, and how far the replicates take it down.

    python benchmarks/branch_noise.py --replicates 4 --out benchmarks/results/branch_noise.json

Runs the ground truth: a measurement tool, never imported by the planner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from typing import Any

import numpy as np

from optimizer.wiring import build_policy
from schemas.fleet import MARKETS, default_fleet
from schemas.plan import Plan
from streams.replay.branching import branch_value, null_variants
from streams.replay.driver import RunResult, run_replay
from streams.replay.tuning import week_before
from streams.workload.builder import build_workload
from worldmodel.groundtruth.runtime import Physics


def measure(market: str, *, periods: int, seed: int, replicates: int) -> list[dict[str, Any]]:
    """Per decision and null variant: the realized gp/$ ratio on the realization and over the replicates."""
    physics = Physics()
    fleet = default_fleet()
    window = build_workload(market, 2023, rule="max", periods=1, seed=seed).window
    wl, initial = week_before(market, window.start, fleet, seed=seed, physics=physics, periods=periods)
    policy = build_policy("production", wl, seed, period_s=300.0, window_periods=periods, audit=False,
                          also_references=())  # fmt: skip
    rows: list[dict[str, Any]] = []

    def intercept(k: int, run: RunResult, plan: Plan) -> Plan:
        if k == 0 or k >= periods:
            return plan
        t0 = k * 300.0
        ref = [branch_value(run, plan, plan, t0, 300.0, 2, 0.0, noise=r).gp_per_dollar for r in range(replicates + 1)]
        variants = [(label.removeprefix("null:"), [branch_value(run, p, plan, t0, 300.0, 2, 0.0, noise=r).gp_per_dollar
                                                   for r in range(replicates)])
                    for label, p in null_variants(plan)]  # fmt: skip
        variants.append(("noise", ref[1:]))  # production's own plan one replicate on: branched already
        for label, got in variants:
            ratios = [g / ref[r] - 1.0 for r, g in enumerate(got)]
            rows.append({"market": market, "period": k, "lever": label, "single": ratios[0],
                         "replicated": float(np.mean(ratios)), "replicates": replicates})  # fmt: skip
        return plan

    run_replay(wl, policy, fleet, period_s=300.0, physics=physics, initial_replicas=initial, intercept=intercept)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per null variant: n, and for the single branch and the replicated mean: sd, |max|, share beyond 5 %."""
    out = {}
    for lever in dict.fromkeys(r["lever"] for r in rows):
        s = np.array([r["single"] for r in rows if r["lever"] == lever])
        m = np.array([r["replicated"] for r in rows if r["lever"] == lever])
        out[lever] = {"n": int(s.size), "single_sd": float(s.std()), "single_absmax": float(np.abs(s).max()),
                      "single_beyond_5pct": float((np.abs(s) > 0.05).mean()), "replicated_sd": float(m.std()),
                      "replicated_absmax": float(np.abs(m).max()),
                      "replicated_beyond_5pct": float((np.abs(m) > 0.05).mean())}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markets", default=",".join(MARKETS))
    ap.add_argument("--periods", type=int, default=12, help="periods of the measured hour (count)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--replicates", type=int, default=4, help="noise replicates averaged (count)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for m in args.markets.split(","):
        t = time.perf_counter()
        rows += measure(m, periods=args.periods, seed=args.seed, replicates=args.replicates)
        print(f"{m}: {time.perf_counter() - t:.0f} s", flush=True)
    table = summarize(rows)
    print(f"{'null variant':<14}{'n':>4}{'sd R=1':>9}{'max R=1':>9}{'>5% R=1':>9}"
          f"{f'sd R={args.replicates}':>9}{'max':>9}{'>5%':>9}")  # fmt: skip
    for lever, s in table.items():
        print(f"{lever:<14}{s['n']:>4}{s['single_sd']:>9.3f}{s['single_absmax']:>9.3f}{s['single_beyond_5pct']:>9.2f}"
              f"{s['replicated_sd']:>9.3f}{s['replicated_absmax']:>9.3f}{s['replicated_beyond_5pct']:>9.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "config": vars(args), "levers": table, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
