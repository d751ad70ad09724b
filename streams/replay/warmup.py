"""The simulator's one-time compile: whether numba's on-disk cache holds it, and compiling it up front.

A fresh clone (or a changed simulator source, see worldmodel/groundtruth/__init__.py) has no cached machine
code; the first replay compiles it once (about 25 CPU-seconds on the 2-core development machine) and every
later run loads it in under a second. `aurelius replay` announces the compile, runs it once in the parent
before its workers start (so two workers never compile the same code side by side), and reports its time.
"""

from __future__ import annotations

import time

from schemas.fleet import default_fleet

#: Wall seconds the compile takes on the 2-core development machine, idle (benchmarks/first_run.py).
COMPILE_ESTIMATE_S = 30


def compiled() -> bool:
    """True when numba's cache holds the engine's machine code for this Python and these sources."""
    from worldmodel.groundtruth.engine import run_until

    try:
        # numba's own index of cached overloads; empty when missing or stale (its source stamp differs)
        return bool(run_until._cache._cache_file._load_index())
    except (AttributeError, OSError):  # another numba layout: count it as not compiled (only the notice differs)
        return False


def compile_simulator(market: str, year: int) -> float:
    """Compile (and cache) the engine by replaying one 5-minute period; returns the wall seconds it took."""
    from optimizer.registry import create
    from streams.replay.driver import run_replay
    from streams.workload.builder import build_workload

    t0 = time.perf_counter()
    wl = build_workload(market, year, periods=1, seed=0)
    run_replay(wl, create("production"), default_fleet((market,)), stop_at_s=300.0)
    return time.perf_counter() - t0
