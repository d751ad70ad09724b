"""How well the planner's forward model predicts what each lever does, measured on ground-truth branches.

For each market, on the hour one week before its default window (data the replay of that window may use:
nothing of the window itself), aurelius decides every 5-minute period; at every other decision the lever
variants of the lever spread (optimizer/lever_spread.py, the hindsight arm's plans, around production's plan: capacity
both ways, autoscaler target, batch cap, precision, clock, deferral, token budget) are

- predicted by the arm's own scorer at that decision (`AureliusPolicy.scorer()`: the forward model over the
  decided period, or over its horizon for `--arm aurelius-horizon`), as gp/$ relative to production's plan, and
- realized on a branch of the ground truth (the plan for the decided period, production's plan for H = 2 more,
  then the drain; with `--continuation hold` the plan itself for the H periods, so a lever that persists, a
  precision reload above all, is not undone and paid for twice), as the branch's gp/$ relative to production's
  branch (production held throughout), averaged over `--replicates` noise
  replicates each paired with production's branch on the same replicate (streams/replay/branching.py: a single
  branch's difference between two plans has a noise sd of 14-21 %, benchmarks/branch_noise.py).

Per lever it prints the sign agreement (share of decisions where predicted and realized differences have the
same sign, differences below 0.5 % in both counted as agreeing), the mean realized difference, and the
error quantiles of predicted minus realized; `--out` writes them as JSON (the per-lever margins of the planner's
Pareto gate are read from that file: optimizer/margins.py).

With `--trunk hold` the hour's trunk holds batch work at every decision (a backlog of up to an hour, as a
reference that defers through a price peak gathers), and what is measured is the release of that backlog against
the reference holding on (optimizer.margins.RELEASE_AFTER_HOLD: admit it at once, or under pressure): the reverse
of a one-period hold is a small backlog, and the release of a long one is a burst the forward model may not see.

    python benchmarks/lever_error.py --out benchmarks/results/lever_error.json
    python benchmarks/lever_error.py --trunk hold --out benchmarks/results/lever_error_release.json
    python benchmarks/lever_error.py --write-margins one_period=A.json+B.json,horizon=C.json+D.json

Runs the ground truth: a measurement tool, never imported by the planner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np

from optimizer.lever_spread import lever_spread
from optimizer.margins import MARGINS_FILE, QUANTILE, RELEASE_AFTER_HOLD, margins_from_rows
from optimizer.wiring import build_policy
from schemas.fleet import MARKETS, default_fleet
from schemas.plan import BatchAdmission, Plan
from streams.replay.branching import DEFAULT_REPLICATES, branch_value, live_replicas, noise_seeds
from streams.replay.driver import RunResult, run_replay
from streams.replay.tuning import week_before
from streams.workload.builder import build_workload
from worldmodel.groundtruth.runtime import Physics

TIE = 0.005  # differences below 0.5 % in both directions count as agreeing (ratio)


def measure(market: str, *, periods: int, every: int, seed: int, arm: str, replicates: int,
            hold: bool = False, held_trunk: bool = False) -> list[dict[str, Any]]:
    """Predicted and realized gp/$ differences vs production's plan at the sampled decisions of one market
    (`hold`: each plan's branch keeps it for the H periods after the decided one, instead of production's;
    `held_trunk`: the trunk holds batch work all hour, and the releases of its backlog are measured against
    production's plan holding)."""
    physics = Physics()
    fleet = default_fleet()
    window = build_workload(market, 2023, rule="max", periods=1, seed=seed).window
    wl, initial = week_before(market, window.start, fleet, seed=seed, physics=physics, periods=periods)
    policy = build_policy(arm, wl, seed, period_s=300.0, window_periods=periods, audit=False,
                          also_references=())  # fmt: skip
    rows: list[dict[str, Any]] = []

    def intercept(k: int, run: RunResult, plan: Plan) -> Plan:
        if k >= periods:
            return plan
        trunk = replace(plan, batch_admission=BatchAdmission.HOLD) if held_trunk else plan
        if k % every:
            return trunk
        score = policy.scorer()
        ref = policy.reference_plan()
        if score is None or ref is None:
            return trunk
        t0 = k * 300.0
        if held_trunk:
            ref = replace(ref, batch_admission=BatchAdmission.HOLD)
            variants = [(label, replace(ref, batch_admission=a)) for label, a in RELEASE_AFTER_HOLD.items()]
        else:
            variants = lever_spread(ref, {"production": ref}, None, live_replicas(run))
        pred_ref = score(ref).outcome.gp_per_dollar
        seeds = noise_seeds(replicates)
        real_ref = [branch_value(run, ref, ref, t0, 300.0, 2, 0.0, noise=r).gp_per_dollar for r in seeds]
        for label, p in variants:
            if label == "ref:production":
                continue
            t = time.perf_counter()
            pred = score(p).outcome.gp_per_dollar
            real = [branch_value(run, p, p if hold else ref, t0, 300.0, 2, 0.0, noise=r).gp_per_dollar for r in seeds]
            realized = float(np.mean([g / g_ref - 1.0 for g, g_ref in zip(real, real_ref, strict=True)]))
            rows.append({"market": market, "period": k, "lever": label, "predicted": pred / pred_ref - 1.0,
                         "realized": realized, "wall_s": time.perf_counter() - t})  # fmt: skip
        return trunk

    run_replay(wl, policy, fleet, period_s=300.0, physics=physics, initial_replicas=initial, intercept=intercept)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per lever: n, sign agreement (share), mean realized and predicted differences, error quantiles (ratio)."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["lever"]].append(r)
    out = {}
    for lever, rs in sorted(by.items()):
        p = np.array([r["predicted"] for r in rs])
        q = np.array([r["realized"] for r in rs])
        agree = (np.sign(p) == np.sign(q)) | ((np.abs(p) < TIE) & (np.abs(q) < TIE))
        err = p - q
        out[lever] = {"n": len(rs), "sign_agreement": float(agree.mean()), "realized_mean": float(q.mean()),
                      "predicted_mean": float(p.mean()), "error_p50": float(np.quantile(err, 0.5)),
                      "error_p80": float(np.quantile(err, 0.8)), "error_p90": float(np.quantile(err, 0.9)),
                      "abs_error_p80": float(np.quantile(np.abs(err), 0.8))}  # fmt: skip
    return out


def write_margins(sources: dict[str, str]) -> None:
    """optimizer/lever_margins.json: per kind, the margins (optimizer.margins.margins_from_rows) of the rows of its
    recorded files ("A.json+B.json": the spread and the releases after a hold, measured by the same arm)."""
    out: dict[str, Any] = {"quantile": QUANTILE}
    for kind, paths in sources.items():
        recs = []
        for path in paths.split("+"):
            with open(path) as f:
                recs.append(json.load(f))
        if len({r["config"]["arm"] for r in recs}) != 1:
            raise ValueError(f"{kind}: files measured by different arms: {paths}")
        rows = [row for r in recs for row in r["rows"]]
        out[kind] = {"source": paths, "commit": "+".join(r["commit"] for r in recs), "arm": recs[0]["config"]["arm"],
                     "margins": margins_from_rows(rows), "by_label": margins_from_rows(rows, "lever")}  # fmt: skip
    MARGINS_FILE.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markets", default=",".join(MARKETS))
    ap.add_argument("--periods", type=int, default=12, help="periods of the measured hour (count)")
    ap.add_argument("--every", type=int, default=2, help="measure every n-th decision (count)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arm", default="aurelius", help="the aurelius arm whose scorer predicts (its horizon or none)")
    ap.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES,
                    help="noise replicates each realized difference is averaged over (count)")
    ap.add_argument("--continuation", choices=("reference", "hold"), default="reference",
                    help="after the decided period a branch runs production's plan (reference) or its own (hold)")
    ap.add_argument("--trunk", choices=("decided", "hold"), default="decided",
                    help="the hour's trunk runs the arm's decisions, or holds batch work all hour and the releases "
                         "of its backlog are measured")  # fmt: skip
    ap.add_argument("--out", default=None)
    ap.add_argument("--write-margins", default=None, metavar="KIND=FILE,...",
                    help="write optimizer/lever_margins.json from recorded measurements (kinds: horizon, one_period) "
                         "and measure nothing")  # fmt: skip
    args = ap.parse_args()
    if args.write_margins:
        write_margins(dict(kv.split("=", 1) for kv in args.write_margins.split(",")))
        return
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    for m in args.markets.split(","):
        t = time.perf_counter()
        rows += measure(m, periods=args.periods, every=args.every, seed=args.seed, arm=args.arm,
                        replicates=args.replicates, hold=args.continuation == "hold",
                        held_trunk=args.trunk == "hold")
        print(f"{m}: {time.perf_counter() - t:.0f} s", flush=True)
    table = summarize(rows)
    print(f"{'lever':<22}{'n':>4}{'sign':>7}{'real':>9}{'pred':>9}{'err50':>9}{'err80':>9}{'|err|80':>9}")
    for lever, s in table.items():
        print(f"{lever:<22}{s['n']:>4}{s['sign_agreement']:>7.2f}{s['realized_mean']:>9.3f}{s['predicted_mean']:>9.3f}"
              f"{s['error_p50']:>9.3f}{s['error_p80']:>9.3f}{s['abs_error_p80']:>9.3f}")
    if args.out:  # the commit the measurement started at
        with open(args.out, "w") as f:
            json.dump({"commit": commit, "config": vars(args), "levers": table, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
