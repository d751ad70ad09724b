"""What the runtime's autoscaler does inside one period: the ground truth's fleet and queues every few seconds.

Replays a window under a policy up to a period boundary k, applies the policy's plan for period k on a fork of
the runtime (`SiteRuntime.fork`: the run itself is left as it was), and prints, every `--step-s` seconds of the
period, per pool: warm and loading replicas, sequences running, the replicas' summed prefill share and KV use
(the autoscaler's utilization inputs, worldmodel/groundtruth/scaler.py), and per model the interactive queue and
the deferrable queue (requests). It is how the first in-window period's chat loss of the default PJM window was
traced (docs/optimizer.md "What the first in-window period loses"): the 70B H100 pool of production-tuned's plan
(fp8, the engine's batch cap of 1,024 sequences) held 10 prewarmed replicas at 0.9% of their batch slots, the
autoscaler let 9 go at once when the plan's floor fell to 1, and the one left filled its 1,024 slots while chat
queued behind it.

    python benchmarks/autoscaler_trace.py --market PJM --policy production-tuned --period 1 \
        --out benchmarks/results/autoscaler_trace_pjm_seed0_period1_production_tuned.json

Runs the ground truth: a measurement tool, never imported by the planner.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from typing import Any

import numpy as np

from optimizer.wiring import build_policy
from schemas.fleet import MARKETS, default_fleet
from schemas.plan import Plan
from streams.replay import memo
from streams.replay.driver import RunResult, run_replay
from streams.workload.builder import build_workload
from worldmodel.groundtruth import state as st
from worldmodel.groundtruth.runtime import Physics, SiteRuntime
from worldmodel.snapshot import pool_name

PERIOD_S = 300.0


class _Traced(Exception):
    """Raised once the period is traced: the replay stops there."""


def sample(rt: SiteRuntime) -> dict[str, Any]:
    """The runtime's fleet and queues now: per pool warm and loading replicas (count), sequences running (count),
    summed prefill share (replica-equivalents) and KV use (share of the warm replicas' capacity, 0-1); per model
    the interactive and the deferrable queue (requests)."""
    rep, q = rt.rep, rt.q
    pools: dict[str, Any] = {}
    for p, key in enumerate(rt.pool_keys):
        mine = rep.pool == p
        warm = mine & (rep.state == st.WARM)
        kv_cap = float(np.sum(rep.coef[warm, st.C_KVCAP]))
        pools[pool_name(key)] = {
            "warm": int(np.sum(warm)),
            "loading": int(np.sum(mine & (rep.state == st.LOADING))),
            "running": int(np.sum(rep.n[warm])),
            "prefill_share": round(float(np.sum(rep.pfill_util[warm])), 3),
            "kv_use": round(float(np.sum(rep.kv[warm])) / kv_cap, 4) if kv_cap > 0 else 0.0,
        }
    return {"t_s": rt.now, "pools": pools,
            "interactive_queue": [int(q.itail[m] - q.ihead[m]) for m in range(len(q.bn))],
            "deferrable_queue": [int(n) for n in q.bn]}  # fmt: skip


def trace(market: str, policy_name: str, period: int, *, seed: int, step_s: float) -> dict[str, Any]:
    """The plan `policy_name` decides at period `period` of the market's default 2023 window (seed), and the
    runtime sampled every `step_s` s over that period on a fork of the run."""
    physics = Physics()
    fleet = default_fleet()
    wl = build_workload(market, 2023, rule="max", seed=seed)
    start = wl.window.start
    tuning = memo.tuning(market, start, fleet, seed=seed, physics=physics)  # the replay's cache entries
    initial = memo.lead_in(market, start, fleet, seed=seed, physics=physics)
    policy = build_policy(policy_name, wl, seed, period_s=PERIOD_S, tuned=tuning.config, clock=tuning.clock)
    out: dict[str, Any] = {"market": market, "policy": policy_name, "seed": seed, "period": period}

    def pools_of(plan: Plan) -> list[dict[str, Any]]:
        return [{"pool": pool_name(p.key), "floor": p.replica_floor, "ceiling": p.replica_ceiling,
                 "precision": p.precision, "max_batch": p.max_batch} for p in plan.pools]  # fmt: skip

    def intercept(k: int, run: RunResult, plan: Plan) -> Plan:
        if k < period:
            return plan
        out["plan_before"] = pools_of(run.plan_by_period[k - 1])
        out["plan"] = {"label": plan.label, "batch_admission": str(plan.batch_admission),
                       "autoscale_target": plan.autoscale_target, "pools": pools_of(plan)}  # fmt: skip
        rt = run.runtime.fork()
        rt.apply_plan(plan)
        out["samples"] = [sample(rt)]
        for t in np.arange(k * PERIOD_S + step_s, (k + 1) * PERIOD_S + 1e-9, step_s):
            rt.advance(float(t))
            out["samples"].append(sample(rt))
        raise _Traced

    try:
        run_replay(wl, policy, fleet, period_s=PERIOD_S, physics=physics, initial_replicas=initial,
                   intercept=intercept)  # fmt: skip
    except _Traced:
        pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--market", choices=MARKETS, default="PJM")
    ap.add_argument("--policy", default="production-tuned")
    ap.add_argument("--period", type=int, default=1, help="the period traced (>= 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-s", type=float, default=15.0, help="seconds between samples")
    ap.add_argument("--out", help="write the trace as JSON here")
    a = ap.parse_args()
    out = trace(a.market, a.policy, a.period, seed=a.seed, step_s=a.step_s)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out["commit"] = commit
    print(f"{a.market} seed {a.seed}, {a.policy} at period {a.period}: {out['plan']['label']}")
    for s in out["samples"]:
        pools = " | ".join(f"{name.split('/', 1)[1]} w{p['warm']} l{p['loading']} run{p['running']} "
                           f"pf{p['prefill_share']:.2f} kv{p['kv_use']:.2f}" for name, p in s["pools"].items())
        print(f"t={s['t_s']:6.0f} s  {pools}  queues {s['interactive_queue']} / {s['deferrable_queue']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
