"""Decision latency of the aurelius policy: p50/p95 of decision_ms (the regret audit excluded), the audit's
own time beside it, evaluations per decision and regret.

This runs on the test fakes (tests/optimizer/opt_fakes.py): a closed-form evaluator, a persistence forecaster
and a fixed reference plan, so it measures the optimizer's own cost (candidate generation, the deferral LP,
the capacity MILPs, search, gates) rather than the forward model's. The decision latency with the world
model and forecasters wired in is `decision_ms_p95` in the results.json of `aurelius replay`.

    python benchmarks/decision_speed.py --periods 36
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "optimizer"))

from opt_fakes import FakeWorld, PersistenceForecasts, StubReference, context, history, observations  # noqa: E402

from optimizer.aurelius import AureliusPolicy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--periods", type=int, default=36, help="control periods to decide (count)")
    ap.add_argument("--mode", default="full", help="full | clock-only | fixed-grid | no-deferral")
    args = ap.parse_args()
    world = FakeWorld()
    pol = AureliusPolicy(mode=args.mode, forecast_provider=PersistenceForecasts(), world_model=world,
                         reference_policy=StubReference())
    pol.start(context(), history())  # warm-up: cold imports (cvxpy, HiGHS) are not a decision's cost
    ms, audit_ms, evals, regret = [], [], [], []
    for k in range(1, args.periods + 1):
        obs = observations(k, code=3000 + 1000 * (k % 12), chat=900 - 20 * (k % 7),
                           price=100.0 + 60 * (k % 5))
        t0 = time.perf_counter()
        pol.plan(obs)
        total_ms = (time.perf_counter() - t0) * 1e3
        rec = pol.last_decision()
        assert rec is not None
        ms.append(rec["decision_ms"])
        audit_ms.append(total_ms - rec["decision_ms"])
        evals.append(rec["candidates_evaluated"])
        regret.append(rec["regret"])
    q = statistics.quantiles(ms, n=20)
    print(f"decisions: {len(ms)}  mode: {args.mode}  evaluator: fake (closed form)")
    print(f"decision_ms  p50 {statistics.median(ms):.0f}  p95 {q[18]:.0f}  max {max(ms):.0f}"
          "  (audit excluded)")
    print(f"audit_ms     p50 {statistics.median(audit_ms):.0f}  (600-plan grid, after the decision)")
    print(f"evaluations  median {statistics.median(evals):.0f}  max {max(evals)}")
    zero = sum(r == 0 for r in regret) / len(regret)
    print(f"regret       mean {statistics.mean(regret):.4f}  zero share {zero:.2f}")


if __name__ == "__main__":
    main()
