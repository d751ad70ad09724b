"""The measured stack: Llama-shaped layers with bf16 or fp8 linears, RoPE, SDPA attention and a KV cache."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from .config import Cfg

FP8_MAX = 448.0  # largest finite float8_e4m3fn


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
        """e4m3 copy of W with one per-tensor scale (amax / 448)."""
        amax = self.w.abs().amax().float().clamp_min(1e-12)
        self.w_scale = (amax / FP8_MAX).reshape(())
        self.w8 = (self.w.float() / self.w_scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    def finish_calibration(self) -> None:
        """Static activation scale from the recorded amax."""
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


@contextlib.contextmanager
def calibrating() -> Iterator[None]:
    """Within the block, bf16 calls of every Lin record their input amax (for the static fp8 scales)."""
    Lin.calibrating = True
    try:
        yield
    finally:
        Lin.calibrating = False


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
    """Per-layer K and V caches [batch, kv_heads, seq, head_dim]; random (fill) or zeros."""

    def __init__(
        self, cfg: Cfg, batch: int, seq: int, dev: torch.device, dtype: torch.dtype, gen: torch.Generator, fill: bool
    ):
        shape = (batch, cfg.kv_heads, seq, cfg.head_dim)
        mk = (
            (lambda: torch.randn(shape, device=dev, dtype=dtype, generator=gen))
            if fill
            else (lambda: torch.zeros(shape, device=dev, dtype=dtype))
        )
        self.k = [mk() for _ in range(cfg.layers)]
        self.v = [mk() for _ in range(cfg.layers)]

    def nbytes(self) -> int:
        """Cache size (bytes)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class Model:
    """The full stack with random weights from a seeded generator; RoPE tables up to the longest position."""

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
        """Weights read per step (bytes): linears in fp8 (1 B) or bf16 (2 B); norms and lm_head bf16."""
        c = self.cfg
        lin = c.linear_params() * (1 if fp8 else 2)
        other = (c.layers * 2 * c.hidden + c.hidden) * 2
        lm = c.vocab * c.hidden * 2 if c.lm_head else 0  # lm_head stays bf16 in both modes
        return lin + other + lm

    # ----- attention
    def _ctx(self) -> contextlib.AbstractContextManager:
        if self.attn_backends is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(self.attn_backends)

    def _prefill_attn(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [1, Hq, T, d], k/v [1, Hkv, T, d], causal."""
        with self._ctx():
            if self.gqa_mode == "enable_gqa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            rep = self.cfg.q_heads // self.cfg.kv_heads
            return F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True
            )

    def decode_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
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
    def _qkv(
        self, lyr: dict, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fp8: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pre-norm fused QKV projection of x [N, hidden], RoPE on q and k: q [N, Hq, d], k and v [N, Hkv, d]."""
        c = self.cfg
        n = x.shape[0]
        qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
        qkv = lyr["qkv"](rms_norm(x, lyr["ln1"]), fp8)
        q = rope(qkv[:, :qd].view(n, c.q_heads, c.head_dim), cos, sin)
        k = rope(qkv[:, qd : qd + kd].view(n, c.kv_heads, c.head_dim), cos, sin)
        v = qkv[:, qd + kd :].view(n, c.kv_heads, c.head_dim)
        return q, k, v

    def _out_mlp(self, lyr: dict, x: torch.Tensor, a: torch.Tensor, fp8: bool) -> torch.Tensor:
        """The residual stream after the attention output projection of a and the pre-norm SwiGLU MLP."""
        x = x + lyr["o"](a, fp8)
        g, u = lyr["gu"](rms_norm(x, lyr["ln2"]), fp8).chunk(2, dim=-1)
        return x + lyr["d"](F.silu(g) * u, fp8)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head (the final hidden state if there is no lm_head)."""
        h = rms_norm(x, self.ln_f)
        return self.lm(h, False) if self.lm is not None else h

    def prefill(self, x: torch.Tensor, kv: KV | None, fp8: bool, slot: int = 0) -> torch.Tensor:
        """x [T, hidden] token embeddings of one sequence at positions 0..T-1; returns last-token logits
        (or final hidden if no lm_head)."""
        t = x.shape[0]
        qd = self.cfg.q_heads * self.cfg.head_dim
        cos, sin = self.cos[:t], self.sin[:t]
        for i, lyr in enumerate(self.layers):
            q, k, v = self._qkv(lyr, x, cos, sin, fp8)
            q, k, v = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            if kv is not None:
                kv.k[i][slot, :, :t] = k[0]
                kv.v[i][slot, :, :t] = v[0]
            a = self._prefill_attn(q, k, v)[0].transpose(0, 1).reshape(t, qd)
            x = self._out_mlp(lyr, x, a, fp8)
        return self._logits(x[-1:])

    def decode(self, x: torch.Tensor, kv: KV, pos: int, fp8: bool) -> torch.Tensor:
        """x [B, hidden] one new token per sequence at position pos; KV holds positions 0..pos-1 for
        rows 0..B-1. Writes the new K/V at pos, attends over pos+1 positions; returns logits [B, vocab]."""
        b = x.shape[0]
        cos, sin = self.cos[pos : pos + 1], self.sin[pos : pos + 1]
        for i, lyr in enumerate(self.layers):
            q, k, v = self._qkv(lyr, x, cos, sin, fp8)
            kc, vc = kv.k[i], kv.v[i]
            kc[:b, :, pos] = k
            vc[:b, :, pos] = v
            a = self.decode_attention(q, kc[:b, :, : pos + 1], vc[:b, :, : pos + 1])
            x = self._out_mlp(lyr, x, a, fp8)
        return self._logits(x)
