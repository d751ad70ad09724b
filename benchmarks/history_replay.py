"""History replay speed (issue 19): records/s of reading a history and the replay time of the history command.

    python benchmarks/history_replay.py --hours 3          # ~0.5M requests (PJM 2023, the bundled window)
    python benchmarks/history_replay.py --hours 24         # the issue's target size, ~4M requests

1. Generate: a history of `--hours` of the bundled PJM 2023 workload, from the default window's start,
   replayed under production with its observations kept and written as `aurelius replay --emit-observations`
   writes them (not timed as part of the targets; printed).
2. Read: `streams.history.reader.read_directory` (records/s over every kind), then the checks
   (`streams.history.checks.check`), timed apart.
3. Replay: `aurelius replay --history DIR --policies POLICIES` in this process (seed 0): wall time end to
   end and each arm's replay time from results.json (the as-deployed target refinement is in the total).
4. With `--kafka BOOTSTRAP` (or `--kafka tansu`: a local in-memory Tansu broker): the history published to
   fresh topics (`aurelius publish`'s producer, flat out; not timed as a target), then read back with
   `streams.history.reader.read_topics` into frames: records/s (the issue's target: >= 50k records/s).

Wall times stretch when other work shares the cores; the 1-minute load average is printed at start.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def generate(directory: Path, hours: float) -> dict[str, float]:
    """Write a simulated history of `hours` under production into `directory` (see the module docstring)."""
    from optimizer.registry import create
    from schemas.fleet import default_fleet
    from streams.replay.cli import emit_observations
    from streams.replay.driver import run_replay
    from streams.replay.tuning import lead_in_fleet
    from streams.workload.builder import build_workload

    t0 = time.perf_counter()
    wl = build_workload("PJM", 2023, periods=int(round(hours * 12)), seed=0)
    fleet = default_fleet(("PJM",))
    initial = lead_in_fleet("PJM", wl.window.start, fleet, seed=0)
    res = run_replay(
        wl, create("production"), fleet, keep_observations=True, initial_replicas=initial, window_s=hours * 3600.0
    )
    emit_observations(directory, res)
    (directory.parent / "history.toml").write_text('market = "PJM"\n[fleet.site-pjm]\nH100 = 8\nA100 = 8\n')
    return {"requests": float(wl.requests.height), "generate_s": time.perf_counter() - t0}


def read(directory: Path) -> dict[str, float]:
    """Read and check the history; records, seconds and records/s."""
    from streams.history.checks import check
    from streams.history.config import load_config
    from streams.history.reader import read_directory
    from streams.history.report import HistoryReport

    report = HistoryReport()
    t0 = time.perf_counter()
    raw = read_directory(directory, report)
    read_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    check(raw, load_config(directory.parent / "history.toml"), report)
    check_s = time.perf_counter() - t1
    return {
        "records": float(raw.records),
        "read_s": read_s,
        "records_per_s": raw.records / read_s,
        "check_s": check_s,
        "read_and_check_records_per_s": raw.records / (read_s + check_s),
    }


def replay(directory: Path, out: Path, policies: str) -> dict[str, object]:
    """`aurelius replay --history` in this process; total wall time and each arm's replay time."""
    from streams.cli import main

    t0 = time.perf_counter()
    argv = [
        "replay",
        "--history",
        str(directory),
        "--history-config",
        str(directory.parent / "history.toml"),
        "--policies",
        policies,
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    total = time.perf_counter() - t0
    h = json.loads((out / "results.json").read_text())["history"]
    return {"replay_total_s": total, "arms_s": h["replay_wall_s"]}


def topics(directory: Path, bootstrap: str) -> dict[str, float]:
    """Publish the history to fresh topics on `bootstrap` ("tansu": start one), then time reading it back."""
    import asyncio
    import uuid
    from datetime import timedelta

    from schemas.timestamps import ts_from_wire
    from schemas.topics import Topics
    from streams import broker
    from streams.history.reader import read_topics
    from streams.history.report import HistoryReport
    from streams.publish import load_directory, publish

    proc = broker.start_tansu(port := broker.free_port()) if bootstrap == "tansu" else None
    address = f"127.0.0.1:{port}" if proc is not None else bootstrap
    try:
        t = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}.")
        records = load_directory(directory)
        t0 = time.perf_counter()
        n = asyncio.run(publish(records, address, t, speedup=0))
        publish_s = time.perf_counter() - t0
        first = min(r["event_at"] for r in records["request_arrival"])
        start = ts_from_wire(first) - timedelta(days=7)
        t1 = time.perf_counter()
        raw = read_topics(address, start, start + timedelta(days=30), HistoryReport(), t)
        read_s = time.perf_counter() - t1
    finally:
        if proc is not None:
            broker.stop(proc)
    return {
        "published": float(n),
        "publish_s": publish_s,
        "read": float(raw.records),
        "read_s": read_s,
        "records_per_s": raw.records / read_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=3.0, help="hours of history to generate (24: ~4M requests)")
    ap.add_argument("--policies", default="production,naive", help="arms beside the two as-deployed forms")
    ap.add_argument("--dir", default=None, help="keep the generated history and the output here")
    ap.add_argument("--kafka", default=None, metavar="BOOTSTRAP", help="also time reading from topics ('tansu')")
    ap.add_argument("--skip-replay", action="store_true", help="generate and read only")
    args = ap.parse_args()
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="history_bench_"))
    hist = root / "history"
    hist.mkdir(parents=True, exist_ok=True)
    g = generate(hist, args.hours)
    print(f"generated {g['requests']:.0f} requests over {args.hours} h in {g['generate_s']:.1f} s -> {hist}")
    r = read(hist)
    print(
        f"read {r['records']:.0f} records in {r['read_s']:.2f} s ({r['records_per_s']:,.0f} records/s); "
        f"checks {r['check_s']:.2f} s ({r['read_and_check_records_per_s']:,.0f} records/s read and checked)"
    )
    if args.kafka:
        k = topics(hist, args.kafka)
        print(
            f"topics: published {k['published']:.0f} records in {k['publish_s']:.1f} s; read {k['read']:.0f} back "
            f"in {k['read_s']:.2f} s ({k['records_per_s']:,.0f} records/s)"
        )
    if args.skip_replay:
        return
    p = replay(hist, root / "out", args.policies)
    print(f"history replay ({args.policies} + as-deployed, as-deployed-imposed; seed 0): {p['replay_total_s']:.1f} s")
    for arm, s in p["arms_s"].items():  # type: ignore[union-attr]
        print(f"  {arm:<28}{s:>8.1f} s")


if __name__ == "__main__":
    main()
