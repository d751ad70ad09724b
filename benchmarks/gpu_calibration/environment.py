"""Device probe: the device, software versions, the run's config and nvidia-smi's static fields."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from .sampling import smi_static

if TYPE_CHECKING:
    from .runner import Runner


def probe(r: Runner) -> None:
    """Pick the device (CUDA unless --dry-run; exits without one) and record environment and config in res."""
    a = r.args
    dev = torch.device("cpu" if a.dry_run or not torch.cuda.is_available() else "cuda:0")
    if not a.dry_run and dev.type != "cuda":
        raise SystemExit("no CUDA device visible; use --dry-run for the CPU check")
    r.dev = dev
    r.dtype = torch.bfloat16
    env = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device_type": dev.type,
    }
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(
            {
                "device_name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "sm_count": p.multi_processor_count,
                "total_memory_gib": round(p.total_memory / 2**30, 2),
                "l2_cache_mb": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
                "cudnn": torch.backends.cudnn.version(),
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }
        )
        if not any(g in p.name for g in ("H100", "H200")):
            r.res["device_warning"] = f"expected an H100 or H200 (Hopper), found {p.name}"
    r.res["environment"] = env
    c = r.cfg
    r.res["config"] = {
        **{k: v for k, v in asdict(c).items() if k != "prefill_iters"},
        "prefill_iters": {str(k): v for k, v in c.prefill_iters.items()},
        "params_total": c.params(),
        "params_linear": c.linear_params(),
        "dtype": "bfloat16",
        "fp8": (
            "float8_e4m3fn weights, per-tensor weight scale; activations quantized with a static per-tensor "
            "scale calibrated once on a bf16 prefill (eager multiply+clamp+cast, unfused); "
            "torch._scaled_mm with use_fast_accum=True, bf16 output; M padded to a multiple of 16. "
            "Attention, KV cache, norms and lm_head stay bf16 (KV-cache fp8 not measured)."
        ),
        "structure": (
            "fused QKV [6144x4096] and gate_up [28672x4096] projections; RMSNorm; rotate-half RoPE "
            "(theta 500000); SDPA attention; residual adds; lm_head on every decode row and on the "
            "last prefill token; no embedding gather, no sampling"
        ),
        "timing": (
            "per-iteration CUDA events, warm-up excluded, median of n; decode also as CUDA-graph replay "
            "of one whole step"
        ),
        "decode_kv": f"KV cache preallocated for batch {max(c.batches)} x {c.ctx + 1} positions per layer; step "
        f"writes K/V at position {c.ctx} and attends over {c.ctx + 1} keys",
    }
    if dev.type == "cuda" and not a.no_smi and shutil.which("nvidia-smi"):
        with contextlib.suppress(Exception):
            r.res["nvidia_smi_static"] = smi_static(a.smi_index)
    r.log(f"device {env.get('device_name', dev.type)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
