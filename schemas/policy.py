"""The one interface every policy shares (Aurelius and every reference); the registry is optimizer.registry.

A policy is told the static context once (`start`), then at each control period's close gets only the
observations that arrived in that period (`plan`) and returns the plan for the next period. It keeps
whatever state it needs itself, like a river estimator. It never sees the workload builder or the
ground-truth simulator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import polars as pl

from schemas.fleet import FleetSpec
from schemas.plan import Plan

#: The production-class references of DESIGN.md, in the order a replay job runs them (before any aurelius arm).
REFERENCE_POLICIES: tuple[str, ...] = ("production", "production-tuned", "naive")


@dataclass(frozen=True)
class Observations:
    """Records that arrived in (previous close, as_of]; frames follow schemas/ (see schemas/README.md).

    arrivals, completions, telemetry, fleet_events : as emitted by the serving fleet.
    prices : price records whose publication time is <= as_of and that were not delivered before.
    """

    as_of: datetime
    period_index: int
    arrivals: pl.DataFrame
    completions: pl.DataFrame
    telemetry: pl.DataFrame
    fleet_events: pl.DataFrame
    prices: pl.DataFrame


@dataclass(frozen=True)
class History:
    """The 7 days before the window, as aggregates only (DESIGN.md "History").

    arrivals_per_minute : minute_at, class, requests.
    size_quantiles : period_at, class, input_tokens_p50/p90/p99, output_tokens_p50/p90/p99.
    prices : hourly price records (with published_at) up to the window start.
    """

    arrivals_per_minute: pl.DataFrame
    size_quantiles: pl.DataFrame
    prices: pl.DataFrame


@dataclass(frozen=True)
class PolicyContext:
    """Static context: fleet inventory, the market(s) served, timing, the protocol's SLAs, and the fleet
    state reported at window start."""

    fleet: FleetSpec
    markets: tuple[str, ...]
    window_start: datetime
    period_s: float
    periods: int
    seed: int
    sla: dict[str, dict[str, float | None]] = field(default_factory=dict)
    #: replicas warm or loading per (site, model, gpu) at window start, as the fleet reported them (the
    #: fleet was already serving; empty when unknown)
    initial_replicas: dict[tuple[str, str, str], int] = field(default_factory=dict)


class Policy(ABC):
    """Base of every policy. Subclasses set `name` and implement `start` and `plan`."""

    name: str = ""

    @abstractmethod
    def start(self, ctx: PolicyContext, history: History) -> Plan:
        """Take the static context and history; return the plan for the first period."""

    @abstractmethod
    def plan(self, obs: Observations) -> Plan:
        """Return the plan for the period that starts at obs.as_of."""

    def last_decision(self) -> dict[str, Any] | None:
        """The audit record of the last decision, if this policy keeps one."""
        return None
