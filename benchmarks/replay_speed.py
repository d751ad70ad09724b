"""Replay speed (issue 3, item 5): compile time, simulated requests per second per policy, full default replay.

    python benchmarks/replay_speed.py                 # all three measurements
    python benchmarks/replay_speed.py --fresh-compile # compile into an empty numba cache (true compile time)
    python benchmarks/replay_speed.py --skip-full     # without the full default replay
    python benchmarks/replay_speed.py --full-only     # only the full default replay (cache warmed first)

1. Compile: the first replay of a tiny workload (one 5-minute period) in this process pays numba's compile
   (or, with a warm on-disk cache, its load); the second identical replay does not. Both are printed and
   their difference is the compile/load time.
2. Throughput: each reference policy replays one full default window (PJM 2023, the most expensive 3 h,
   ~500k requests, through its drain) after the warm-up; requests per wall second, with the policy's own
   decision time shown apart.
3. Full default replay: `aurelius replay` with its defaults (3 markets x the reference policies, seed 0, the
   default --jobs) in a subprocess, one at a time, with the numba cache warm (compiled first if it is not):
   wall time end to end (interpreter start, workload builds, every replay, results.json, replay.duckdb) and
   the CPU seconds of the command and its workers. Targets (issue 16, item 7): <= 90 s wall and
   <= 150 CPU-seconds on the 2-core development machine.

Wall times stretch when other work shares the cores; each figure is printed with the process's CPU seconds,
which do not (the replay is single-threaded), and the 1-minute load average at start.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schemas.policy import REFERENCE_POLICIES

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = REFERENCE_POLICIES
TARGET_S = 90.0
TARGET_CPU_S = 150.0


def available(policies: tuple[str, ...]) -> list[str]:
    from optimizer.registry import names

    known = set(names())
    return [p for p in policies if p in known]


def compile_time(market: str, year: int) -> dict[str, float]:
    """Wall seconds of the first and second replay of one tiny period (compile or cache load, then warm)."""
    from optimizer.registry import create
    from schemas.fleet import default_fleet
    from streams.replay.driver import run_replay
    from streams.replay.metrics import summarize
    from streams.workload.builder import build_workload

    wl = build_workload(market, year, periods=1, seed=0)
    fleet = default_fleet((market,))
    out = {}
    for label in ("first_s", "second_s"):
        t0 = time.perf_counter()
        summarize(run_replay(wl, create("production"), fleet))
        out[label] = time.perf_counter() - t0
    out["compile_s"] = out["first_s"] - out["second_s"]
    out["tiny_requests"] = float(wl.requests.height)
    return out


def throughput(market: str, year: int, policies: list[str]) -> dict[str, dict[str, float]]:
    """Requests per wall second of each policy on one full default window (after compile_time's warm-up)."""
    from optimizer.registry import create
    from schemas.fleet import default_fleet
    from streams.replay.driver import run_replay
    from streams.replay.metrics import summarize
    from streams.workload.builder import build_workload

    t0 = time.perf_counter()
    wl = build_workload(market, year, seed=0)
    build_s = time.perf_counter() - t0
    fleet = default_fleet((market,))
    out: dict[str, dict[str, float]] = {}
    for name in policies:
        t0, c0 = time.perf_counter(), time.process_time()
        run = run_replay(wl, create(name), fleet)
        replay_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        t1 = time.perf_counter()
        s = summarize(run)
        summarize_s = time.perf_counter() - t1
        decide_s = sum(run.decision_ms) / 1000.0
        n = wl.requests.height
        out[name] = {
            "requests": float(n),
            "replay_s": replay_s,
            "cpu_s": cpu_s,
            "decide_s": decide_s,
            "summarize_s": summarize_s,
            "requests_per_s": n / replay_s,
            "requests_per_s_sim_only": n / max(replay_s - decide_s, 1e-9),
            "periods": float(run.periods),
            "sla_violation_rate": float(s["sla_violation_rate"]),
        }
    out["_build"] = {"workload_build_s": build_s}
    return out


def warm_cache() -> float:
    """Compile the simulator into numba's cache if it is not there (0 when it was); wall seconds."""
    from streams.replay.warmup import compile_simulator, compiled

    return 0.0 if compiled() else compile_simulator("PJM", 2023)


def full_replay(policies: list[str]) -> dict[str, Any]:
    """Wall and CPU seconds of `aurelius replay` with its defaults (the given policies) in a fresh process."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "streams.cli", "replay", "--policies", ",".join(policies), "--out", d,
               "--no-progress"]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError(f"aurelius replay failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        results = json.loads((Path(d) / "results.json").read_text())
    offered = int(sum(p["offered"] for m in results["markets"].values() for p in m["policies"].values()))
    return {"command": " ".join(["aurelius", *cmd[3:-3], "--out", "OUT", "--no-progress"]), "wall_s": wall,
            "cpu_s": cpu, "load_1min_end": os.getloadavg()[0],
            "markets": list(results["markets"]), "policies": policies, "requests_replayed": offered,
            "table": proc.stdout.strip()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--market", default="PJM")
    ap.add_argument("--year", type=int, default=2023)
    ap.add_argument("--skip-full", action="store_true", help="skip the full default replay")
    ap.add_argument("--full-only", action="store_true", help="only the full default replay")
    ap.add_argument("--fresh-compile", action="store_true", help="compile into an empty numba cache directory")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.fresh_compile:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cache-")  # before numba is imported
    policies = available(REFERENCE)
    missing = [p for p in REFERENCE if p not in policies]
    load = os.getloadavg()[0]
    report: dict[str, Any] = {
        "cores": os.cpu_count(),
        "load_1min": load,
        "policies": policies,
        "missing_policies": missing,
    }
    print(f"machine: {os.cpu_count()} cores, 1-min load average {load:.1f} at start (wall times stretch when it "
          f"exceeds the core count; CPU seconds do not)")  # fmt: skip
    if missing:
        print(f"note: reference policies not registered, left out: {', '.join(missing)}")

    if args.full_only:
        args.skip_full = False
    else:
        _compile_and_throughput(args, policies, report)
    if not args.skip_full:
        took = warm_cache()
        if took:
            print(f"\nwarmed the numba cache first ({took:.0f} s): the full replay is timed with it warm")
        f = full_replay(policies)
        report["full"] = {k: v for k, v in f.items() if k != "table"}
        verdict = "within" if f["wall_s"] <= TARGET_S and f["cpu_s"] <= TARGET_CPU_S else "OVER"
        print(f"\nfull default replay: `{f['command']}`")
        print(f"  {len(f['markets'])} markets x {len(policies)} policies, {f['requests_replayed']:,} requests "
              f"replayed: {f['wall_s']:.1f} s wall, {f['cpu_s']:.1f} s CPU (1-min load {load:.1f} at start, "
              f"{f['load_1min_end']:.1f} at end)")  # fmt: skip
        print(f"  {verdict} the targets ({TARGET_S:.0f} s wall, {TARGET_CPU_S:.0f} CPU-s) on {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _compile_and_throughput(args: argparse.Namespace, policies: list[str], report: dict[str, Any]) -> None:
    c = compile_time(args.market, args.year)
    report["compile"] = c
    cache = "empty cache (true compile)" if args.fresh_compile else "on-disk numba cache as found"
    print(f"compile ({cache}): first replay of {c['tiny_requests']:.0f} requests {c['first_s']:.2f} s, "
          f"second {c['second_s']:.2f} s -> compile/load {c['compile_s']:.2f} s")  # fmt: skip

    tp = throughput(args.market, args.year, policies)
    report["throughput"] = tp
    print(f"\nthroughput, {args.market} {args.year} default window ({tp[policies[0]]['requests']:.0f} requests, "
          f"workload build {tp['_build']['workload_build_s']:.1f} s):")  # fmt: skip
    print(f"{'policy':<18}{'replay s':>10}{'cpu s':>8}{'decide s':>10}{'req/s':>11}{'req/s sim':>11}{'periods':>9}"
          f"{'viol%':>8}")  # fmt: skip
    for name in policies:
        r = tp[name]
        viol = 100 * r["sla_violation_rate"]
        print(f"{name:<18}{r['replay_s']:>10.1f}{r['cpu_s']:>8.1f}{r['decide_s']:>10.1f}{r['requests_per_s']:>11.0f}"
              f"{r['requests_per_s_sim_only']:>11.0f}{r['periods']:>9.0f}{viol:>8.2f}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
