"""`naive`: a static fleet sized for mean load, first come first served, round-robin routing, continuous
batching, no autoscaling, deferrable work run at once (DESIGN.md)."""

from __future__ import annotations

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


@register("naive")
class NaivePolicy(Policy):
    """Static fleet: replicas = mean-load concurrency / batch, no headroom. max_batch : sequences per replica
    (None: the engine's default max_num_seqs for each pool's GPU type)."""

    name = "naive"

    def __init__(self, max_batch: int | None = None) -> None:
        self.max_batch = max_batch
        self._plan: Plan | None = None

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        rates = rate_per_class(history.arrivals_per_minute)
        sizes = mean_sizes(history.size_quantiles)
        pools = []
        for s in served_sites(ctx):
            floors = replicas_for(
                split_rates(rates, served_sites(ctx)), sizes, s, max_batch=self.max_batch, utilization=1.0
            )
            for p in site_pools(s, floors=floors, max_batch=self.max_batch):
                pools.append(p.__class__(**{**p.__dict__, "replica_ceiling": p.replica_floor}))
        self._plan = Plan(
            pools=tuple(pools),
            routing=Routing.ROUND_ROBIN,
            ordering=Ordering.FCFS,
            batch_admission=BatchAdmission.IMMEDIATE,
            autoscale=False,
            label="naive: static mean-load fleet",
        )
        return self._plan

    def plan(self, obs: Observations) -> Plan:
        assert self._plan is not None, "start() first"
        return self._plan
