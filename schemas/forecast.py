"""Typed boundary between forecasting/, worldmodel/ and optimizer/: the disturbances a plan is scored against
and the outcome the forward model predicts. Dataclasses only; no behaviour."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Interval:
    """A point forecast with its central 80% and 95% intervals (same unit as point)."""

    point: float
    lo80: float
    hi80: float
    lo95: float
    hi95: float


@dataclass(frozen=True)
class ClassDemand:
    """Forecast demand of one request class for one control period.

    arrivals_per_s : arrival rate (requests/s) with intervals.
    input_tokens_mean, output_tokens_mean : mean sizes (tokens).
    input_tokens_p90, output_tokens_p90 : upper sizes (tokens).
    prefix_hit_rate : expected share of input tokens served from prefix cache (0-1).
    """

    request_class: str
    model: str
    arrivals_per_s: Interval
    input_tokens_mean: float
    output_tokens_mean: float
    input_tokens_p90: float
    output_tokens_p90: float
    prefix_hit_rate: float = 0.0


@dataclass(frozen=True)
class MarketPrice:
    """Another site's market price for the period ($/MWh); published as in `DisturbanceForecast`."""

    market: str
    price_usd_mwh: Interval
    published: bool


@dataclass(frozen=True)
class DisturbanceForecast:
    """Everything exogenous for one period: demand per class, price ($/MWh), and the forecasters' confidence (0-1).

    price_published is True when the price of this period was already published as of the decision.
    deferred_backlog_requests : deferrable requests waiting (count) with their mean sizes; deadlines in
    deferred_deadlines_s (s from period start), one per waiting request or a representative sample.
    other_markets : the other sites' market prices (the three-site mode; `price_usd_mwh` is the first market's).
    pinned_share : share of a model's arrivals whose tenants may run in one region only, per (model, region)
        (0-1; the three-site mode's residency, learned from arrivals).
    """

    period_start: datetime
    period_s: float
    demand: tuple[ClassDemand, ...]
    price_usd_mwh: Interval
    price_published: bool
    confidence: float
    deferred_backlog_requests: int = 0
    deferred_deadlines_s: tuple[float, ...] = field(default_factory=tuple)
    provenance: dict[str, str] = field(default_factory=dict)
    other_markets: tuple[MarketPrice, ...] = ()
    pinned_share: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def drain(self) -> bool:
        """No arrivals possible in any class (every 95% bound zero): the window has ended, only held work is left."""
        return not any(d.arrivals_per_s.hi95 > 0.0 for d in self.demand)


@dataclass(frozen=True)
class ClassOutcome:
    """Predicted service of one class in one period. Rates are 0-1; times in ms."""

    request_class: str
    offered: float
    served: float
    violation_rate: float
    violation_rate_hi: float
    ttft_p99_ms: float
    tpot_p99_ms: float


@dataclass(frozen=True)
class PredictedOutcome:
    """What the forward model predicts for one plan over one period.

    gpu_hours : warm or loading GPU-hours; energy_kwh : site energy incl. PUE (kWh);
    cost_usd / cost_usd_owned : rented and owned basis ($); reloads : replicas reloading (count);
    deferred_carryover : deferrable requests left waiting at period end; peak_power_w : site IT power (W).
    sla_met : expected SLA-met requests; risk : spread of gp/$ from forecast intervals and the risk band.
    pool_replicas : warm + loading replicas per (site, model, gpu) pool the period ends with (count; the
    horizon's next step starts from them).
    """

    classes: tuple[ClassOutcome, ...]
    gpu_hours: float
    energy_kwh: float
    energy_cost_usd: float
    cost_usd: float
    cost_usd_owned: float
    reloads: int
    deferred_carryover: float
    peak_power_w: float
    sla_met: float
    gp_per_dollar: float
    gp_per_dollar_lo: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    pool_replicas: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
