"""Latency sweeps: full-stack decode step per batch (eager and CUDA graph) and causal prefill per length, bf16/fp8."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from .timing import bench, capture_graph

if TYPE_CHECKING:
    from .runner import Runner


def _precisions(r: Runner) -> list[str]:
    """bf16, and fp8 where its set-up worked."""
    return ["bf16", "fp8"] if r.fp8_ok else ["bf16"]


def _sizes(r: Runner, sizes: list[int], min_left_s: float, what: str) -> Iterator[int]:
    """The sizes in order while min_left_s seconds of the budget are left; the first one cut is recorded as skipped."""
    for n in sizes:
        if r.left() < min_left_s:
            r.res["skipped"].append(f"{what} {n}+ (time budget)")
            return
        yield n


def _add_row(r: Runner, rows: list[dict], row: dict, line: str) -> None:
    """Add fp8_speedup (bf16 ms / fp8 ms) where both ran, append row, log line with the speed-up, save."""
    if row.get("fp8_ms") and row.get("bf16_ms"):
        row["fp8_speedup"] = row["bf16_ms"] / row["fp8_ms"]
    rows.append(row)
    r.log(line + (f"  fp8 x{row['fp8_speedup']:.2f}" if "fp8_speedup" in row else ""))
    r.save()


def decode(r: Runner) -> None:
    """Decode step time (ms) at each batch over a ctx-token KV cache; tokens/s and achieved GB/s in res["decode"]."""
    c, dev, m = r.cfg, r.dev, r.model
    rows: list[dict] = []
    r.res["decode"] = rows
    precisions = _precisions(r)
    for bsz in _sizes(r, c.batches, 60, "decode batch"):
        row: dict = {"batch": bsz, "ctx": c.ctx}
        x = torch.randn(bsz, c.hidden, device=dev, dtype=r.dtype, generator=m.gen)
        kv_bytes = bsz * (c.ctx + 1) * c.layers * 2 * c.kv_heads * c.head_dim * 2
        row["kv_read_gb"] = kv_bytes / 1e9
        for prec in precisions:
            fp8 = prec == "fp8"

            def step(x=x, fp8=fp8):
                return m.decode(x, r.kv, c.ctx, fp8)

            wb = m.weight_bytes(fp8)
            try:
                st = bench(step, dev, c.warmup, c.iters)
                row[f"{prec}_eager_ms"] = st["median_ms"]
                row[f"{prec}_eager"] = st
            except Exception as e:  # noqa: BLE001
                r.err(f"decode eager {prec} b{bsz}", e)
            if dev.type == "cuda" and not r.args.no_graphs:
                try:
                    g = capture_graph(step)
                    st = bench(g.replay, dev, c.warmup, c.iters)
                    row[f"{prec}_graph_ms"] = st["median_ms"]
                    row[f"{prec}_graph"] = st
                    if bsz == c.power_batch and prec == "bf16":
                        r.power_graph = (g, x)  # keep the graph's input tensor alive
                    else:
                        del g
                except Exception as e:  # noqa: BLE001
                    r.err(f"decode graph {prec} b{bsz}", e)
            best = row.get(f"{prec}_graph_ms", row.get(f"{prec}_eager_ms"))
            if best:
                row[f"{prec}_ms"] = best
                row[f"{prec}_tok_per_s"] = bsz / (best * 1e-3)
                row[f"{prec}_min_bytes_gb"] = (wb + kv_bytes) / 1e9
                row[f"{prec}_achieved_gbps"] = (wb + kv_bytes) / (best * 1e-3) / 1e9
        line = f"decode b={bsz:4d}: " + "  ".join(
            f"{p} {row.get(p + '_ms', math.nan):7.3f} ms (eager {row.get(p + '_eager_ms', math.nan):.3f})"
            for p in precisions
        )
        _add_row(r, rows, row, line)
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def prefill(r: Runner) -> None:
    """Prefill time (ms) of one sequence per length; ms/token and TFLOP/s (linears + causal attention)."""
    c, dev, m = r.cfg, r.dev, r.model
    rows: list[dict] = []
    r.res["prefill"] = rows
    precisions = _precisions(r)
    for t in _sizes(r, c.prefill, 45, "prefill"):
        row: dict = {"tokens": t}
        x = torch.randn(t, c.hidden, device=dev, dtype=r.dtype, generator=m.gen)
        lin_flops = 2 * c.linear_params() * t
        attn_flops = c.layers * 4 * c.q_heads * c.head_dim * t * t / 2  # causal: QK^T and PV, half the square
        row["linear_tflop"] = lin_flops / 1e12
        row["attn_tflop"] = attn_flops / 1e12
        for prec in precisions:
            fp8 = prec == "fp8"
            try:
                st = bench(
                    lambda x=x, fp8=fp8: m.prefill(x, r.kv_pre, fp8),
                    dev,
                    max(1, c.warmup // 2),
                    c.prefill_iters.get(t, 10),
                )
                row[f"{prec}_ms"] = st["median_ms"]
                row[prec] = st
                row[f"{prec}_ms_per_token"] = st["median_ms"] / t
                row[f"{prec}_tflops"] = (lin_flops + attn_flops) / (st["median_ms"] * 1e-3) / 1e12
            except Exception as e:  # noqa: BLE001
                r.err(f"prefill {prec} {t}", e)
        line = f"prefill {t:5d}: " + "  ".join(f"{p} {row.get(p + '_ms', math.nan):8.2f} ms" for p in precisions)
        _add_row(r, rows, row, line)
