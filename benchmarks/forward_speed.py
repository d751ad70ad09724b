"""Forward-model speed: one candidate plan, one 5-minute period, on an in-memory snapshot.

Usage: python benchmarks/forward_speed.py [--n 2000]
Prints the median and p95 wall time per evaluation (ms); the target is <= 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

import polars as pl

from schemas.cost import CostConfig
from schemas.forecast import ClassDemand, DisturbanceForecast, Interval
from schemas.plan import Plan, PoolPlan
from worldmodel.forward import ForwardModel
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import snapshot
from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn


def _iv(x: float) -> Interval:
    return Interval(x, 0.8 * x, 1.2 * x, 0.6 * x, 1.4 * x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="evaluations")
    args = ap.parse_args()
    t0 = datetime(2023, 7, 1, tzinfo=UTC)
    ws = WorldState.open(":memory:")
    fleet = []
    for model, gpu, tp in (
        ("llama-3.1-70b", "H100", 4),
        ("llama-3.1-8b", "H100", 1),
        ("llama-3.1-70b", "A100", 8),
        ("llama-3.1-8b", "A100", 1),
    ):
        fleet.append(
            syn.fleet_events(t0 - timedelta(minutes=10), 6, model=model, gpu_type=gpu, tp=tp).with_columns(
                pl.col("replica_id") + f"-{model}-{gpu}"
            )
        )
    arr = syn.arrivals(t0, 3000, rate_per_s=30.0)
    ws.update(
        {
            "fleet_event": pl.concat(fleet),
            "gpu_telemetry": syn.telemetry(t0, 128 * 60, hosts=16),
            "request_arrival": arr,
            "request_completion": syn.completions(arr.head(2500)),
        }
    )
    snap = snapshot(ws, t0 + timedelta(seconds=60))
    fc = DisturbanceForecast(
        t0,
        300.0,
        (
            ClassDemand("code", "llama-3.1-8b", _iv(20.0), 2000, 30, 5000, 100, 0.3),
            ClassDemand("chat", "llama-3.1-70b", _iv(40.0), 1000, 250, 2500, 600, 0.2),
            ClassDemand("batch", "llama-3.1-70b", _iv(6.0), 7000, 300, 15000, 700, 0.5),
        ),
        _iv(80.0),
        False,
        0.8,
    )
    fm = ForwardModel(ServingModel(), CostConfig())
    plans = [
        Plan(
            tuple(
                PoolPlan(
                    "PJM-1",
                    m,
                    g,
                    2 + i % 4,
                    12,
                    tp,
                    "fp8" if g == "H100" and i % 2 else "bf16",
                    64 * (1 + i % 4),
                    1980 if g == "H100" else 1410,
                )
                for m, g, tp in (
                    ("llama-3.1-70b", "H100", 4),
                    ("llama-3.1-8b", "H100", 1),
                    ("llama-3.1-70b", "A100", 8),
                    ("llama-3.1-8b", "A100", 1),
                )
            )
        )
        for i in range(16)
    ]
    times = []
    for i in range(args.n):
        start = time.perf_counter()
        fm.evaluate(snap, plans[i % len(plans)], fc)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    print(
        f"forward model, 4 pools x 3 classes x 4 demand scenarios, {args.n} evaluations: "
        f"median {statistics.median(times):.3f} ms, "
        f"p95 {times[int(0.95 * len(times))]:.3f} ms (target <= 5 ms)"
    )


if __name__ == "__main__":
    main()
