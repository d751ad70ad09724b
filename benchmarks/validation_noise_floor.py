"""How well one workload seed's realized outcomes predict another's: the noise floor of the validation targets.

Usage: python benchmarks/validation_noise_floor.py A/validation.json B/validation.json

Both files come from `aurelius worldmodel-validate` with the same markets and window flags and different
`--seed`: the same expected arrival rates and plans, another Poisson draw of arrivals and another offset into
the traces' request sizes. Per market and plan, over the periods and classes of B, it prints the share of
cells where A's realized violation rate, taken as a prediction of B's, meets the validation rule (20%
relative above a 1% realized rate, else 0.5 pp), beside the forward model's own share on B; and near
saturation (realized 1-20%, interactive classes) the median relative difference of A's and B's realized p99
TTFT, beside the model's median error on B. A target a second realization of the same workload cannot meet
measures noise, not the model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import median

from streams.replay.validate_cli import NEAR_SATURATION, violation_error


def _plans(market: dict) -> dict[str, list[dict]]:
    return {"observational": market["observational"], **{k: v["periods"] for k, v in market["imposed"].items()}}


def compare(a: dict, b: dict) -> list[dict]:
    """Rows per market and plan: cells, seed-to-seed and model shares within target, near-saturation p99s."""
    rows = []
    lo, hi = NEAR_SATURATION
    for m, mb in b["markets"].items():
        pa = _plans(a["markets"][m])
        for plan, periods in _plans(mb).items():
            ref = {r["period_index"]: r for r in pa.get(plan, [])}
            s2s, model, tt_s2s, tt_model = [], [], [], []
            for r in periods:
                q = ref.get(r["period_index"])
                for c, cell in r["classes"].items():
                    if q is None or c not in q["classes"]:
                        continue
                    real = cell["violation_rate"]["realized"]
                    s2s.append(violation_error(q["classes"][c]["violation_rate"]["realized"], real)[2])
                    model.append(bool(cell["violation_rate"]["ok"]))
                    x, y = q["classes"][c]["ttft_p99_ms"]["realized"], cell["ttft_p99_ms"]["realized"]
                    if c != "batch" and lo <= real <= hi and x and y:
                        tt_s2s.append(abs(x - y) / y)
                        if cell["ttft_p99_ms"].get("rel_error") is not None:
                            tt_model.append(cell["ttft_p99_ms"]["rel_error"])
            if s2s:
                rows.append({
                    "market": m, "plan": plan, "cells": len(s2s),
                    "seed_to_seed_ok": sum(s2s) / len(s2s), "model_ok": sum(model) / len(model),
                    "near_saturation_cells": len(tt_s2s),
                    "ttft_p99_seed_to_seed": median(tt_s2s) if tt_s2s else None,
                    "ttft_p99_model": median(tt_model) if tt_model else None,
                })
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="validation.json of one seed")
    p.add_argument("b", type=Path, help="validation.json of another seed (the one scored)")
    args = p.parse_args()
    rows = compare(json.loads(args.a.read_text()), json.loads(args.b.read_text()))
    print("| market | plan | cells | violation within target: seed-to-seed | model | near-saturation cells "
          "| p99 TTFT rel. difference: seed-to-seed | model error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = [f"{x:.2f}" if x is not None else "-" for x in (r["ttft_p99_seed_to_seed"], r["ttft_p99_model"])]
        print(f"| {r['market']} | {r['plan']} | {r['cells']} | {r['seed_to_seed_ok']:.2f} | {r['model_ok']:.2f} "
              f"| {r['near_saturation_cells']} | {f[0]} | {f[1]} |")


if __name__ == "__main__":
    main()
