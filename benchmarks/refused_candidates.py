"""What the Pareto gate's refusals were worth in the ground truth: the fallbacks' refused candidates, branched
by the realized-regret audit (`realized_regret.refused` of results.json, streams/replay/hindsight.py), pooled over
the given files per market, and split by the sign of the gain the gate predicted.

    python benchmarks/refused_candidates.py benchmarks/results/default_2023_seed*_regret_refused_*.json

Per line: refused decisions (n), the realized gp/$ gain of the refused plan over the plan committed (mean, p50,
share above 0; ratio), the gate's predicted gain (mean), how many were better by the regret's value while keeping
every class within the committed branch's violation + 0.1 pp (falling back cost value there), and the rank
correlation of predicted and realized gain (Spearman).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
from scipy.stats import spearmanr


def entries(paths: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Refused entries per market, over every seed of every file (`refused_entry`'s fields)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        with open(path) as fh:
            res = json.load(fh)
        for market, m in res["markets"].items():
            for s in m["policies"].get("aurelius", {}).get("by_seed", []):
                out.setdefault(market, []).extend(s.get("realized_regret", {}).get("refused", {}).get("entries", []))
    return out


def line(name: str, es: list[dict[str, Any]]) -> str:
    """One summary line of `es` (module docstring)."""
    rs = [e for e in es if e["gain"] is not None]
    if not rs:
        return f"{name:<28} n 0"
    g = np.array([e["gain"] for e in rs])
    both = [(e["predicted_gain"], e["gain"]) for e in rs if e["predicted_gain"] is not None]
    p = np.array([x for x, _ in both])
    better = sum(1 for e in rs if e["gap_per_request"] > 0 and e["within_sla"])
    rho = spearmanr(p, [y for _, y in both]).statistic if p.size > 2 else float("nan")
    return (f"{name:<28} n {len(rs):>3}  realized mean {g.mean():+7.2%}  p50 {np.median(g):+6.2%}  "
            f"share>0 {(g > 0).mean():.2f}  predicted mean {p.mean() if p.size else float('nan'):+6.2%}  "
            f"better within SLA {better:>3}  spearman {rho:+.2f}")


def main(paths: list[str]) -> int:
    by_market = entries(paths)
    pooled = [e for es in by_market.values() for e in es]
    for market, es in by_market.items():
        print(line(market, es))
    print(line("all", pooled))
    print(line("  gate predicted a gain", [e for e in pooled if (e["predicted_gain"] or 0) > 0]))
    print(line("  gate predicted none", [e for e in pooled if (e["predicted_gain"] or 0) <= 0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
