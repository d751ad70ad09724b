"""A measured H100 run of benchmarks/gpu_calibration beside the ground truth's H100 physics (Llama-3.1-8B, TP1).

Usage: python benchmarks/gpu_vs_truth.py [benchmarks/results/gpu_calibration_h100.json ...]

For every shape the run measured (decode of b sequences at context 1,024; one causal prefill of p tokens) it
prints the truth's step time (`worldmodel.physics.step_coefficients`, the pool the simulator runs) beside the
measured one, the fp8 / bf16 ratios of both, and the power and clock figures: idle, batch-64 decode at the
measured step's HBM utilization and at the truth's own (and by the "h100-measured" sensitivity fit, whose H100
intercept is fitted to these runs), 8k prefill, and the clock a busy prefill holds under
the 700 W limit (`schemas.fleet.POWER_LIMITED_CLOCK_MHZ`). Several files: one column per run.

The measured kernels are plain PyTorch, not a serving engine, so measured step times are a lower bound on an
engine's speed (and fp8 gains a lower bound on an engine's gain); the truth's 8B bf16 terms are the
TensorRT-LLM fit (benchmark-calibrated), its fp8 terms modeled (docs/physics.md). Power and clock are
properties of the board, so those rows compare like with like.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from schemas.fleet import power_limited_clock_mhz
from schemas.models import model_spec
from worldmodel.physics import gpu_power_w, step_coefficients
from worldmodel.physics.tables import HBM_EFFICIENCY, gpu_spec

MODEL, GPU, TP, CLOCK_MHZ = "llama-3.1-8b", "H100", 1, 1980.0
DEFAULT_RUNS = ("benchmarks/results/gpu_calibration_h100.json", "benchmarks/results/gpu_calibration_h100_repeat.json")


def decode_ms(prec: str, batch: int, ctx: int) -> float:
    """The truth's decode step (ms) of `batch` sequences at context `ctx` tokens."""
    c = step_coefficients(MODEL, GPU, TP, prec, CLOCK_MHZ)
    return 1e3 * (c.base_s + batch * c.per_seq_s + batch * ctx * c.per_kv_token_s)


def prefill_ms(prec: str, tokens: int) -> float:
    """The truth's one-iteration prefill (ms) of a fresh prompt of `tokens` tokens (mean context tokens / 2)."""
    c = step_coefficients(MODEL, GPU, TP, prec, CLOCK_MHZ)
    return 1e3 * (c.base_s + tokens * c.per_prefill_token_s + c.per_prefill_attn_s * tokens * tokens / 2)


def decode_power_w(prec: str, batch: int, ctx: int, step_ms: float, fit: str = "record") -> tuple[float, float]:
    """(W, HBM utilization) of a busy decode replica, u as the simulator computes it, over a step of `step_ms`,
    by the decode power fit `fit` (worldmodel.physics.power.DECODE_POWER_FITS)."""
    c = step_coefficients(MODEL, GPU, TP, prec, CLOCK_MHZ)
    hbm = gpu_spec(GPU).hbm_tb_s * 1e12
    read_s = model_spec(MODEL).weight_bytes(prec) / TP / hbm + HBM_EFFICIENCY * c.per_kv_token_s * batch * ctx
    u = min(1.0, read_s / (step_ms * 1e-3))
    w = gpu_power_w(GPU, 1.0, CLOCK_MHZ, prefill_share=0.0, hbm_util=u, batch=batch, decode_power_fit=fit)
    return w, u


def phase(run: dict, name: str) -> dict:
    """One sustained power phase of a run (nvidia-smi means)."""
    return next(p for p in run["power"]["phases"] if p["phase"] == name)


def rows(run: dict) -> list[tuple[str, float, float]]:
    """(figure, measured, truth) for every shape and phase of one run."""
    out: list[tuple[str, float, float]] = []
    for d in run["decode"]:
        b, ctx = d["batch"], d["ctx"]
        out.append((f"decode b{b} bf16 ms", d["bf16_ms"], decode_ms("bf16", b, ctx)))
        out.append((f"decode b{b} fp8 gain x", d["fp8_speedup"], decode_ms("bf16", b, ctx) / decode_ms("fp8", b, ctx)))
    for p in run["prefill"]:
        n = p["tokens"]
        out.append((f"prefill {n} bf16 ms", p["bf16_ms"], prefill_ms("bf16", n)))
        out.append((f"prefill {n} fp8 gain x", p["fp8_speedup"], prefill_ms("bf16", n) / prefill_ms("fp8", n)))
    out.append(("idle W", phase(run, "idle")["power_w_mean"], gpu_spec(GPU).idle_w.value))
    b, ctx = run["config"]["power_batch"], run["config"]["ctx"]
    for prec in ("bf16", "fp8"):
        ph = phase(run, f"decode_b{b}_{prec}")
        for label, step_ms, fit in (
            ("measured step", ph["unit_ms"], "record"),
            ("its own step", decode_ms(prec, b, ctx), "record"),
            ("measured step, h100-measured fit", ph["unit_ms"], "h100-measured"),
        ):
            w, u = decode_power_w(prec, b, ctx, step_ms, fit)
            out.append((f"decode b{b} {prec} W (truth at {label}, u {u:.2f})", ph["power_w_mean"], w))
    n = run["config"]["power_prefill"]
    for prec in ("bf16", "fp8"):
        ph = phase(run, f"prefill_{n}_{prec}")
        out.append((f"prefill {n} {prec} W", ph["power_w_mean"], gpu_power_w(GPU, 1.0, CLOCK_MHZ)))
        f_pl = power_limited_clock_mhz(GPU)
        out.append((f"prefill {n} {prec} SM MHz (power-limited)", ph["sm_clock_mhz_mean"], f_pl))
    return out


def main(paths: list[str]) -> int:
    """Print one table: figure, truth, then measured and measured / truth per run."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for p, r in zip(paths, runs, strict=True):
        name = r["environment"]["device_name"]
        print(f"# {p}: {name}, {r['measured_at']}, power limit {r['nvidia_smi_static']['power.limit']} W"
              + ("" if GPU in name else f" (not an {GPU}: its power and clock rows are another board's)"))  # fmt: skip
    table = [rows(r) for r in runs]
    width = max(len(name) for name, _, _ in table[0])
    head = "".join(f"  {'measured':>9} {'m/truth':>7}" for _ in runs)
    print(f"{'figure':<{width}} {'truth':>9}{head}")
    for i, (name, _, truth) in enumerate(table[0]):
        cells = "".join(f"  {t[i][1]:>9.3f} {t[i][1] / truth:>7.3f}" for t in table)
        print(f"{name:<{width}} {truth:>9.3f}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(DEFAULT_RUNS)))
