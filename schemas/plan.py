"""A plan: the bounds a policy sets for the reactive runtime for one control period.

The runtime (continuous batching, routing, a 15 s autoscaler) serves every policy the same way inside
these bounds. Levers: timing (deferral), placement (pool per model x GPU type x site), routing, capacity
(replica floor/ceiling), batching (max sequences per replica), precision and SM clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any


class Routing(StrEnum):
    PREFIX_LOAD = "prefix_load"  # longest prefix match, falling back to least loaded below a minimum match
    LEAST_LOAD = "least_load"
    ROUND_ROBIN = "round_robin"


class Ordering(StrEnum):
    EDF = "edf"  # earliest deadline first (interactive deadline = arrival + TTFT SLO)
    FCFS = "fcfs"


class BatchAdmission(StrEnum):
    IMMEDIATE = "immediate"  # deferrable work admitted at once
    PRESSURE = "pressure"  # deferrable work waits while interactive queues are backed up
    HOLD = "hold"  # deferrable work held this period (released when its deadline slack runs low)


@dataclass(frozen=True)
class PoolPlan:
    """Bounds for one pool: replicas of one model on one GPU type at one site.

    replica_floor, replica_ceiling : replicas the autoscaler keeps between (count).
    tp : tensor parallelism (GPUs per replica).
    precision : "bf16" or "fp8" weights (a change reloads weights).
    kv_dtype : KV-cache dtype, "auto" (bf16) or "fp8" (fp8 weights only; a change restarts the replica).
    max_num_batched_tokens : chunked-prefill token budget per iteration (tokens), None for the engine's default
        on the GPU type (vLLM's `--max-num-batched-tokens`; a change restarts the replica).
    max_batch : max concurrent sequences per replica (count).
    sm_clock_mhz : locked SM clock (MHz); immediate to change.
    """

    site: str
    model: str
    gpu: str
    replica_floor: int
    replica_ceiling: int
    tp: int
    precision: str
    max_batch: int
    sm_clock_mhz: int
    kv_dtype: str = "auto"
    max_num_batched_tokens: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.site, self.model, self.gpu)


@dataclass(frozen=True)
class Plan:
    """One control period's plan. `autoscale` False pins each pool at its floor (static fleet)."""

    pools: tuple[PoolPlan, ...]
    routing: Routing = Routing.PREFIX_LOAD
    ordering: Ordering = Ordering.EDF
    batch_admission: BatchAdmission = BatchAdmission.PRESSURE
    autoscale: bool = True
    autoscale_target: float = 0.8
    label: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def pool(self, site: str, model: str, gpu: str) -> PoolPlan:
        for p in self.pools:
            if p.key == (site, model, gpu):
                return p
        raise KeyError(f"plan has no pool {(site, model, gpu)}")

    def with_pools(self, pools: tuple[PoolPlan, ...]) -> Plan:
        return replace(self, pools=pools)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["routing"] = str(self.routing)
        d["ordering"] = str(self.ordering)
        d["batch_admission"] = str(self.batch_admission)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """The plan `as_dict` wrote (an audit record's `chosen_plan`, `reference_plan` or a top candidate's).

        >>> p = Plan((PoolPlan("us-east", "llama-3.1-8b", "H100", 1, 4, 1, "fp8", 64, 1590, "fp8"),), label="x")
        >>> q = Plan.from_dict(p.as_dict())
        >>> q == p, type(q.batch_admission).__name__
        (True, 'BatchAdmission')
        """
        enums = {"routing": Routing, "ordering": Ordering, "batch_admission": BatchAdmission}
        wide = {k: enums[k](d[k]) if k in enums else d[k] for k in (*enums, "autoscale", "autoscale_target", "label")
                if k in d}
        return cls(tuple(PoolPlan(**p) for p in d["pools"]), notes=tuple(d.get("notes", ())), **wide)
