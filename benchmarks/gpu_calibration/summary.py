"""Summary of a run's results: the ratios it exists for (fp8 speed-up, batch scaling, power over idle) and the
printed table (ms, GB/s, tokens/s, TFLOP/s, W, MHz, J per unit)."""

from __future__ import annotations

import contextlib

from .config import Cfg


def ratios(res: dict) -> dict:
    """fp8/bf16 speed-ups, decode time over the smallest batch, graph over eager, prefill ms/token, and power
    over idle and over the power limit, from res's decode, prefill and power sections."""
    r: dict = {}
    dec = {row["batch"]: row for row in res.get("decode", [])}
    if dec:
        base = min(dec)
        r["decode_fp8_speedup_by_batch"] = {b: row.get("fp8_speedup") for b, row in dec.items()}
        r["decode_bf16_ms_over_batch_min"] = {
            b: row["bf16_ms"] / dec[base]["bf16_ms"]
            for b, row in dec.items()
            if row.get("bf16_ms") and dec[base].get("bf16_ms")
        }
        r["decode_graph_vs_eager_bf16"] = {
            b: row["bf16_eager_ms"] / row["bf16_graph_ms"]
            for b, row in dec.items()
            if row.get("bf16_graph_ms") and row.get("bf16_eager_ms")
        }
    pre = res.get("prefill", [])
    if pre:
        r["prefill_fp8_speedup_by_tokens"] = {row["tokens"]: row.get("fp8_speedup") for row in pre}
        r["prefill_bf16_ms_per_token"] = {row["tokens"]: row.get("bf16_ms_per_token") for row in pre}
        r["prefill_fp8_ms_per_token"] = {row["tokens"]: row.get("fp8_ms_per_token") for row in pre}
    ph = {p["phase"]: p for p in res.get("power", {}).get("phases", [])}

    def pw(name: str) -> float | None:
        p = ph.get(name) or {}
        return p.get("power_w_mean") or p.get("nvml_power_w_mean") or p.get("energy_counter_power_w")

    idle = pw("idle")
    if idle:
        r["power_w"] = {k: pw(k) for k in ph}
        r["power_over_idle"] = {k: (pw(k) / idle if pw(k) else None) for k in ph}
        tdp = None
        with contextlib.suppress(Exception):
            tdp = float(res.get("nvidia_smi_static", {}).get("power.limit"))
        if tdp:
            r["power_over_limit"] = {k: (pw(k) / tdp if pw(k) else None) for k in ph}
    return r


def table(res: dict, cfg: Cfg) -> str:
    """The printed summary: environment, ceilings, checks, decode, prefill and power tables, errors, skips."""
    lines = []
    env = res.get("environment", {})
    st = res.get("nvidia_smi_static", {})
    lines.append(
        f"device {env.get('device_name', env.get('device_type'))}  driver {st.get('driver_version')}  "
        f"torch {env.get('torch')}  CUDA {env.get('cuda_runtime')}  power.limit {st.get('power.limit')} W"
        f"  max SM {st.get('clocks.max.sm')} MHz"
    )
    ce = res.get("ceilings")
    if ce:
        lines.append("ceilings: " + "  ".join(f"{k} {v:.0f}" for k, v in ce.items()))
    ch = res.get("checks", {})
    lines.append(
        "checks: "
        + ("ok" if ch.get("ok") else f"FAILED {ch.get('failed')}")
        + "  "
        + "  ".join(f"{k}={v:.1e}" for k, v in ch.items() if isinstance(v, float))
    )
    lines.append("")
    lines.append(f"DECODE (ctx {cfg.ctx}, full {cfg.layers}-layer step; graph replay where available)")
    lines.append(
        f"{'batch':>6} {'bf16 ms':>9} {'fp8 ms':>9} {'fp8 x':>6} {'bf16 eager':>11} {'fp8 eager':>10} "
        f"{'bf16 GB/s':>10} {'bf16 tok/s':>11} {'vs b1':>6}"
    )
    dec = res.get("decode", [])
    b1 = dec[0].get("bf16_ms") if dec else None

    def f(v, w, p=3):
        return f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

    for row in dec:
        lines.append(
            f"{row['batch']:>6} {f(row.get('bf16_ms'), 9)} {f(row.get('fp8_ms'), 9)} "
            f"{f(row.get('fp8_speedup'), 6, 2)} {f(row.get('bf16_eager_ms'), 11)} "
            f"{f(row.get('fp8_eager_ms'), 10)} {f(row.get('bf16_achieved_gbps'), 10, 0)} "
            f"{f(row.get('bf16_tok_per_s'), 11, 0)} "
            f"{f(row['bf16_ms'] / b1 if b1 and row.get('bf16_ms') else None, 6, 2)}"
        )
    lines.append("")
    lines.append("PREFILL (one sequence, causal)")
    lines.append(
        f"{'tokens':>6} {'bf16 ms':>9} {'fp8 ms':>9} {'fp8 x':>6} {'bf16 ms/tok':>12} "
        f"{'fp8 ms/tok':>11} {'bf16 TF/s':>10} {'fp8 TF/s':>9}"
    )
    for row in res.get("prefill", []):
        lines.append(
            f"{row['tokens']:>6} {f(row.get('bf16_ms'), 9, 2)} {f(row.get('fp8_ms'), 9, 2)} "
            f"{f(row.get('fp8_speedup'), 6, 2)} {f(row.get('bf16_ms_per_token'), 12, 5)} "
            f"{f(row.get('fp8_ms_per_token'), 11, 5)} {f(row.get('bf16_tflops'), 10, 0)} "
            f"{f(row.get('fp8_tflops'), 9, 0)}"
        )
    pw = res.get("power", {}).get("phases", [])
    if pw:
        lines.append("")
        lines.append("POWER (nvidia-smi power.draw mean over the phase after a settling skip; E-ctr = NVML energy)")
        lines.append(
            f"{'phase':>20} {'s':>5} {'n':>4} {'W':>7} {'W inst':>7} {'W E-ctr':>8} {'SM MHz':>7} "
            f"{'util%':>6} {'T max':>6} {'J/unit':>8} unit"
        )
        for p in pw:
            lines.append(
                f"{p['phase']:>20} {p['duration_s']:>5.1f} {p['smi_samples']:>4} "
                f"{f(p.get('power_w_mean'), 7, 1)} {f(p.get('power_instant_w_mean'), 7, 1)} "
                f"{f(p.get('energy_counter_power_w'), 8, 1)} {f(p.get('sm_clock_mhz_mean'), 7, 0)} "
                f"{f(p.get('util_gpu_mean'), 6, 0)} {f(p.get('temp_c_max'), 6, 0)} "
                f"{f(p.get('energy_j_per_unit'), 8, 3)} {p.get('unit', '')}"
            )
    if res["errors"]:
        lines.append("")
        lines.append(f"ERRORS ({len(res['errors'])}): " + "; ".join(e["where"] for e in res["errors"]))
    if res["skipped"]:
        lines.append("SKIPPED: " + "; ".join(res["skipped"]))
    return "\n".join(lines)
