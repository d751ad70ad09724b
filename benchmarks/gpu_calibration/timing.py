"""Timing primitives: device sync, per-iteration timing with medians (ms), CUDA-graph capture, relative error."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch


def sync(dev: torch.device) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def stats(ms: list[float]) -> dict:
    """Median, p10, p90 and min of per-iteration times (ms), with the count n."""
    s = sorted(ms)
    n = len(s)
    return {
        "median_ms": statistics.median(s),
        "p10_ms": s[int(0.1 * (n - 1))],
        "p90_ms": s[int(math.ceil(0.9 * (n - 1)))],
        "min_ms": s[0],
        "n": n,
    }


def bench(fn: Callable[[], object], dev: torch.device, warmup: int, iters: int) -> dict:
    """Per-iteration times: CUDA events on the GPU, perf_counter on the CPU; warm-up excluded."""
    for _ in range(warmup):
        fn()
    sync(dev)
    if dev.type == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize(dev)
        ms = [a.elapsed_time(b) for a, b in ev]
    else:
        ms = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t) * 1e3)
    return stats(ms)


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Capture fn() (one decode step) into a CUDA graph after 3 warm-up calls on a side stream; replay() runs it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN if out is not finite."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))
