"""Print the serving-physics fit quality on held-out measured rows, per dataset and configuration.

Run: python benchmarks/physics_fit.py
Median absolute percentage error (%) on held-out rows (every 5th distinct configuration point) for prefill
(Splitwise prompt_time, AIConfigurator TTFT) and decode (Splitwise token_time, AIConfigurator TPOT).
"""

from __future__ import annotations

import numpy as np

from worldmodel.physics import step_coefficients
from worldmodel.physics.calibrate import MEASURED_CONFIGS, fitted, splitwise_frame, splitwise_rows

HEADER = (
    "dataset",
    "model",
    "gpu",
    "tp",
    "prec",
    "n_pre",
    "n_dec",
    "pre_held%",
    "dec_held%",
    "pre_trn%",
    "dec_trn%",
)


def main() -> None:
    print("{:15s} {:14s} {:4s} {:>2s} {:4s} {:>5s} {:>5s} {:>9s} {:>9s} {:>8s} {:>8s}".format(*HEADER))
    pooled: dict[tuple[str, str], list[float]] = {}
    for cfg in MEASURED_CONFIGS:
        f = fitted(*cfg)
        for metric in ("prefill", "decode"):
            rows = getattr(f, metric)
            sel = rows.held_out
            pooled.setdefault((cfg[0], metric), []).extend(
                np.abs(rows.x[sel] @ f.theta / rows.y_s[sel] - 1) * 100
            )
        n_pre, n_dec = int(f.prefill.held_out.sum()), int(f.decode.held_out.sum())
        errs = (f.mape("prefill"), f.mape("decode"), f.mape("prefill", False), f.mape("decode", False))
        print(
            f"{cfg[0]:15s} {cfg[1]:14s} {cfg[2]:4s} {cfg[3]:2d} {cfg[4]:4s} {n_pre:5d} {n_dec:5d} "
            "{:9.1f} {:9.1f} {:8.1f} {:8.1f}".format(*errs)
        )
    print("\npooled held-out median APE (%):")
    for (ds, metric), ape in sorted(pooled.items()):
        print(f"  {ds:15s} {metric:8s} {np.median(ape):5.1f}  (n={len(ape)})")
    capped = [splitwise_rows("H100", tp, hardware="h100-80gb-pcap")[0].y_s.mean() for tp in (2, 4, 8)]
    plain = [splitwise_rows("H100", tp)[0].y_s.mean() for tp in (2, 4, 8)]
    sw = splitwise_frame()
    same = sw.filter(hardware="h100-80gb-pcap")["token_time"].equals(
        sw.filter(hardware="h100-80gb")["token_time"]
    )
    print(
        f"\nSplitwise 70% power cap: prefill x{np.mean(np.array(capped) / plain):.2f}; "
        f"token_time identical: {same}"
    )
    c = step_coefficients("llama-3.1-70b", "H100", 4, "bf16", 1980.0)
    print("\nllama-3.1-70b H100 TP4 bf16 @1980 MHz (truth), decode ms per iteration at context 576:")
    for b in (1, 16, 64, 128):
        print(f"  batch {b:3d}: {1e3 * (c.base_s + b * c.per_seq_s + b * 576 * c.per_kv_token_s):6.1f} ms")
    for p in (1024, 4096):
        ms = 1e3 * (c.base_s + p * c.per_prefill_token_s + p * p / 2 * c.per_prefill_attn_s)
        print(f"  prefill {p} tokens: {ms:6.1f} ms")


if __name__ == "__main__":
    main()
