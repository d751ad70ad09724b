"""One way to call HiGHS through cvxpy: deterministic work limits, a MIP gap for integer problems, and HiGHS's
start-up banner (printed by the C library on every solve, whatever the options) kept off stdout.

The limits count work (branch-and-bound nodes, simplex iterations), not wall time, so a decision re-made from
the same inputs (a worker rebuilding its policy after a restart) finds the same solution whatever the
machine's load; the time limit is only a last-resort stop far above any solve seen (the planner's solves take
milliseconds)."""

from __future__ import annotations

import os
import sys
from typing import Any

#: Branch-and-bound nodes of one MIP solve (count).
MAX_NODES = 10_000
#: Simplex iterations of one LP (or LP relaxation) solve (count).
MAX_SIMPLEX_ITERATIONS = 1_000_000
#: Last-resort wall-clock stop of one solve (s); the work limits above decide long before it.
SAFETY_TIME_LIMIT_S = 60.0


def solve_highs(problem: Any, *, mip_gap: float | None = None) -> float:
    """Solve a cvxpy problem with HiGHS; return its optimal value. The banner goes to /dev/null."""
    import cvxpy as cp  # lazy: cvxpy takes ~1 s to import; only the planner's solves need it

    opts: dict[str, Any] = {"time_limit": SAFETY_TIME_LIMIT_S, "mip_max_nodes": MAX_NODES,
                            "simplex_iteration_limit": MAX_SIMPLEX_ITERATIONS, "log_to_console": False}
    if mip_gap is not None:
        opts["mip_rel_gap"] = mip_gap
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return problem.solve(solver=cp.HIGHS, **opts)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
