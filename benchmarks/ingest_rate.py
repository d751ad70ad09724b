"""Ingestion rate of the world-model state: telemetry-like rows per second into a DuckDB file.

Usage: python benchmarks/ingest_rate.py [--rows 400000] [--batch 20000] [--memory]
Each micro-batch is one transaction with its consumer position; a second pass replays every batch
(all duplicates) to time the idempotent path.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from worldmodel.state import WorldState
from worldmodel.state import synthetic as syn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=20_000)
    ap.add_argument("--memory", action="store_true", help="in-memory state instead of a file")
    args = ap.parse_args()
    t0 = datetime(2023, 7, 1, tzinfo=UTC)
    batches = [
        syn.telemetry(t0 + timedelta(seconds=i * -(-args.batch // 128)), args.batch, hosts=16, seed=i)
        for i in range(args.rows // args.batch)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        ws = WorldState.open(":memory:" if args.memory else Path(tmp) / "bench.duckdb")
        for label in ("insert", "replay"):
            start = time.perf_counter()
            for i, frame in enumerate(batches):
                ws.update({"gpu_telemetry": frame}, {("aurelius.telemetry", 0): (i + 1) * args.batch})
            dt = time.perf_counter() - start
            n = len(batches) * args.batch
            print(
                f"{label}: {n} telemetry rows in {dt:.2f} s = {n / dt:,.0f} records/s "
                f"(batches of {args.batch}, {'memory' if args.memory else 'file'})"
            )
        assert ws.count("gpu_telemetry") == len(batches) * args.batch
        ws.close()


if __name__ == "__main__":
    main()
