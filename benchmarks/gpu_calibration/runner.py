"""Run state and bookkeeping: the results dict, time budget, log lines, errors, phase marks and the JSON file."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from .config import Cfg, dry_cfg

if TYPE_CHECKING:
    import torch

    from .model import KV, Model
    from .sampling import NvmlSampler, SmiSampler

SCRIPT = "benchmarks/gpu_calibration"


def now_iso() -> str:
    """Current UTC time, ISO 8601 to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class Runner:
    """One calibration run: the config from the flags, the results dict (res) and what the sections share."""

    dev: torch.device
    dtype: torch.dtype
    model: Model
    kv: KV  # decode cache: max batch x (ctx + 1) positions, random
    kv_pre: KV  # prefill cache: 1 sequence x the longest prefill
    fp8_ok: bool

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.cfg = dry_cfg() if args.dry_run else Cfg()
        if args.no_lm_head:
            self.cfg.lm_head = False
        self.cfg.decode_attn = args.decode_attn
        if args.phase_s is not None:
            self.cfg.phase_s = args.phase_s
        self.t_start = time.time()
        self.out_dir = Path(args.out or os.environ.get("OUT") or "./out")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.res: dict = {
            "provenance": "measured",
            "script": SCRIPT,
            "measured_at": now_iso(),
            "note": (
                "Measured on one lent GPU (environment.device_name), random weights in Llama-3.1-8B shapes, "
                "PyTorch eager/CUDA-graph kernels (not a serving engine): a lower bound on an engine's speed. "
                "Use as a cross-check of ratios (fp8/bf16 speed-up, decode batch scaling, prefill per-token "
                "cost, power at idle vs decode vs prefill) and, on an H100, of the H100 power and clock "
                "figures; not as engine step coefficients. Clocks and power limits left as found."
            ),
            "dry_run": bool(args.dry_run),
            "errors": [],
            "skipped": [],
        }
        self.smi: SmiSampler | None = None
        self.nvml: NvmlSampler | None = None
        self.phases: list[dict] = []  # marks of the power phases: name, t0/t1 (epoch s), e0/e1 (mJ), work
        self.power_graph: tuple | None = None  # (CUDA graph, its input) of the bf16 power-batch decode step

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.time() - self.t_start

    def left(self) -> float:
        """Seconds left of --budget-s."""
        return self.args.budget_s - self.elapsed()

    def log(self, msg: str) -> None:
        """Print msg prefixed with the elapsed seconds."""
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def err(self, where: str, e: BaseException) -> None:
        """Record an error (repr and short trace) under res["errors"] and log it; the run goes on."""
        self.res["errors"].append(
            {"where": where, "error": repr(e)[:500], "trace": traceback.format_exc(limit=4)[-1500:]}
        )
        self.log(f"ERROR in {where}: {e!r}"[:300])

    def save(self) -> Path:
        """Write res to out_dir/gpu_calibration.json atomically; returns the path."""
        self.res["elapsed_s"] = round(self.elapsed(), 2)
        p = self.out_dir / "gpu_calibration.json"
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.res, indent=2, default=str))
        tmp.replace(p)
        return p

    def mark(self, name: str, t0: float, t1: float, e0: float | None, e1: float | None, **extra) -> None:
        """Record a power phase: wall times t0/t1 (epoch s), energy counter e0/e1 (mJ), extra fields."""
        self.phases.append({"name": name, "t0": t0, "t1": t1, "e0_mj": e0, "e1_mj": e1, **extra})

    def energy(self) -> float | None:
        """NVML board energy counter (mJ), None without it."""
        return self.nvml.energy_mj() if self.nvml is not None and self.nvml.energy_ok else None
