"""One way to call HiGHS through cvxpy: a time limit always, a MIP gap for integer problems, and HiGHS's
start-up banner (printed by the C library on every solve, whatever the options) kept off stdout."""

from __future__ import annotations

import os
import sys
from typing import Any


def solve_highs(problem: Any, *, time_limit_s: float, mip_gap: float | None = None) -> float:
    """Solve a cvxpy problem with HiGHS; return its optimal value. The banner goes to /dev/null."""
    import cvxpy as cp  # lazy: cvxpy takes ~1 s to import; only the planner's solves need it

    opts: dict[str, Any] = {"time_limit": time_limit_s, "log_to_console": False}
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
