"""`production`: the reference as deployed (DESIGN.md).

bf16, vLLM V1-default batching per GPU type (max_num_seqs 1024 on H100, 256 on A100; chunked prefill),
maximum clock, an HPA-like autoscaler on
backlog and utilization (target 80%, 15 s sync, 300 s scale-down stabilization, cold starts), prefix-aware
routing with load fallback, earliest-deadline ordering, deferrable work deferred only under pressure.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from optimizer.baselines.sizing import (
    mean_sizes,
    rate_per_class,
    replicas_for,
    served_sites,
    site_pools,
    split_rates,
)
from optimizer.registry import register
from schemas.plan import BatchAdmission, Ordering, Plan, Routing
from schemas.policy import History, Observations, Policy, PolicyContext


@register("production")
class ProductionPolicy(Policy):
    """The production-class reference as deployed. max_batch : sequences per replica (None: the engine's
    default max_num_seqs for each pool's GPU type); target : HPA target."""

    name = "production"

    def __init__(self, max_batch: int | None = None, target: float = 0.8) -> None:
        self.max_batch = max_batch
        self.target = target
        self._plan: Plan | None = None

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        # the fleet the autoscaler had reached at window start: as reported, else Little's law on the last 15 min
        rates = rate_per_class(history.arrivals_per_minute, last=timedelta(minutes=15))
        sizes = mean_sizes(history.size_quantiles)
        pools = tuple(
            p
            for s in served_sites(ctx)
            for p in site_pools(
                s,
                floors=replicas_for(
                    split_rates(rates, served_sites(ctx)), sizes, s, max_batch=self.max_batch, utilization=self.target
                ),
                max_batch=self.max_batch,
            )
        )
        if ctx.initial_replicas:
            pools = tuple(replace(p, replica_floor=ctx.initial_replicas.get(p.key, 0)) for p in pools)
        first = self._make(pools, "production: the fleet running at window start")
        steady = tuple(p.__class__(**{**p.__dict__, "replica_floor": min(p.replica_floor, 1)}) for p in pools)
        self._plan = self._make(steady, "production: HPA within [1, inventory]")
        return first

    def _make(self, pools: tuple, label: str) -> Plan:
        return Plan(
            pools=pools,
            routing=Routing.PREFIX_LOAD,
            ordering=Ordering.EDF,
            batch_admission=BatchAdmission.PRESSURE,
            autoscale=True,
            autoscale_target=self.target,
            label=label,
        )

    def plan(self, obs: Observations) -> Plan:
        assert self._plan is not None, "start() first"
        return self._plan
