"""Where an aurelius decision's time goes on a real window: wall time (ms) per phase, audit off.

Runs an aurelius arm (`--arm`, default `aurelius`) with the world model and forecasters wired in on one
market's default window (or the three-site mode) and prints p50 / p95 / max per phase: the forecasters' and the
world model's updates (the DuckDB update per record kind, the period aggregates, the self-calibration), the
evaluator's snapshot, the forecast, candidate generation, the deferral LP, the search, the whole decision. It
found the DuckDB checkpoints inside the ingest (worldmodel/state/store.py, CHECKPOINT_THRESHOLD).

    python benchmarks/decision_phases.py --market ERCOT --seed 0
    python benchmarks/decision_phases.py --market ERCOT --sites three   # the three-site decision (ERCOT's window)
    python benchmarks/decision_phases.py --arm aurelius-horizon --market ERCOT --sites three
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

import optimizer.aurelius as aurelius_module
import optimizer.wiring as wiring
import optimizer.world_adapter as world_adapter
from schemas.fleet import MARKET_REGION, default_fleet
from streams.replay.driver import run_replay
from streams.workload.builder import build_workload
from streams.workload.residency import with_residency
from worldmodel.state import WorldState

TIMES: dict[str, list[float]] = defaultdict(list)


def _timed(owner: Any, name: str, label: str) -> None:
    """Replace owner.name by a wrapper that records its wall time (ms) under `label`."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            TIMES[label].append((time.perf_counter() - t) * 1e3)

    setattr(owner, name, wrapper)


def _ingest_by_kind() -> None:
    """Time WorldState.update per record kind (each kind as its own batch)."""
    inner = WorldState.update

    def per_kind(self: WorldState, batch: Any, positions: Any = None, ingested_at: Any = None,
                 extra: Any = None) -> Any:
        out = None
        for kind, frame in batch.items():
            t = time.perf_counter()
            out = inner(self, {kind: frame}, positions, ingested_at, extra)
            TIMES[f"ingest {kind}"].append((time.perf_counter() - t) * 1e3)
        return out

    WorldState.update = per_kind  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--market", default="ERCOT")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--year", type=int, default=2023)
    ap.add_argument("--arm", default="aurelius", help="the aurelius arm, e.g. aurelius-horizon")
    ap.add_argument("--sites", choices=("one", "three"), default="one",
                    help="one: the market's site; three: ERCOT, PJM and CAISO sites share the market's window")
    args = ap.parse_args()
    wl = build_workload(args.market, args.year, rule="max", start=None, periods=None, period_minutes=5.0,
                        seed=args.seed, source="protocol")
    markets = (args.market,) if args.sites == "one" else (args.market, *(m for m in MARKET_REGION if m != args.market))
    fleet = default_fleet(markets)
    if args.sites == "three":
        wl = with_residency(wl, fleet, args.market, seed=args.seed)
    policy = wiring.build_policy(args.arm, workload=wl, seed=args.seed, audit=False, all_sites=args.sites == "three")
    _ingest_by_kind()
    _timed(WorldState, "aggregate_period", "aggregate")
    _timed(world_adapter, "calibrate_period", "calibrate")
    _timed(policy.forecast_provider, "update", "forecast update")
    _timed(policy.forecast_provider, "forecast", "forecast")
    _timed(policy.world_model, "update", "world-model update")
    _timed(policy.world_model, "evaluator", "evaluator (snapshot)")
    _timed(policy, "_candidates", "candidates")
    _timed(aurelius_module, "plan_deferral", "deferral LP")
    _timed(aurelius_module, "search", "search")
    _timed(policy, "plan", "decision (plan)")
    run = run_replay(wl, policy, fleet, period_s=300.0, all_sites=args.sites == "three")
    print(f"{args.arm} {'+'.join(markets)} {args.year} seed {args.seed}: {len(run.decision_ms)} decisions, wall ms "
          "per phase")
    for label, v in TIMES.items():
        a = np.asarray(v)
        print(f"  {label:24s} n={a.size:3d}  p50 {np.median(a):7.1f}  p95 {np.percentile(a, 95):7.1f}  "
              f"max {a.max():7.1f}")
    dm = np.asarray(run.decision_ms)
    print(f"  decision_ms (results.json)   p50 {np.median(dm):7.1f}  p95 {np.percentile(dm, 95):7.1f}")


if __name__ == "__main__":
    main()
