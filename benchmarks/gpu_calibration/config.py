"""Model shape (Llama-3.1-8B) and run sizes: the full H200 run and the tiny CPU dry run."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Cfg:
    """Model shape and run sizes; times in seconds, lengths in tokens."""

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
        """All parameters (linears, norms, lm_head if kept); no embedding table."""
        per_layer = (
            self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
            + self.q_heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.mlp
            + 2 * self.hidden
        )
        return self.layers * per_layer + self.hidden + (self.vocab * self.hidden if self.lm_head else 0)

    def linear_params(self) -> int:
        """Parameters of the per-layer linears (the fp8 ones)."""
        return self.layers * (
            self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
            + self.q_heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.mlp
        )


def dry_cfg() -> Cfg:
    """Tiny 2-layer shape and sub-second phases for the CPU dry run."""
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
