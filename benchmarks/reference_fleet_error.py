"""How well the planner predicts the reference's own fleet, period by period, from a finished replay.

Reads a replay's output directory (`aurelius replay ... --out OUT`, with an aurelius arm and its audit log): for
every period where the arm fell back to the reference's plan, the plan that ran is the reference's, so the
forward model's prediction of that plan (the audit record's `chosen_predicted`) meets the ground truth's
realization of it (OUT/replay.duckdb, table `periods`). Per period it prints the predicted and realized mean GPUs
(GPU-hours x 12 for a 5-minute period; count) and SLA-met share (the realized share is over the period's
arrivals, the predicted over the period's offered load), and per market the correlation of the period to period
changes in GPUs (does the model see the autoscaler's scale-outs and scale-downs coming?), at lag 0 and with the
prediction one period late.

    python benchmarks/reference_fleet_error.py OUT [--policy aurelius] [--seed 0] [--json FILE]

Reads only recorded outputs: no simulation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np


def rows(out: Path, policy: str, seed: int) -> list[dict[str, Any]]:
    """Per (market, period) of `policy`'s fallback decisions: predicted and realized GPUs and SLA-met share."""
    audit = duckdb.connect().execute(
        "SELECT market, period_index, record FROM read_parquet(?) WHERE policy = ? AND fallback "
        "ORDER BY market, period_index",
        [str(out / "audit" / "*.parquet"), policy],
    ).fetchall()
    with duckdb.connect(str(out / "replay.duckdb"), read_only=True) as db:
        real = {
            (m, p): (g, a, s)
            for m, p, g, a, s in db.execute(
                "SELECT market, period, gpus_mean, arrivals, sla_met FROM periods "
                "WHERE policy = ? AND seed = ?",
                [policy, seed],
            ).fetchall()
        }
    out_rows = []
    for market, k, rec in audit:
        r = json.loads(rec)
        pred = r["chosen_predicted"]
        if (market, k) not in real or not pred:
            continue
        gpus, arrivals, met = real[(market, k)]
        offered = sum(c["offered"] for c in pred["classes"])
        out_rows.append({
            "market": market, "period": k, "gpus_predicted": pred["gpu_hours"] * 3600.0 / 300.0,
            "gpus_realized": gpus,
            "sla_met_share_predicted": pred["sla_met"] / offered if offered else None,
            "sla_met_share_realized": met / arrivals if arrivals else None,
        })  # fmt: skip
    return out_rows


def summarize(table: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per market: mean GPUs, predicted and realized, the correlation of their period-to-period changes (at lag 0
    and with the prediction one period late), and the mean SLA-met share, predicted and realized."""
    out = {}
    for market in dict.fromkeys(r["market"] for r in table):
        rs = [r for r in table if r["market"] == market]
        gp = np.array([r["gpus_predicted"] for r in rs])
        gr = np.array([r["gpus_realized"] for r in rs])
        dp, dr = np.diff(gp), np.diff(gr)
        met = [(r["sla_met_share_predicted"], r["sla_met_share_realized"]) for r in rs
               if r["sla_met_share_predicted"] is not None and r["sla_met_share_realized"] is not None]  # fmt: skip
        out[market] = {
            "periods": len(rs), "gpus_predicted_mean": float(gp.mean()), "gpus_realized_mean": float(gr.mean()),
            "gpu_change_correlation": _corr(dp, dr), "gpu_change_correlation_one_late": _corr(dp[1:], dr[:-1]),
            "sla_met_share_predicted_mean": float(np.mean([m[0] for m in met])) if met else float("nan"),
            "sla_met_share_realized_mean": float(np.mean([m[1] for m in met])) if met else float("nan"),
        }  # fmt: skip
    return out


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation, nan where either side is constant or too short."""
    return float(np.corrcoef(a, b)[0, 1]) if a.size > 2 and a.std() > 0 and b.std() > 0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a replay's --out directory (audit/ and replay.duckdb)")
    ap.add_argument("--policy", default="aurelius")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the table and the summary here")
    args = ap.parse_args()
    table = rows(args.out, args.policy, args.seed)
    print(f"{'market':<7}{'k':>4}{'GPUs pred':>10}{'real':>7}{'met pred':>10}{'real':>7}")
    for r in table:
        mp, mr = r["sla_met_share_predicted"], r["sla_met_share_realized"]
        print(f"{r['market']:<7}{r['period']:>4}{r['gpus_predicted']:>10.1f}{r['gpus_realized']:>7.1f}"
              f"{mp if mp is not None else float('nan'):>10.3f}{mr if mr is not None else float('nan'):>7.3f}")
    summary = summarize(table)
    for market, s in summary.items():
        print(market, json.dumps({k: round(v, 3) for k, v in s.items()}))
    if args.json:
        Path(args.json).write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                               "summary": summary, "rows": table}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
