"""Fleet inventory: what an operator knows about its own sites (not the ground truth's hidden effects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class GpuType(StrEnum):
    H100 = "H100"
    A100 = "A100"


class Precision(StrEnum):
    BF16 = "bf16"
    FP8 = "fp8"


GPU_INDEX: dict[GpuType, int] = {GpuType.H100: 0, GpuType.A100: 1}
PRECISION_INDEX: dict[Precision, int] = {Precision.BF16: 0, Precision.FP8: 1}
GPUS_PER_NODE = 8

#: SM clock range per GPU type (MHz); max is the default boost clock.
SM_CLOCK_RANGE_MHZ: dict[GpuType, tuple[int, int]] = {GpuType.H100: (1095, 1980), GpuType.A100: (1005, 1410)}
#: FP8 tensor cores exist on Hopper only.
PRECISIONS_BY_GPU: dict[GpuType, tuple[Precision, ...]] = {
    GpuType.H100: (Precision.BF16, Precision.FP8),
    GpuType.A100: (Precision.BF16,),
}


@dataclass(frozen=True)
class NodeGroup:
    """Identical 8-GPU nodes of one type at one site, spread over racks."""

    gpu: GpuType
    nodes: int
    racks: int


@dataclass(frozen=True)
class Site:
    """One site (one per market). power_cap_w is the site IT power cap (W) before PUE."""

    name: str
    market: str
    groups: tuple[NodeGroup, ...]
    power_cap_w: float
    region: str

    def gpus(self, gpu: GpuType) -> int:
        return sum(g.nodes * GPUS_PER_NODE for g in self.groups if g.gpu == gpu)


@dataclass(frozen=True)
class FleetSpec:
    """The fleet inventory; the default is one site per market (DESIGN.md, documented in README)."""

    sites: tuple[Site, ...] = field(default_factory=tuple)

    def site(self, market: str) -> Site:
        for s in self.sites:
            if s.market == market:
                return s
        raise KeyError(f"no site for market {market!r}")


#: Tensor parallelism per model (GPUs per replica) by GPU type.
DEFAULT_TP: dict[tuple[str, GpuType], int] = {
    ("llama-3.1-8b", GpuType.H100): 1,
    ("llama-3.1-8b", GpuType.A100): 1,
    ("llama-3.1-70b", GpuType.H100): 4,
    ("llama-3.1-70b", GpuType.A100): 8,
}
