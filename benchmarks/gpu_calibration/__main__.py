"""Command line: `python3 -m benchmarks.gpu_calibration [flags]` from the repo root; runs the sections in order."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

from . import __doc__ as PACKAGE_DOC
from .build import build, checks
from .ceilings import ceilings
from .environment import probe
from .latency import decode, prefill
from .power import finish_power, idle, power
from .runner import Runner
from .sampling import start_samplers
from .summary import ratios, table


def run(r: Runner) -> int:
    """All sections; a failing section is recorded and the next runs. Exit status 1 on errors or failed checks."""
    probe(r)
    start_samplers(r)
    try:
        with torch.inference_mode():
            build(r)
            idle(r, "idle")  # weights and KV resident, no kernels running
            for name, fn in (
                ("checks", checks),
                ("ceilings", ceilings),
                ("decode", decode),
                ("prefill", prefill),
                ("power", power),
            ):
                try:
                    fn(r)
                except Exception as e:  # noqa: BLE001
                    r.err(name, e)
                r.save()
    finally:
        for s in (r.smi, r.nvml):
            if s is not None:
                with contextlib.suppress(Exception):
                    s.stop()
        with contextlib.suppress(Exception):
            finish_power(r)
        with contextlib.suppress(Exception):
            r.res["ratios"] = ratios(r.res)
        path = r.save()
    print("\n" + table(r.res, r.cfg))
    print(f"\nwrote {path} ({r.elapsed():.1f} s total)")
    return 1 if r.res["errors"] or not r.res.get("checks", {}).get("ok", False) else 0


def main() -> None:
    """Parse the flags and run; exits with run's status."""
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_calibration", description=PACKAGE_DOC.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny 2-layer model on the CPU, no nvidia-smi")
    ap.add_argument("--out", default=None, help="output folder (default: $OUT or ./out)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="skip remaining sections past this (default 200)")
    ap.add_argument("--phase-s", type=float, default=None, help="sustained power phase length (default 8 s)")
    ap.add_argument("--decode-attn", choices=["fold", "gqa"], default="fold")
    ap.add_argument("--no-lm-head", action="store_true")
    ap.add_argument("--no-graphs", action="store_true", help="decode eager only")
    ap.add_argument("--no-power", action="store_true")
    ap.add_argument("--no-smi", action="store_true", help="no nvidia-smi / NVML sampling")
    ap.add_argument("--smi-index", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.dry_run:
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    sys.exit(run(Runner(args)))


if __name__ == "__main__":
    main()
