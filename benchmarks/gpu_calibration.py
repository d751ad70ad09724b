"""GPU calibration cross-check: Llama-3.1-8B-shaped decode/prefill timing (bf16 vs fp8) and board power.

Usage (on the lent GPU, from the repo root):
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_calibration.py
    python3 benchmarks/gpu_calibration.py --dry-run      # tiny 2-layer model on the CPU, no nvidia-smi

Self-contained: torch only (pynvml used for the energy counter if it happens to be importable), no network,
no model download. Random weights in the exact shapes of Llama-3.1-8B (hidden 4096, 32 layers, 32 query
heads, 8 KV heads, head_dim 128, MLP 14336, vocab 128256), fused QKV and gate/up projections as serving
engines use them.

Measures
  1. decode step time of the full stack at batch 1..256, KV context 1024, bf16 and fp8 linears
     (torch._scaled_mm, e4m3 weights with per-tensor scales, static per-tensor activation scales), eager and
     CUDA-graph replay;
  2. prefill time of 512 / 2048 / 8192 tokens in one causal pass, bf16 and fp8;
  3. board power / SM clock / utilization from an `nvidia-smi -lms 100` loop during idle, sustained decode
     (batch 64) and sustained prefill (8192), plus the NVML energy counter where available.
Clocks and power limits are left as found. Timing: CUDA events per iteration, warm-up first, medians.

Writes $OUT/gpu_calibration.json (OUT defaults to ./out) and $OUT/gpu_calibration_smi.csv, prints a table.
The lent device is an H200, not the fleet's H100/A100: the figures cross-check ratios (fp8/bf16 speed-up,
decode batch scaling, prefill per-token cost, power at idle vs decode vs prefill), not H100 coefficients.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

SCRIPT = "benchmarks/gpu_calibration.py"
FP8_MAX = 448.0  # largest finite float8_e4m3fn


# --------------------------------------------------------------------------------------------- config
@dataclass
class Cfg:
    layers: int = 32
    hidden: int = 4096
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    mlp: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0
    ctx: int = 1024
    batches: list[int] = field(default_factory=lambda: [1, 8, 32, 64, 128, 256])
    prefill: list[int] = field(default_factory=lambda: [512, 2048, 8192])
    power_batch: int = 64
    power_prefill: int = 8192
    warmup: int = 5
    iters: int = 20
    prefill_iters: dict[int, int] = field(default_factory=lambda: {512: 20, 2048: 15, 8192: 10})
    idle_s: float = 3.0
    phase_s: float = 8.0
    lm_head: bool = True
    decode_attn: str = "fold"  # fold: the 4 query heads of a KV group as the query-length axis; gqa: enable_gqa

    def params(self) -> int:
        per_layer = (
            self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
            + self.q_heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.mlp
            + 2 * self.hidden
        )
        return self.layers * per_layer + self.hidden + (self.vocab * self.hidden if self.lm_head else 0)

    def linear_params(self) -> int:
        return self.layers * (
            self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
            + self.q_heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.mlp
        )


def dry_cfg() -> Cfg:
    return Cfg(
        layers=2,
        hidden=128,
        q_heads=8,
        kv_heads=2,
        head_dim=16,
        mlp=256,
        vocab=512,
        ctx=64,
        batches=[1, 3],
        prefill=[32, 48],
        power_batch=3,
        power_prefill=48,
        warmup=1,
        iters=3,
        prefill_iters={32: 3, 48: 3},
        idle_s=0.3,
        phase_s=0.4,
    )


# --------------------------------------------------------------------------------------------- helpers
def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def stats(ms: list[float]) -> dict:
    s = sorted(ms)
    n = len(s)
    return {
        "median_ms": statistics.median(s),
        "p10_ms": s[int(0.1 * (n - 1))],
        "p90_ms": s[int(math.ceil(0.9 * (n - 1)))],
        "min_ms": s[0],
        "n": n,
    }


def bench(fn, dev: torch.device, warmup: int, iters: int) -> dict:
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


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------------------------- model
class Lin:
    """y = x @ W.T in bf16 (F.linear) or fp8 (torch._scaled_mm, per-tensor scales, M padded to 16)."""

    calibrating = False  # class-wide: record activation amax (bf16 path) for static fp8 scales

    def __init__(self, n: int, k: int, dev: torch.device, dtype: torch.dtype, gen: torch.Generator):
        self.w = torch.randn(n, k, device=dev, dtype=dtype, generator=gen).mul_(1.0 / math.sqrt(k))
        self.w8: torch.Tensor | None = None
        self.w_scale: torch.Tensor | None = None
        self.a_amax = torch.zeros((), device=dev, dtype=torch.float32)
        self.a_scale = torch.ones((), device=dev, dtype=torch.float32)
        self.a_inv = torch.ones((), device=dev, dtype=torch.float32)

    def make_fp8(self) -> None:
        amax = self.w.abs().amax().float().clamp_min(1e-12)
        self.w_scale = (amax / FP8_MAX).reshape(())
        self.w8 = (self.w.float() / self.w_scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    def finish_calibration(self) -> None:
        self.a_scale.copy_(self.a_amax.clamp_min(1e-6) / FP8_MAX)
        self.a_inv.copy_(1.0 / self.a_scale)

    def __call__(self, x: torch.Tensor, fp8: bool) -> torch.Tensor:
        if not fp8:
            if Lin.calibrating:
                torch.maximum(self.a_amax, x.detach().abs().amax().float(), out=self.a_amax)
            return F.linear(x, self.w)
        m = x.shape[0]
        pad = (-m) % 16
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        xq = (x * self.a_inv).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            xq,
            self.w8.t(),
            scale_a=self.a_scale,
            scale_b=self.w_scale,
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )
        return y[:m] if pad else y


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T or B, heads, d]; cos/sin [T or B, 1, d] (rotate-half convention)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KV:
    def __init__(self, cfg: Cfg, batch: int, seq: int, dev: torch.device, dtype: torch.dtype, gen, fill: bool):
        shape = (batch, cfg.kv_heads, seq, cfg.head_dim)
        mk = (
            (lambda: torch.randn(shape, device=dev, dtype=dtype, generator=gen))
            if fill
            else (lambda: torch.zeros(shape, device=dev, dtype=dtype))
        )
        self.k = [mk() for _ in range(cfg.layers)]
        self.v = [mk() for _ in range(cfg.layers)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class Model:
    def __init__(self, cfg: Cfg, dev: torch.device, dtype: torch.dtype, seed: int = 0):
        self.cfg, self.dev, self.dtype = cfg, dev, dtype
        self.gen = torch.Generator(device=dev)
        self.gen.manual_seed(seed)
        qd, kd = cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.layers = []
        for _ in range(cfg.layers):
            self.layers.append(
                {
                    "ln1": 1.0 + 0.1 * torch.randn(cfg.hidden, device=dev, dtype=dtype, generator=self.gen),
                    "qkv": Lin(qd + 2 * kd, cfg.hidden, dev, dtype, self.gen),
                    "o": Lin(cfg.hidden, qd, dev, dtype, self.gen),
                    "ln2": 1.0 + 0.1 * torch.randn(cfg.hidden, device=dev, dtype=dtype, generator=self.gen),
                    "gu": Lin(2 * cfg.mlp, cfg.hidden, dev, dtype, self.gen),
                    "d": Lin(cfg.hidden, cfg.mlp, dev, dtype, self.gen),
                }
            )
        self.ln_f = torch.ones(cfg.hidden, device=dev, dtype=dtype)
        self.lm = Lin(cfg.vocab, cfg.hidden, dev, dtype, self.gen) if cfg.lm_head else None
        max_pos = max([cfg.ctx + 1, *cfg.prefill]) + 1
        inv = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=dev, dtype=torch.float32) / cfg.head_dim)
        )
        ang = torch.outer(torch.arange(max_pos, device=dev, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.cos = ang.cos().to(dtype)[:, None, :]  # [pos, 1, d]
        self.sin = ang.sin().to(dtype)[:, None, :]
        self.fp8_ready = False
        self.gqa_mode = "enable_gqa"
        self.attn_backends = None  # set by choose_attention on CUDA

    def linears(self) -> list[Lin]:
        return [lyr[n] for lyr in self.layers for n in ("qkv", "o", "gu", "d")]

    def make_fp8(self) -> None:
        for lin in self.linears():
            lin.make_fp8()
        self.fp8_ready = True

    def weight_bytes(self, fp8: bool) -> int:
        c = self.cfg
        lin = c.linear_params() * (1 if fp8 else 2)
        other = (c.layers * 2 * c.hidden + c.hidden) * 2
        lm = c.vocab * c.hidden * 2 if c.lm_head else 0  # lm_head stays bf16 in both modes
        return lin + other + lm

    # ----- attention
    def _ctx(self):
        if self.attn_backends is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.attn_backends)

    def _prefill_attn(self, q, k, v):
        """q [1, Hq, T, d], k/v [1, Hkv, T, d], causal."""
        with self._ctx():
            if self.gqa_mode == "enable_gqa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            rep = self.cfg.q_heads // self.cfg.kv_heads
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True
            )

    def _decode_attn(self, q, k, v):
        """q [B, Hq, d] (one new token), k/v [B, Hkv, S, d]: the new token attends to all S positions."""
        c = self.cfg
        b = q.shape[0]
        rep = c.q_heads // c.kv_heads
        with self._ctx():
            if c.decode_attn == "fold":
                # q head h uses KV head h // rep (Llama's repeat_kv), so view the rep query heads of a group
                # as rep query positions over the same keys: K/V read once per group, no mask needed.
                o = F.scaled_dot_product_attention(q.view(b, c.kv_heads, rep, c.head_dim), k, v)
            elif self.gqa_mode == "enable_gqa":
                o = F.scaled_dot_product_attention(q.view(b, c.q_heads, 1, c.head_dim), k, v, enable_gqa=True)
            else:
                o = F.scaled_dot_product_attention(
                    q.view(b, c.q_heads, 1, c.head_dim),
                    k.repeat_interleave(rep, dim=1),
                    v.repeat_interleave(rep, dim=1),
                )
        return o.reshape(b, c.q_heads * c.head_dim)

    def choose_attention(self) -> dict:
        """On CUDA forbid the math backend (it would materialise T x T); fall back to expanded K/V if
        enable_gqa is refused by the fused kernels. Returns what was chosen."""
        info: dict = {}
        if self.dev.type == "cuda":
            from torch.nn.attention import SDPBackend

            self.attn_backends = [
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.CUDNN_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
            ]
        c = self.cfg
        q = torch.randn(1, c.q_heads, 256, c.head_dim, device=self.dev, dtype=self.dtype)
        k = torch.randn(1, c.kv_heads, 256, c.head_dim, device=self.dev, dtype=self.dtype)
        try:
            self._prefill_attn(q, k, k)
        except Exception as e:  # noqa: BLE001
            info["enable_gqa_error"] = repr(e)[:300]
            self.gqa_mode = "expand"
            self._prefill_attn(q, k, k)
        info["prefill_gqa"] = self.gqa_mode
        info["decode_attn"] = c.decode_attn
        info["sdpa_backends"] = [str(b) for b in self.attn_backends] if self.attn_backends else "default"
        return info

    # ----- forward passes
    def prefill(self, x: torch.Tensor, kv: KV | None, fp8: bool, slot: int = 0) -> torch.Tensor:
        """x [T, hidden] token embeddings of one sequence at positions 0..T-1; returns last-token logits
        (or final hidden if no lm_head)."""
        c = self.cfg
        t = x.shape[0]
        qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
        cos, sin = self.cos[:t], self.sin[:t]
        for i, lyr in enumerate(self.layers):
            h = rms_norm(x, lyr["ln1"])
            qkv = lyr["qkv"](h, fp8)
            q = rope(qkv[:, :qd].view(t, c.q_heads, c.head_dim), cos, sin)
            k = rope(qkv[:, qd : qd + kd].view(t, c.kv_heads, c.head_dim), cos, sin)
            v = qkv[:, qd + kd :].view(t, c.kv_heads, c.head_dim)
            q, k, v = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            if kv is not None:
                kv.k[i][slot, :, :t] = k[0]
                kv.v[i][slot, :, :t] = v[0]
            a = self._prefill_attn(q, k, v)[0].transpose(0, 1).reshape(t, qd)
            x = x + lyr["o"](a, fp8)
            h = rms_norm(x, lyr["ln2"])
            g, u = lyr["gu"](h, fp8).chunk(2, dim=-1)
            x = x + lyr["d"](F.silu(g) * u, fp8)
        h = rms_norm(x[-1:], self.ln_f)
        return self.lm(h, False) if self.lm is not None else h

    def decode(self, x: torch.Tensor, kv: KV, pos: int, fp8: bool) -> torch.Tensor:
        """x [B, hidden] one new token per sequence at position pos; KV holds positions 0..pos-1 for
        rows 0..B-1. Writes the new K/V at pos, attends over pos+1 positions; returns logits [B, vocab]."""
        c = self.cfg
        b = x.shape[0]
        qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
        cos, sin = self.cos[pos : pos + 1], self.sin[pos : pos + 1]
        for i, lyr in enumerate(self.layers):
            h = rms_norm(x, lyr["ln1"])
            qkv = lyr["qkv"](h, fp8)
            q = rope(qkv[:, :qd].view(b, c.q_heads, c.head_dim), cos, sin)
            k = rope(qkv[:, qd : qd + kd].view(b, c.kv_heads, c.head_dim), cos, sin)
            v = qkv[:, qd + kd :].view(b, c.kv_heads, c.head_dim)
            kc, vc = kv.k[i], kv.v[i]
            kc[:b, :, pos] = k
            vc[:b, :, pos] = v
            a = self._decode_attn(q, kc[:b, :, : pos + 1], vc[:b, :, : pos + 1])
            x = x + lyr["o"](a, fp8)
            h = rms_norm(x, lyr["ln2"])
            g, u = lyr["gu"](h, fp8).chunk(2, dim=-1)
            x = x + lyr["d"](F.silu(g) * u, fp8)
        h = rms_norm(x, self.ln_f)
        return self.lm(h, False) if self.lm is not None else h


# --------------------------------------------------------------------------------------------- nvidia-smi
SMI_REQUIRED = ["timestamp", "power.draw", "clocks.sm", "utilization.gpu", "temperature.gpu"]
SMI_OPTIONAL = ["power.draw.instant", "clocks.mem", "utilization.memory", "clocks_event_reasons.active"]
SMI_STATIC = [
    "name",
    "driver_version",
    "pstate",
    "power.limit",
    "power.default_limit",
    "power.max_limit",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks.applications.graphics",
    "clocks.default_applications.graphics",
    "memory.total",
    "persistence_mode",
    "compute_mode",
    "pci.bus_id",
    "vbios_version",
]


def _smi(args: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout)
    except Exception:  # noqa: BLE001
        return None


def smi_static(index: int) -> dict:
    out: dict = {}
    r = _smi([f"--query-gpu={','.join(SMI_STATIC)}", "--format=csv,noheader,nounits", "-i", str(index)])
    if r is not None and r.returncode == 0 and r.stdout.strip():
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
        if len(vals) == len(SMI_STATIC):
            return dict(zip(SMI_STATIC, vals, strict=True))
    for f in SMI_STATIC:  # one field at a time: an unsupported field fails the whole query
        r = _smi([f"--query-gpu={f}", "--format=csv,noheader,nounits", "-i", str(index)])
        out[f] = r.stdout.strip() if r is not None and r.returncode == 0 else None
    return out


def smi_fields(index: int) -> list[str]:
    fields = SMI_REQUIRED + SMI_OPTIONAL
    r = _smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", str(index)])
    if r is not None and r.returncode == 0:
        return fields
    keep = list(SMI_REQUIRED)
    for f in SMI_OPTIONAL:
        r = _smi([f"--query-gpu={','.join([*SMI_REQUIRED, f])}", "--format=csv,noheader,nounits", "-i", str(index)])
        if r is not None and r.returncode == 0:
            keep.append(f)
    return keep


def parse_smi_line(line: str, fields: list[str], t_read: float) -> dict | None:
    vals = [v.strip() for v in line.strip().split(",")]
    if len(vals) != len(fields):
        return None
    row: dict = {"t_read": t_read}
    for f, v in zip(fields, vals, strict=True):
        if f == "timestamp":
            try:
                row["t"] = dt.datetime.strptime(v, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except ValueError:
                row["t"] = t_read
        elif f == "clocks_event_reasons.active":
            row[f] = v
        else:
            try:
                row[f] = float(v)
            except ValueError:
                row[f] = None  # [N/A], [Not Supported]
    row.setdefault("t", t_read)
    return row


class SmiSampler:
    """`nvidia-smi --query-gpu=... -lms 100` in the background; each line carries nvidia-smi's own timestamp,
    so pipe buffering cannot shift samples between phases."""

    def __init__(self, index: int, period_ms: int = 100):
        self.index, self.period_ms = index, period_ms
        self.fields = smi_fields(index)
        self.rows: list[dict] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def start(self) -> None:
        cmd = [
            "nvidia-smi",
            f"--query-gpu={','.join(self.fields)}",
            "--format=csv,noheader,nounits",
            "-i",
            str(self.index),
            "-lms",
            str(self.period_ms),
        ]
        if shutil.which("stdbuf"):
            cmd = ["stdbuf", "-oL", *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            row = parse_smi_line(line, self.fields, time.time())
            if row is not None:
                self.rows.append(row)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            self.proc.send_signal(signal.SIGINT)  # like Ctrl-C: nvidia-smi exits and flushes
            self.proc.wait(timeout=3)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=3)
        if self.thread is not None:
            self.thread.join(timeout=3)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        if err.strip():
            self.error = err.strip()[:500]


class NvmlSampler:
    """Secondary sampler through NVML (pynvml), mainly for the board energy counter (mJ)."""

    def __init__(self, index: int, period_s: float = 0.1):
        import pynvml  # noqa: PLC0415  (optional dependency)

        self.nv = pynvml
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s = period_s
        self.rows: list[dict] = []
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.energy_ok = self.energy_mj() is not None

    def energy_mj(self) -> float | None:
        try:
            return float(self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h))
        except Exception:  # noqa: BLE001
            return None

    def _run(self) -> None:
        nv = self.nv
        while not self.stop_ev.is_set():
            row: dict = {"t": time.time()}
            with contextlib.suppress(Exception):
                row["power_w"] = nv.nvmlDeviceGetPowerUsage(self.h) / 1000.0
            with contextlib.suppress(Exception):
                row["sm_mhz"] = float(nv.nvmlDeviceGetClockInfo(self.h, nv.NVML_CLOCK_SM))
            with contextlib.suppress(Exception):
                row["util"] = float(nv.nvmlDeviceGetUtilizationRates(self.h).gpu)
            self.rows.append(row)
            self.stop_ev.wait(self.period_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_ev.set()
        self.thread.join(timeout=3)
        with contextlib.suppress(Exception):
            self.nv.nvmlShutdown()


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize_phase(ph: dict, smi_rows: list[dict], nvml_rows: list[dict], skip_s: float) -> dict:
    t0, t1 = ph["t0"] + skip_s, ph["t1"]
    s = [r for r in smi_rows if t0 <= r["t"] <= t1]
    n = [r for r in nvml_rows if t0 <= r["t"] <= t1]
    out = {
        "phase": ph["name"],
        "duration_s": round(ph["t1"] - ph["t0"], 3),
        "window_skip_s": skip_s,
        "smi_samples": len(s),
        "power_w_mean": _mean([r.get("power.draw") for r in s]),
        "power_instant_w_mean": _mean([r.get("power.draw.instant") for r in s]),
        "sm_clock_mhz_mean": _mean([r.get("clocks.sm") for r in s]),
        "sm_clock_mhz_min": min((r["clocks.sm"] for r in s if r.get("clocks.sm") is not None), default=None),
        "sm_clock_mhz_max": max((r["clocks.sm"] for r in s if r.get("clocks.sm") is not None), default=None),
        "mem_clock_mhz_mean": _mean([r.get("clocks.mem") for r in s]),
        "util_gpu_mean": _mean([r.get("utilization.gpu") for r in s]),
        "util_mem_mean": _mean([r.get("utilization.memory") for r in s]),
        "temp_c_max": max((r["temperature.gpu"] for r in s if r.get("temperature.gpu") is not None), default=None),
        "clock_event_reasons": sorted(
            {r["clocks_event_reasons.active"] for r in s if r.get("clocks_event_reasons.active")}
        ),
        "nvml_samples": len(n),
        "nvml_power_w_mean": _mean([r.get("power_w") for r in n]),
        "nvml_sm_clock_mhz_mean": _mean([r.get("sm_mhz") for r in n]),
    }
    for key in ("e0_mj", "e1_mj"):
        if ph.get(key) is None:
            break
    else:
        out["energy_counter_power_w"] = (ph["e1_mj"] - ph["e0_mj"]) / 1000.0 / max(ph["t1"] - ph["t0"], 1e-9)
    for key in ("work_units", "unit", "unit_ms"):
        if key in ph:
            out[key] = ph[key]
    return out


# --------------------------------------------------------------------------------------------- runner
class Runner:
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
                "Measured on a lent NVIDIA H200 (not the fleet's H100/A100), one GPU, random weights in "
                "Llama-3.1-8B shapes, PyTorch eager/CUDA-graph kernels (not a serving engine). Use as a "
                "cross-check of ratios (fp8/bf16 speed-up, decode batch scaling, prefill per-token cost, power "
                "at idle vs decode vs prefill), not as H100 coefficients. Clocks and power limits left as found."
            ),
            "dry_run": bool(args.dry_run),
            "errors": [],
            "skipped": [],
        }
        self.smi: SmiSampler | None = None
        self.nvml: NvmlSampler | None = None
        self.phases: list[dict] = []

    # ----- bookkeeping
    def elapsed(self) -> float:
        return time.time() - self.t_start

    def left(self) -> float:
        return self.args.budget_s - self.elapsed()

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def err(self, where: str, e: BaseException) -> None:
        self.res["errors"].append(
            {"where": where, "error": repr(e)[:500], "trace": traceback.format_exc(limit=4)[-1500:]}
        )
        self.log(f"ERROR in {where}: {e!r}"[:300])

    def save(self) -> Path:
        self.res["elapsed_s"] = round(self.elapsed(), 2)
        p = self.out_dir / "gpu_calibration.json"
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.res, indent=2, default=str))
        tmp.replace(p)
        return p

    def mark(self, name: str, t0: float, t1: float, e0: float | None, e1: float | None, **extra) -> None:
        self.phases.append({"name": name, "t0": t0, "t1": t1, "e0_mj": e0, "e1_mj": e1, **extra})

    def energy(self) -> float | None:
        return self.nvml.energy_mj() if self.nvml is not None and self.nvml.energy_ok else None

    # ----- sections
    def environment(self) -> None:
        a = self.args
        dev = torch.device("cpu" if a.dry_run or not torch.cuda.is_available() else "cuda:0")
        if not a.dry_run and dev.type != "cuda":
            raise SystemExit("no CUDA device visible; use --dry-run for the CPU check")
        self.dev = dev
        self.dtype = torch.bfloat16
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
            if "H200" not in p.name:
                self.res["device_warning"] = f"expected an H200, found {p.name}"
        self.res["environment"] = env
        c = self.cfg
        self.res["config"] = {
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
                self.res["nvidia_smi_static"] = smi_static(a.smi_index)
        self.log(f"device {env.get('device_name', dev.type)}, torch {torch.__version__}, CUDA {torch.version.cuda}")

    def start_samplers(self) -> None:
        a = self.args
        info: dict = {}
        if self.dev.type == "cuda" and not a.no_smi and shutil.which("nvidia-smi"):
            try:
                self.smi = SmiSampler(a.smi_index)
                self.smi.start()
                info["nvidia_smi_fields"] = self.smi.fields
                info["nvidia_smi_period_ms"] = self.smi.period_ms
            except Exception as e:  # noqa: BLE001
                self.err("nvidia-smi sampler", e)
                self.smi = None
        else:
            info["nvidia_smi"] = "not used (dry run, --no-smi, or not found)"
        if self.dev.type == "cuda" and not a.no_smi:
            try:
                self.nvml = NvmlSampler(a.smi_index)
                self.nvml.start()
                info["nvml"] = {"energy_counter": self.nvml.energy_ok}
            except Exception as e:  # noqa: BLE001
                info["nvml"] = f"unavailable: {e!r}"[:200]
                self.nvml = None
        info["power_draw_semantics"] = (
            "nvidia-smi power.draw is a ~1 s average on Ampere and newer; "
            "power.draw.instant is instantaneous; energy_counter_power_w is "
            "(NVML total energy delta)/(phase duration) over the whole phase"
        )
        self.res["sampling"] = info

    def build(self) -> None:
        c, dev = self.cfg, self.dev
        t = time.time()
        self.model = Model(c, dev, self.dtype, seed=self.args.seed)
        self.kv = KV(c, max(c.batches), c.ctx + 1, dev, self.dtype, self.model.gen, fill=True)
        self.kv_pre = KV(c, 1, max(c.prefill), dev, self.dtype, self.model.gen, fill=False)
        sync(dev)
        self.res["memory"] = {
            "weights_bf16_gb": round(self.model.weight_bytes(False) / 1e9, 3),
            "kv_decode_gb": round(self.kv.nbytes() / 1e9, 3),
            "kv_prefill_gb": round(self.kv_pre.nbytes() / 1e9, 3),
            "build_s": round(time.time() - t, 2),
        }
        self.res["attention"] = self.model.choose_attention()
        # fp8 capability check on a small product, then static activation scales from a bf16 prefill
        self.fp8_ok = False
        try:
            if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
                raise RuntimeError("torch has no float8_e4m3fn/_scaled_mm")
            if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
                raise RuntimeError("fp8 matmul needs compute capability >= 8.9")
            probe = Lin(64, 128, dev, self.dtype, self.model.gen)
            probe.make_fp8()
            xp = torch.randn(5, 128, device=dev, dtype=self.dtype)
            probe.a_amax.copy_(xp.abs().amax().float())
            probe.finish_calibration()
            e = rel_err(probe(xp, True), probe(xp, False))
            if not e < 0.2:
                raise RuntimeError(f"fp8 probe relative error {e}")
            self.model.make_fp8()
            x = torch.randn(min(512, max(c.prefill)), c.hidden, device=dev, dtype=self.dtype, generator=self.model.gen)
            with self._calibrating():
                self.model.prefill(x, None, False)
            for lin in self.model.linears():
                lin.finish_calibration()
            sync(dev)
            self.fp8_ok = True
            self.res["fp8_probe_rel_err"] = e
        except Exception as e:  # noqa: BLE001
            self.err("fp8 setup (fp8 runs skipped)", e)
        self.res["fp8_available"] = self.fp8_ok
        self.log(
            f"built model ({c.params() / 1e9:.2f} B params), KV {self.kv.nbytes() / 1e9:.1f} GB, "
            f"fp8 {'ok' if self.fp8_ok else 'SKIPPED'}, attention {self.res['attention']}"
        )

    @contextlib.contextmanager
    def _calibrating(self):
        Lin.calibrating = True
        try:
            yield
        finally:
            Lin.calibrating = False

    def checks(self) -> None:
        """Correctness: decode with a prefilled cache == prefill of one more token; attention variants agree;
        fp8 logits close to bf16."""
        c, dev, m = self.cfg, self.dev, self.model
        out: dict = {}
        t_len = min(64, c.ctx)
        x = torch.randn(t_len, c.hidden, device=dev, dtype=self.dtype, generator=m.gen)
        kvc = KV(c, 1, t_len, dev, self.dtype, m.gen, fill=False)
        ref = m.prefill(x, None, False).float()
        m.prefill(x[:-1], kvc, False)
        got = m.decode(x[-1:], kvc, t_len - 1, False).float()
        out["decode_vs_prefill_rel_err_bf16"] = rel_err(got, ref)
        # decode attention variants against an explicit expanded-KV float32 reference
        b, s = 3, 40
        q = torch.randn(b, c.q_heads, c.head_dim, device=dev, dtype=self.dtype)
        k = torch.randn(b, c.kv_heads, s, c.head_dim, device=dev, dtype=self.dtype)
        v = torch.randn(b, c.kv_heads, s, c.head_dim, device=dev, dtype=self.dtype)
        rep = c.q_heads // c.kv_heads
        kr, vr = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
        w = torch.softmax(torch.einsum("bhd,bhsd->bhs", q.float(), kr) / math.sqrt(c.head_dim), -1)
        aref = torch.einsum("bhs,bhsd->bhd", w, vr).reshape(b, -1)
        saved = c.decode_attn
        for mode in ("fold", "gqa"):
            c.decode_attn = mode
            try:
                out[f"decode_attn_{mode}_rel_err"] = rel_err(m._decode_attn(q, k, v).float(), aref)
            except Exception as e:  # noqa: BLE001
                out[f"decode_attn_{mode}_rel_err"] = f"error: {e!r}"[:200]
        c.decode_attn = saved
        if self.fp8_ok:
            b = min(8, max(c.batches))
            xb = torch.randn(b, c.hidden, device=dev, dtype=self.dtype, generator=m.gen)
            l16 = m.decode(xb, self.kv, c.ctx, False).float()
            l8 = m.decode(xb, self.kv, c.ctx, True).float()
            out["fp8_vs_bf16_decode_logits_rel_err"] = rel_err(l8, l16)
            out["fp8_vs_bf16_prefill_logits_rel_err"] = rel_err(m.prefill(x, None, True).float(), ref)
        sync(dev)
        bad = [k for k, v in out.items() if isinstance(v, float) and not (v < (0.05 if "fp8" not in k else 0.5))]
        out["ok"] = not bad
        if bad:
            out["failed"] = bad
        self.res["checks"] = out
        self.log("checks: " + ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()))

    def ceilings(self) -> None:
        """Copy bandwidth and matrix rates on random data, to read the model numbers against."""
        dev = self.dev
        if dev.type != "cuda":
            self.res["skipped"].append("ceilings (CPU)")
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
        if self.fp8_ok:
            x8 = x.to(torch.float8_e4m3fn)
            y8 = y.t().contiguous().to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev, dtype=torch.float32)
            st = bench(
                lambda: torch._scaled_mm(
                    x8, y8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
                ),
                dev,
                3,
                10,
            )
            out["fp8_gemm_8192_tflops"] = 2 * s**3 / (st["median_ms"] * 1e-3) / 1e12
        del x, y
        torch.cuda.empty_cache()
        self.res["ceilings"] = out
        self.log("ceilings: " + ", ".join(f"{k}={v:.0f}" for k, v in out.items()))

    def _graph(self, fn):
        """Capture fn() (one decode step) into a CUDA graph; returns replay callable."""
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

    def decode(self) -> None:
        c, dev, m = self.cfg, self.dev, self.model
        rows = []
        self.res["decode"] = rows
        precisions = ["bf16", "fp8"] if self.fp8_ok else ["bf16"]
        for bsz in c.batches:
            if self.left() < 60:
                self.res["skipped"].append(f"decode batch {bsz}+ (time budget)")
                break
            row: dict = {"batch": bsz, "ctx": c.ctx}
            x = torch.randn(bsz, c.hidden, device=dev, dtype=self.dtype, generator=m.gen)
            kv_bytes = bsz * (c.ctx + 1) * c.layers * 2 * c.kv_heads * c.head_dim * 2
            row["kv_read_gb"] = kv_bytes / 1e9
            for prec in precisions:
                fp8 = prec == "fp8"

                def step(x=x, fp8=fp8):
                    return m.decode(x, self.kv, c.ctx, fp8)

                wb = m.weight_bytes(fp8)
                try:
                    st = bench(step, dev, c.warmup, c.iters)
                    row[f"{prec}_eager_ms"] = st["median_ms"]
                    row[f"{prec}_eager"] = st
                except Exception as e:  # noqa: BLE001
                    self.err(f"decode eager {prec} b{bsz}", e)
                if dev.type == "cuda" and not self.args.no_graphs:
                    try:
                        g = self._graph(step)
                        st = bench(g.replay, dev, c.warmup, c.iters)
                        row[f"{prec}_graph_ms"] = st["median_ms"]
                        row[f"{prec}_graph"] = st
                        if bsz == c.power_batch and prec == "bf16":
                            self.power_graph = (g, x)  # keep the graph's input tensor alive
                        else:
                            del g
                    except Exception as e:  # noqa: BLE001
                        self.err(f"decode graph {prec} b{bsz}", e)
                best = row.get(f"{prec}_graph_ms", row.get(f"{prec}_eager_ms"))
                if best:
                    row[f"{prec}_ms"] = best
                    row[f"{prec}_tok_per_s"] = bsz / (best * 1e-3)
                    row[f"{prec}_min_bytes_gb"] = (wb + kv_bytes) / 1e9
                    row[f"{prec}_achieved_gbps"] = (wb + kv_bytes) / (best * 1e-3) / 1e9
            if row.get("fp8_ms") and row.get("bf16_ms"):
                row["fp8_speedup"] = row["bf16_ms"] / row["fp8_ms"]
            rows.append(row)
            self.log(
                f"decode b={bsz:4d}: "
                + "  ".join(
                    f"{p} {row.get(p + '_ms', math.nan):7.3f} ms (eager {row.get(p + '_eager_ms', math.nan):.3f})"
                    for p in precisions
                )
                + (f"  fp8 x{row['fp8_speedup']:.2f}" if "fp8_speedup" in row else "")
            )
            self.save()
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    def prefill(self) -> None:
        c, dev, m = self.cfg, self.dev, self.model
        rows = []
        self.res["prefill"] = rows
        precisions = ["bf16", "fp8"] if self.fp8_ok else ["bf16"]
        for t in c.prefill:
            if self.left() < 45:
                self.res["skipped"].append(f"prefill {t}+ (time budget)")
                break
            row: dict = {"tokens": t}
            x = torch.randn(t, c.hidden, device=dev, dtype=self.dtype, generator=m.gen)
            lin_flops = 2 * c.linear_params() * t
            attn_flops = c.layers * 4 * c.q_heads * c.head_dim * t * t / 2  # causal: QK^T and PV, half the square
            row["linear_tflop"] = lin_flops / 1e12
            row["attn_tflop"] = attn_flops / 1e12
            for prec in precisions:
                fp8 = prec == "fp8"
                try:
                    st = bench(
                        lambda x=x, fp8=fp8: m.prefill(x, self.kv_pre, fp8),
                        dev,
                        max(1, c.warmup // 2),
                        c.prefill_iters.get(t, 10),
                    )
                    row[f"{prec}_ms"] = st["median_ms"]
                    row[prec] = st
                    row[f"{prec}_ms_per_token"] = st["median_ms"] / t
                    row[f"{prec}_tflops"] = (lin_flops + attn_flops) / (st["median_ms"] * 1e-3) / 1e12
                except Exception as e:  # noqa: BLE001
                    self.err(f"prefill {prec} {t}", e)
            if row.get("fp8_ms") and row.get("bf16_ms"):
                row["fp8_speedup"] = row["bf16_ms"] / row["fp8_ms"]
            rows.append(row)
            self.log(
                f"prefill {t:5d}: "
                + "  ".join(f"{p} {row.get(p + '_ms', float('nan')):8.2f} ms" for p in precisions)
                + (f"  fp8 x{row['fp8_speedup']:.2f}" if "fp8_speedup" in row else "")
            )
            self.save()

    def idle(self, name: str) -> None:
        sync(self.dev)
        e0, t0 = self.energy(), time.time()
        time.sleep(self.cfg.idle_s)
        self.mark(name, t0, time.time(), e0, self.energy())

    def sustain(self, name: str, step, unit: str, units_per_call: int) -> None:
        """Run step back to back for phase_s seconds, synchronizing about every 0.1 s (not every call, so the
        queue never drains; not rarely, so the phase ends on time)."""
        dev = self.dev
        sync(dev)
        t = time.perf_counter()
        step()
        sync(dev)
        sync_every = max(1, int(0.1 / max(time.perf_counter() - t, 1e-6)))
        e0, t0 = self.energy(), time.time()
        calls = 0
        while time.time() - t0 < self.cfg.phase_s:
            for _ in range(sync_every):
                step()
            calls += sync_every
            sync(dev)
        t1 = time.time()
        self.mark(
            name,
            t0,
            t1,
            e0,
            self.energy(),
            work_units=calls * units_per_call,
            unit=unit,
            unit_ms=(t1 - t0) * 1e3 / max(calls, 1),
        )

    def power(self) -> None:
        c, dev, m = self.cfg, self.dev, self.model
        if self.args.no_power:
            self.res["skipped"].append("power phases (--no-power)")
            return
        need = 2 * c.phase_s + c.idle_s + 10
        runs = [("bf16", False)] + ([("fp8", True)] if self.fp8_ok and self.left() > 2 * need else [])
        if self.left() < need:
            self.res["skipped"].append("power phases (time budget)")
            return
        for prec, fp8 in runs:
            xb = torch.randn(c.power_batch, c.hidden, device=dev, dtype=self.dtype, generator=m.gen)

            def step(xb=xb, fp8=fp8):
                return m.decode(xb, self.kv, c.ctx, fp8)

            if dev.type == "cuda" and not self.args.no_graphs:
                pg = getattr(self, "power_graph", None)
                g = pg[0] if (not fp8 and pg is not None) else None
                try:
                    g = g or self._graph(step)
                    step = g.replay
                except Exception as e:  # noqa: BLE001
                    self.err(f"power decode graph {prec}", e)
            self.sustain(f"decode_b{c.power_batch}_{prec}", step, "decode steps", 1)
            xp = torch.randn(c.power_prefill, c.hidden, device=dev, dtype=self.dtype, generator=m.gen)
            self.sustain(
                f"prefill_{c.power_prefill}_{prec}",
                lambda xp=xp, fp8=fp8: m.prefill(xp, self.kv_pre, fp8),
                "prefill passes",
                1,
            )
            self.log(f"power phases {prec} done")
        self.power_graph = None
        self.idle("idle_after")

    def finish_power(self) -> None:
        smi_rows = self.smi.rows if self.smi is not None else []
        nvml_rows = self.nvml.rows if self.nvml is not None else []
        phases = []
        for ph in self.phases:
            skip = 0.5 if ph["name"].startswith("idle") else min(1.0, 0.25 * (ph["t1"] - ph["t0"]))
            s = summarize_phase(ph, smi_rows, nvml_rows, skip)
            p_w = s.get("energy_counter_power_w") or s.get("power_w_mean") or s.get("nvml_power_w_mean")
            if p_w and ph.get("work_units"):
                s["energy_j_per_unit"] = p_w * s["duration_s"] / ph["work_units"]
            phases.append(s)
        self.res["power"] = {"phases": phases}
        if self.smi is not None:
            self.res["power"]["smi_error"] = self.smi.error
            self.res["power"]["smi_samples_total"] = len(smi_rows)
            lags = [r["t_read"] - r["t"] for r in smi_rows]
            if lags:
                self.res["power"]["smi_read_lag_s_median"] = statistics.median(lags)
            sm = [r.get("clocks.sm") for r in smi_rows if r.get("clocks.sm") is not None]
            if sm:
                self.res["clocks_seen"] = {
                    "sm_mhz_min": min(sm),
                    "sm_mhz_max": max(sm),
                    "sm_mhz_distinct": sorted(set(sm))[:40],
                }
            mem = [r.get("clocks.mem") for r in smi_rows if r.get("clocks.mem") is not None]
            if mem:
                self.res.setdefault("clocks_seen", {}).update({"mem_mhz_min": min(mem), "mem_mhz_max": max(mem)})
            csv = self.out_dir / "gpu_calibration_smi.csv"
            cols = ["t", "t_read", *[f for f in self.smi.fields if f != "timestamp"]]
            with csv.open("w") as fh:
                fh.write(",".join(cols) + "\n")
                for r in smi_rows:
                    fh.write(",".join("" if r.get(k) is None else str(r.get(k)) for k in cols) + "\n")
            self.res["power"]["samples_file"] = csv.name
            self.res["power"]["phase_marks"] = [{k: ph[k] for k in ("name", "t0", "t1")} for ph in self.phases]

    def ratios(self) -> None:
        r: dict = {}
        dec = {row["batch"]: row for row in self.res.get("decode", [])}
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
        pre = self.res.get("prefill", [])
        if pre:
            r["prefill_fp8_speedup_by_tokens"] = {row["tokens"]: row.get("fp8_speedup") for row in pre}
            r["prefill_bf16_ms_per_token"] = {row["tokens"]: row.get("bf16_ms_per_token") for row in pre}
            r["prefill_fp8_ms_per_token"] = {row["tokens"]: row.get("fp8_ms_per_token") for row in pre}
        ph = {p["phase"]: p for p in self.res.get("power", {}).get("phases", [])}

        def pw(name: str) -> float | None:
            p = ph.get(name) or {}
            return p.get("power_w_mean") or p.get("nvml_power_w_mean") or p.get("energy_counter_power_w")

        idle = pw("idle")
        if idle:
            r["power_w"] = {k: pw(k) for k in ph}
            r["power_over_idle"] = {k: (pw(k) / idle if pw(k) else None) for k in ph}
            tdp = None
            with contextlib.suppress(Exception):
                tdp = float(self.res.get("nvidia_smi_static", {}).get("power.limit"))
            if tdp:
                r["power_over_limit"] = {k: (pw(k) / tdp if pw(k) else None) for k in ph}
        self.res["ratios"] = r

    # ----- table
    def table(self) -> str:
        lines = []
        env = self.res.get("environment", {})
        st = self.res.get("nvidia_smi_static", {})
        lines.append(
            f"device {env.get('device_name', env.get('device_type'))}  driver {st.get('driver_version')}  "
            f"torch {env.get('torch')}  CUDA {env.get('cuda_runtime')}  power.limit {st.get('power.limit')} W"
            f"  max SM {st.get('clocks.max.sm')} MHz"
        )
        ce = self.res.get("ceilings")
        if ce:
            lines.append("ceilings: " + "  ".join(f"{k} {v:.0f}" for k, v in ce.items()))
        ch = self.res.get("checks", {})
        lines.append(
            "checks: "
            + ("ok" if ch.get("ok") else f"FAILED {ch.get('failed')}")
            + "  "
            + "  ".join(f"{k}={v:.1e}" for k, v in ch.items() if isinstance(v, float))
        )
        lines.append("")
        lines.append(f"DECODE (ctx {self.cfg.ctx}, full {self.cfg.layers}-layer step; graph replay where available)")
        lines.append(
            f"{'batch':>6} {'bf16 ms':>9} {'fp8 ms':>9} {'fp8 x':>6} {'bf16 eager':>11} {'fp8 eager':>10} "
            f"{'bf16 GB/s':>10} {'bf16 tok/s':>11} {'vs b1':>6}"
        )
        dec = self.res.get("decode", [])
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
        for row in self.res.get("prefill", []):
            lines.append(
                f"{row['tokens']:>6} {f(row.get('bf16_ms'), 9, 2)} {f(row.get('fp8_ms'), 9, 2)} "
                f"{f(row.get('fp8_speedup'), 6, 2)} {f(row.get('bf16_ms_per_token'), 12, 5)} "
                f"{f(row.get('fp8_ms_per_token'), 11, 5)} {f(row.get('bf16_tflops'), 10, 0)} "
                f"{f(row.get('fp8_tflops'), 9, 0)}"
            )
        pw = self.res.get("power", {}).get("phases", [])
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
        if self.res["errors"]:
            lines.append("")
            lines.append(f"ERRORS ({len(self.res['errors'])}): " + "; ".join(e["where"] for e in self.res["errors"]))
        if self.res["skipped"]:
            lines.append("SKIPPED: " + "; ".join(self.res["skipped"]))
        return "\n".join(lines)

    # ----- main
    def run(self) -> int:
        self.environment()
        self.start_samplers()
        try:
            with torch.inference_mode():
                self.build()
                self.idle("idle")  # weights and KV resident, no kernels running
                for name, fn in (
                    ("checks", self.checks),
                    ("ceilings", self.ceilings),
                    ("decode", self.decode),
                    ("prefill", self.prefill),
                    ("power", self.power),
                ):
                    try:
                        fn()
                    except Exception as e:  # noqa: BLE001
                        self.err(name, e)
                    self.save()
        finally:
            for s in (self.smi, self.nvml):
                if s is not None:
                    with contextlib.suppress(Exception):
                        s.stop()
            with contextlib.suppress(Exception):
                self.finish_power()
            with contextlib.suppress(Exception):
                self.ratios()
            path = self.save()
        print("\n" + self.table())
        print(f"\nwrote {path} ({self.elapsed():.1f} s total)")
        return 1 if self.res["errors"] or not self.res.get("checks", {}).get("ok", False) else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    sys.exit(Runner(args).run())


if __name__ == "__main__":
    main()
