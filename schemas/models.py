"""The served models' architecture: one table for the ground truth's physics and the planner's serving model.

Public facts of the Meta releases (Hugging Face config.json), so both sides may know them.

>>> MODELS["llama-3.1-70b"].kv_bytes_per_token("bf16") / 1024  # KiB per token over all layers
320.0
>>> MODELS["llama-3.1-8b"].weight_bytes("fp8") / 1e9  # GB
8.03
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes per weight or KV value by precision (bf16 2, fp8 1).
BYTES_PER_VALUE: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}
MODEL_SOURCE = "meta-llama/Llama-3.1-{8B,70B} config.json (num_hidden_layers, num_key_value_heads, head_dim)"


@dataclass(frozen=True)
class ModelSpec:
    """Architecture figures of one served model: params (count), layers, hidden, kv_heads, head_dim."""

    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int

    def weight_bytes(self, precision: str) -> float:
        """Weight bytes of the whole model (B): params x bytes per value."""
        return self.params * BYTES_PER_VALUE[precision]

    def kv_bytes_per_token(self, precision: str) -> float:
        """KV bytes per token over all layers (B): 2 (K and V) x layers x kv_heads x head_dim x bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_VALUE[precision]


MODELS: dict[str, ModelSpec] = {
    # Llama-3.1-8B: 8.03e9 params, 32 layers, 8 KV heads (GQA), head_dim 128 -> 128 KiB/token in bf16.
    "llama-3.1-8b": ModelSpec(params=8.03e9, layers=32, hidden=4096, kv_heads=8, head_dim=128),
    # Llama-3.1-70B: 70.55e9 params, 80 layers, 8 KV heads, head_dim 128 -> 320 KiB/token in bf16.
    "llama-3.1-70b": ModelSpec(params=70.55e9, layers=80, hidden=8192, kv_heads=8, head_dim=128),
}


def model_spec(model: str) -> ModelSpec:
    """The architecture figures of `model`; ValueError for an unknown model."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(MODELS)}")
    return MODELS[model]
