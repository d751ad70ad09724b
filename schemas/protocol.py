"""Benchmark protocol v1 as one documented config: classes, models, SLAs, shares (DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class RequestClass(StrEnum):
    CODE = "code"
    CHAT = "chat"
    BATCH = "batch"


class ModelName(StrEnum):
    LLAMA_8B = "llama-3.1-8b"
    LLAMA_70B = "llama-3.1-70b"


#: The class names in index order (CLASS_INDEX): the one list every package iterates.
CLASSES: tuple[str, ...] = tuple(c.value for c in RequestClass)
CLASS_INDEX: dict[RequestClass, int] = {c: i for i, c in enumerate(RequestClass)}
MODEL_INDEX: dict[ModelName, int] = {ModelName.LLAMA_8B: 0, ModelName.LLAMA_70B: 1}


@dataclass(frozen=True)
class ClassSpec:
    """One request class of protocol v1.

    Parameters
    ----------
    name : the class.
    model : the model that serves it.
    share : fraction of requests (0-1).
    ttft_slo_ms, tpot_slo_ms : interactive SLA (ms); None for deferrable work.
    deadline_min_s, deadline_max_s : deferrable deadline after arrival (s), seeded uniform; None if
        interactive.
    size_source : which trace supplies prompt/output sizes.
    """

    name: RequestClass
    model: ModelName
    share: float
    ttft_slo_ms: float | None
    tpot_slo_ms: float | None
    deadline_min_s: float | None
    deadline_max_s: float | None
    size_source: str

    @property
    def deferrable(self) -> bool:
        return self.deadline_min_s is not None


@dataclass(frozen=True)
class Protocol:
    """Protocol v1 defaults (one documented config)."""

    classes: tuple[ClassSpec, ...] = field(
        default_factory=lambda: (
            ClassSpec(RequestClass.CODE, ModelName.LLAMA_8B, 0.30, 1000.0, 50.0, None, None, "azure_code"),
            ClassSpec(RequestClass.CHAT, ModelName.LLAMA_70B, 0.60, 2000.0, 100.0, None, None, "azure_conv"),
            ClassSpec(
                RequestClass.BATCH, ModelName.LLAMA_70B, 0.10, None, None, 1800.0, 10800.0, "mooncake_conv"
            ),
        )
    )
    period_s: float = 300.0
    window_hours: float = 3.0
    target_requests_min: int = 400_000
    target_requests_max: int = 600_000
    target_requests: int = 500_000
    history_days: int = 7
    drain_grace_s: float = 3600.0
    prefix_block_tokens: int = 512

    def spec(self, name: RequestClass | str) -> ClassSpec:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(f"unknown request class {name!r}")


PROTOCOL_V1 = Protocol()
