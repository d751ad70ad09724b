"""What the optimizer itself keeps from the observation stream: tenants with their models and allowed regions
(residency and precision gates), deadline slack of deferrable work and the TPOT SLO per model (deferral LP and
sizing). Only records already delivered are read. Prices are not kept here: the world state holds them
(`WorldModelPort.prices`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import polars as pl

from optimizer.gates import Tenant

#: Until deferrable arrivals are observed, assume the shortest slack the operator promises (s; modeled).
DEFAULT_DEADLINE_SLACK_S = 1800.0


@dataclass
class ObservedState:
    """Running summaries of delivered observations.

    deadline_slack_s : deadline - arrival of deferrable requests seen (s); tpot_slo_s : tightest interactive
    TPOT SLO per model (s).
    """

    tenant_models: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    tenant_regions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    deadline_slack_s: list[float] = field(default_factory=list)
    tpot_slo_s: dict[str, float] = field(default_factory=dict)

    def update_arrivals(self, frame: pl.DataFrame) -> None:
        """Learn tenants, allowed regions, deferrable deadline slack and TPOT SLOs from request arrivals."""
        if frame.height == 0:
            return
        cols = set(frame.columns)
        if {"tenant", "model"} <= cols:
            regions = "allowed_regions" in cols
            sel = frame.select("tenant", "model", *(["allowed_regions"] if regions else [])).unique(
                subset=["tenant", "model"])
            for row in sel.iter_rows(named=True):
                self.tenant_models[row["tenant"]].add(row["model"])
                if regions and row["allowed_regions"] is not None:
                    self.tenant_regions[row["tenant"]] = tuple(sorted(row["allowed_regions"]))
        if {"deadline_at", "event_at"} <= cols:
            d = frame.filter(pl.col("deadline_at").is_not_null())
            if d.height:
                slack = (d["deadline_at"] - d["event_at"]).dt.total_microseconds() / 1e6
                self.deadline_slack_s.extend(float(s) for s in slack.to_list())
                self.deadline_slack_s = self.deadline_slack_s[-5000:]
        if {"sla_tpot_ms", "model"} <= cols:
            t = (frame.filter(pl.col("sla_tpot_ms").is_not_null())
                 .group_by("model").agg(pl.col("sla_tpot_ms").min()))
            for model, ms in t.iter_rows():
                self.tpot_slo_s[model] = min(self.tpot_slo_s.get(model, float("inf")), float(ms) / 1e3)

    def tenants(self) -> dict[str, Tenant]:
        """Tenants seen so far with their models and allowed regions."""
        return {t: Tenant(tuple(sorted(ms)), self.tenant_regions.get(t, ()))
                for t, ms in sorted(self.tenant_models.items())}

    def slack_quantiles(self, qs: tuple[float, ...] = (0.1, 0.5, 0.9)) -> tuple[float, ...]:
        """Quantiles of deferrable deadline slack (s); the default slack when none was observed."""
        if not self.deadline_slack_s:
            return tuple(DEFAULT_DEADLINE_SLACK_S for _ in qs)
        s = sorted(self.deadline_slack_s)
        return tuple(s[min(int(q * len(s)), len(s) - 1)] for q in qs)
