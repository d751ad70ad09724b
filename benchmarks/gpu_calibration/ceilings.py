"""Hardware ceilings on random data: device-to-device copy bandwidth (GB/s) and 8192^3 GEMM rates (TFLOP/s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .timing import bench

if TYPE_CHECKING:
    from .runner import Runner


def ceilings(r: Runner) -> None:
    """Copy bandwidth (GB/s) and matrix rates (TFLOP/s) on random data, to read the model numbers against."""
    dev = r.dev
    if dev.type != "cuda":
        r.res["skipped"].append("ceilings (CPU)")
        return
    out: dict = {}
    n = 1 << 30  # 1 Gi bf16 elements = 2 GiB
    a = torch.randn(n, device=dev, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    st = bench(lambda a=a, b=b: b.copy_(a), dev, 3, 10)
    out["d2d_copy_gbps"] = 2 * a.numel() * 2 / (st["median_ms"] * 1e-3) / 1e9
    del a, b
    s = 8192
    x = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    y = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    st = bench(lambda x=x, y=y: x @ y, dev, 3, 10)
    out["bf16_gemm_8192_tflops"] = 2 * s**3 / (st["median_ms"] * 1e-3) / 1e12
    if r.fp8_ok:
        x8 = x.to(torch.float8_e4m3fn)
        y8 = y.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev, dtype=torch.float32)
        st = bench(
            lambda: torch._scaled_mm(x8, y8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True),
            dev,
            3,
            10,
        )
        out["fp8_gemm_8192_tflops"] = 2 * s**3 / (st["median_ms"] * 1e-3) / 1e12
    del x, y
    torch.cuda.empty_cache()
    r.res["ceilings"] = out
    r.log("ceilings: " + ", ".join(f"{k}={v:.0f}" for k, v in out.items()))
