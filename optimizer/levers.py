"""The seven levers as value sets per pool, and small pure moves on a Plan.

Levers (DESIGN.md vocabulary): capacity (replica floor/ceiling), batching (max_batch), precision (bf16/fp8
where the GPU and the policy allow), SM clock (discrete steps per GPU type), placement (which GPU types and
sites serve a model: a pool is present, or zero-ceiling), routing, and timing (batch admission, set from
the deferral LP's schedule).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

from schemas.fleet import PRECISIONS_BY_GPU, SM_CLOCK_RANGE_MHZ, FleetSpec, GpuType, kv_dtype_for
from schemas.plan import BatchAdmission, Plan, PoolPlan, Routing
from worldmodel.snapshot import pool_name

#: Max concurrent sequences per replica the optimizer may set (count).
MAX_BATCH_STEPS: tuple[int, ...] = (64, 128, 256, 384, 512)
#: NVIDIA application clocks move in steps of this size (MHz).
CLOCK_GRANULARITY_MHZ = 15


def clock_steps(gpu: str, n: int = 5) -> tuple[int, ...]:
    """Evenly spaced SM clock steps over the GPU's range, both ends included.

    Parameters
    ----------
    gpu : GPU type name ("H100", "A100").
    n : number of steps (count, >= 1; 1 is the maximum clock alone).

    Returns
    -------
    Clocks (MHz), ascending, on the 15 MHz grid; the last is the maximum (boost) clock.

    Examples
    --------
    >>> clock_steps("A100", 3)
    (1005, 1215, 1410)
    """
    lo, hi = SM_CLOCK_RANGE_MHZ[GpuType(gpu)]
    if n < 1:
        raise ValueError(f"clock steps must be >= 1, got {n}")
    if n == 1:
        return (hi,)
    g = CLOCK_GRANULARITY_MHZ
    inner = [lo + round((hi - lo) * i / (n - 1) / g) * g for i in range(1, n - 1)]
    return (lo, *inner, hi)


@dataclass(frozen=True)
class PrecisionPolicy:
    """Which precisions the operator allows, per model and per tenant (absent = no restriction).

    A pool serving a model may use a precision only if the GPU has it, the model allows it and every
    tenant known to use the model allows it.
    """

    by_model: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    by_tenant: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def allowed(self, gpu: str, model: str, tenants: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Precisions allowed for `model` on `gpu` given the tenants that send it traffic."""
        out = [str(p) for p in PRECISIONS_BY_GPU[GpuType(gpu)]]
        if model in self.by_model:
            out = [p for p in out if p in self.by_model[model]]
        for t in tenants:
            if t in self.by_tenant:
                out = [p for p in out if p in self.by_tenant[t]]
        return tuple(out)


@dataclass(frozen=True)
class PoolLevers:
    """Value sets of one pool's levers.

    max_replicas : inventory bound, GPUs of the type at the site // tp (count).
    """

    key: tuple[str, str, str]
    max_replicas: int
    precisions: tuple[str, ...]
    max_batches: tuple[int, ...]
    clocks_mhz: tuple[int, ...]


@dataclass(frozen=True)
class LeverSpace:
    """All lever value sets for a fleet: per pool, plus the plan-wide routing and admission sets."""

    pools: tuple[PoolLevers, ...]
    routings: tuple[Routing, ...] = (Routing.PREFIX_LOAD, Routing.LEAST_LOAD)
    admissions: tuple[BatchAdmission, ...] = (BatchAdmission.IMMEDIATE, BatchAdmission.PRESSURE,
                                              BatchAdmission.HOLD)

    def pool(self, key: tuple[str, str, str]) -> PoolLevers:
        for p in self.pools:
            if p.key == key:
                return p
        raise KeyError(f"no levers for pool {key}")


def lever_space(
    fleet: FleetSpec,
    pools: tuple[PoolPlan, ...],
    precision_policy: PrecisionPolicy | None = None,
    tenants_by_model: Mapping[str, tuple[str, ...]] | None = None,
    clock_levels: int = 5,
) -> LeverSpace:
    """Build the lever value sets for the pools of a plan (normally the reference plan's pools).

    Parameters
    ----------
    fleet : the inventory (GPUs per type and site).
    pools : the pools to cover; each keeps its tp.
    precision_policy : operator's allowed precisions; None allows whatever the GPU has.
    tenants_by_model : tenants seen sending traffic to each model (for tenant precision rules).
    clock_levels : SM clock steps per GPU type (count).
    """
    pp = precision_policy or PrecisionPolicy()
    tbm = tenants_by_model or {}
    out = []
    for p in pools:
        site = next(s for s in fleet.sites if s.name == p.site)
        out.append(PoolLevers(
            key=p.key,
            max_replicas=site.gpus(GpuType(p.gpu)) // p.tp,
            precisions=pp.allowed(p.gpu, p.model, tbm.get(p.model, ())),
            max_batches=MAX_BATCH_STEPS,
            clocks_mhz=clock_steps(p.gpu, clock_levels),
        ))
    return LeverSpace(pools=tuple(out))


def set_pool(plan: Plan, key: tuple[str, str, str], **changes: object) -> Plan:
    """Return `plan` with the pool `key` changed (PoolPlan field names as keywords)."""
    return plan.with_pools(tuple(replace(p, **changes) if p.key == key else p for p in plan.pools))


def map_pools(plan: Plan, **changes: object) -> Plan:
    """Return `plan` with the same field changes applied to every pool."""
    return plan.with_pools(tuple(replace(p, **changes) for p in plan.pools))


def plan_key(plan: Plan) -> tuple[object, ...]:
    """A hashable identity of a plan's decision content: every field of the plan and of its pools, label and
    notes excluded. Pool order is part of it: the autoscaler grows a model's replicas in the plan's pool order
    (placement). Built from the dataclass fields, so a lever added to the plan is never left out (before, the
    KV dtype and the token budget were: a plan that restarts every replica scored as the reference from the
    cache)."""
    pools = tuple(tuple(getattr(p, f) for f in _POOL_FIELDS) for p in plan.pools)
    return (pools, *(getattr(plan, f) for f in _PLAN_FIELDS))


_POOL_FIELDS = tuple(f.name for f in fields(PoolPlan))
_PLAN_FIELDS = tuple(f.name for f in fields(Plan) if f.name not in ("pools", "label", "notes"))


def neighbours(plan: Plan, space: LeverSpace, levers: tuple[str, ...],
               pools: tuple[tuple[str, str, str], ...] | None = None) -> Iterator[tuple[str, Plan]]:
    """One-step coordinate moves of `plan` along the named levers.

    Levers: "clock", "batch", "precision", "capacity" (floor and ceiling +-1 replica, or +-25% when
    larger), "admission", "routing". Yields (move description, plan); moves off the value sets are skipped.
    Plan-wide levers (admission, routing) come first: they are few. `pools` limits the per-pool moves to
    those pool keys (None: every pool).
    """
    if "admission" in levers:
        for a in space.admissions:
            if a != plan.batch_admission:
                yield f"admission {a}", replace(plan, batch_admission=a)
    if "routing" in levers:
        for r in space.routings:
            if r != plan.routing:
                yield f"routing {r}", replace(plan, routing=r)
    for p in plan.pools:
        if pools is not None and p.key not in pools:
            continue
        lv = space.pool(p.key)
        name = pool_name(p.key)
        if "clock" in levers:
            for c in _adjacent(lv.clocks_mhz, p.sm_clock_mhz):
                yield f"{name} clock {c}", set_pool(plan, p.key, sm_clock_mhz=c)
        if "batch" in levers:
            for b in _adjacent(lv.max_batches, p.max_batch):
                yield f"{name} batch {b}", set_pool(plan, p.key, max_batch=b)
        if "precision" in levers:
            for q in lv.precisions:
                if q != p.precision:
                    yield f"{name} precision {q}", set_pool(plan, p.key, precision=q,
                                                            kv_dtype=kv_dtype_for(q, p.kv_dtype))
        if "capacity" in levers:
            step = max(1, round(0.25 * max(p.replica_floor, 1)))
            for d in (-step, step):
                floor = min(max(p.replica_floor + d, 0), lv.max_replicas)
                ceiling = min(max(p.replica_ceiling + d, floor), lv.max_replicas)
                if (floor, ceiling) != (p.replica_floor, p.replica_ceiling):
                    yield f"{name} capacity {floor}-{ceiling}", set_pool(
                        plan, p.key, replica_floor=floor, replica_ceiling=ceiling)


def _adjacent(values: tuple[int, ...], current: int) -> list[int]:
    """The values just below and just above `current` in a sorted value set."""
    below = [v for v in values if v < current]
    above = [v for v in values if v > current]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])
