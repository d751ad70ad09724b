"""The worked example's history (issue 19, item 6), then the operator calibration on it against the hidden factors.

    python benchmarks/make_history.py --out out/example                 # 1 h of ERCOT arrivals (~40k requests)
    python benchmarks/make_history.py --out out/example --periods 36    # the 3-hour window (~120k requests)

Writes OUT/history/<kind>.parquet (the `--emit-observations` layout) and OUT/truth.json (the generating
factors, beside the history, not in it); then fits the calibration on OUT/history alone, writes its report to
OUT/calibration.json and prints each fitted factor against the hidden one (truth.json is read only for that
comparison, after the fit). With --results FILE the comparison is also written there as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import polars as pl

from streams.calibration import calibrate
from streams.worked_example import ExampleSpec, generate_history


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--periods", type=int, default=ExampleSpec.periods, help="5-minute periods of arrivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", type=Path, default=None, help="write the recovery table here (JSON)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    history = generate_history(args.out, ExampleSpec(periods=args.periods, seed=args.seed))
    t_gen = time.perf_counter() - t0
    records = {k: pl.read_parquet(history / f"{k}.parquet") for k in ("completions", "telemetry", "fleet_events")}
    t0 = time.perf_counter()
    cal = calibrate(records["completions"], records["telemetry"], records["fleet_events"])
    t_fit = time.perf_counter() - t0
    (args.out / "calibration.json").write_text(json.dumps(cal.as_dict(), indent=2))
    truth = json.loads((args.out / "truth.json").read_text())
    print(f"history: {history} ({truth['requests']} requests, generated in {t_gen:.1f} s; fit in {t_fit:.1f} s)")
    print(f"{'model':<15}{'gpu':<6}{'factor':<20}{'fitted':>8}{'hidden':>8}{'error':>8}  tag            n     rms")
    rows = []
    for pool in cal.pools:
        for f in pool.factors:
            hidden = truth["factors"][f.name]
            err = f.value / hidden - 1.0
            rows.append({"model": pool.model, "gpu": pool.gpu, **f.__dict__, "hidden": hidden, "error": err})
            print(
                f"{pool.model:<15}{pool.gpu:<6}{f.name:<20}{f.value:>8.4f}{hidden:>8.3f}{err:>+8.2%}  {f.tag:<14}"
                f"{f.n:>6} {f.residual_rms:>7.3f} {f.residual_unit}"
            )
    if args.results:
        spec = {"periods": args.periods, "seed": args.seed, "requests": truth["requests"]}
        out = {"spec": spec, "generate_s": t_gen, "fit_s": t_fit, "factors": rows, "dropped": dict(cal.dropped)}
        args.results.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
