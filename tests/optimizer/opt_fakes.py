"""Small, hand-checkable stand-ins for the optimizer's injected components.

FakeWorld scores a plan with a closed-form outcome (capacity per replica from the planner's serving model,
as the real forward model's is; unmet demand and large batches raise violations; cost is GPU-hours plus
energy at the forecast price), so the optimum over any finite set of plans can be
found by brute force. PersistenceForecasts forecasts the last observed period (no future leakage by
construction: it only reads what update() was given).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import polars as pl

from optimizer.replica_capacity import replica_rps
from schemas.fleet import FleetSpec, GpuType, NodeGroup, Site
from schemas.forecast import (
    ClassDemand,
    ClassOutcome,
    DisturbanceForecast,
    Interval,
    PredictedOutcome,
)
from schemas.plan import BatchAdmission, Plan, PoolPlan
from schemas.policy import History, Observations, Policy, PolicyContext
from worldmodel.horizon import Horizon, HorizonSpec, steps
from worldmodel.horizon import total as horizon_total
from worldmodel.servingmodel import ServingModel

T0 = datetime(2023, 7, 1, 12, tzinfo=UTC)
PERIOD_S = 300.0
SITE = Site("site-pjm", "PJM", (NodeGroup(GpuType.H100, 4, 1), NodeGroup(GpuType.A100, 4, 1)), 60_000.0,
            "us-east")
FLEET = FleetSpec((SITE,))
MAX_MHZ = {"H100": 1980, "A100": 1410}
RATE = {"H100": 2.5, "A100": 1.5}
SERVING = ServingModel()
TPOT_SLO_S = {"llama-3.1-8b": 0.05, "llama-3.1-70b": 0.1}
MODEL_OF = {"code": "llama-3.1-8b", "chat": "llama-3.1-70b", "batch": "llama-3.1-70b"}


def interval(v: float, rel: float = 0.1) -> Interval:
    return Interval(v, v * (1 - rel), v * (1 + rel), v * (1 - 2 * rel), v * (1 + 2 * rel))


def reference_plan(admission: BatchAdmission = BatchAdmission.PRESSURE) -> Plan:
    pools = (
        PoolPlan("site-pjm", "llama-3.1-8b", "A100", 5, 8, 1, "bf16", 256, 1410),
        PoolPlan("site-pjm", "llama-3.1-8b", "H100", 0, 8, 1, "bf16", 256, 1980),
        PoolPlan("site-pjm", "llama-3.1-70b", "H100", 5, 8, 4, "bf16", 256, 1980),
        PoolPlan("site-pjm", "llama-3.1-70b", "A100", 0, 4, 8, "bf16", 256, 1410),
    )
    return Plan(pools=pools, batch_admission=admission, label="stub-reference")


def forecast(price: float = 100.0, confidence: float = 0.9, code: float = 10.0, chat: float = 3.0,
             batch: float = 0.5, at: datetime = T0, backlog: int = 0) -> DisturbanceForecast:
    demand = (
        ClassDemand("code", "llama-3.1-8b", interval(code), 2000.0, 30.0, 4000.0, 80.0),
        ClassDemand("chat", "llama-3.1-70b", interval(chat), 1200.0, 220.0, 3000.0, 600.0),
        ClassDemand("batch", "llama-3.1-70b", interval(batch), 1500.0, 300.0, 3000.0, 700.0),
    )
    return DisturbanceForecast(at, PERIOD_S, demand, interval(price, 0.2), False, confidence,
                               deferred_backlog_requests=backlog,
                               deferred_deadlines_s=tuple(1800.0 + 60 * i for i in range(min(backlog, 5))))


def fake_outcome(plan: Plan, f: DisturbanceForecast) -> PredictedOutcome:
    """Closed-form outcome: per model, capacity = sum floor x rps(batch, precision, clock); unmet demand and
    large batches raise violations; cost = GPU-hours x rate + energy at the forecast price."""
    hours = f.period_s / 3600.0
    cap: dict[str, float] = {}
    power_w = 0.0
    gpu_cost = 0.0
    sizes = {d.model: (d.input_tokens_mean, d.output_tokens_mean) for d in f.demand}
    for p in plan.pools:
        clk = p.sm_clock_mhz / MAX_MHZ[p.gpu]
        rps = replica_rps(SERVING, p, *sizes[p.model], TPOT_SLO_S[p.model])
        cap[p.model] = cap.get(p.model, 0.0) + p.replica_floor * rps
        power_w += p.replica_floor * p.tp * (100.0 + 500.0 * clk**2)
        gpu_cost += p.replica_floor * p.tp * RATE[p.gpu] * hours
    hold = plan.batch_admission == BatchAdmission.HOLD
    demand: dict[str, float] = {}
    for d in f.demand:
        if not (hold and d.request_class == "batch"):
            demand[d.model] = demand.get(d.model, 0.0) + d.arrivals_per_s.point
    classes = []
    sla_met = carry = 0.0
    for d in f.demand:
        m = d.model
        short = max(0.0, 1.0 - cap.get(m, 0.0) / demand[m]) if demand.get(m) else 0.0
        big = max(p.max_batch for p in plan.pools if p.model == m)
        vr = min(1.0, short + 0.004 * (big / 512) ** 2)
        offered = d.arrivals_per_s.point * f.period_s
        held = hold and d.request_class == "batch"
        served = 0.0 if held else offered
        carry += offered if held else 0.0
        vr = 0.0 if held else vr
        sla_met += served * (1 - vr)
        classes.append(ClassOutcome(d.request_class, offered, served, vr, vr * 1.2, 500.0, 40.0))
    energy_kwh = power_w / 1e3 * hours * 1.3
    energy_cost = energy_kwh * f.price_usd_mwh.point / 1e3
    cost = gpu_cost + energy_cost + 1e-6
    gp = sla_met / cost
    return PredictedOutcome(tuple(classes), gpu_cost / 2.0, energy_kwh, energy_cost, cost, cost, 0, carry,
                            power_w, sla_met, gp, gp * 0.95)


class FakeWorld:
    """WorldModelPort over fake_outcome; counts evaluations."""

    def __init__(self) -> None:
        self.evaluations = 0
        self._prices: dict[datetime, float] = {}

    def start(self, ctx: PolicyContext, history: History) -> None:
        self._prices = {}
        self._add(history.prices)

    def update(self, obs: Observations) -> None:
        self._add(obs.prices)

    def _add(self, frame: pl.DataFrame) -> None:
        if frame.height:
            self._prices.update(dict(frame.select("interval_start", "lmp_usd_mwh").iter_rows()))

    def prices(self, market: str, as_of: datetime) -> pl.DataFrame:
        rows = sorted(self._prices.items())
        return pl.DataFrame({"interval_start": [a for a, _ in rows], "lmp_usd_mwh": [v for _, v in rows]},
                            schema={"interval_start": pl.Datetime("us", "UTC"), "lmp_usd_mwh": pl.Float64})

    def evaluator(self, as_of: datetime, f: DisturbanceForecast, in_force: Plan | None = None,
                  running: Plan | None = None, spread: bool = True) -> Callable[[Plan], PredictedOutcome]:
        def evaluate(plan: Plan) -> PredictedOutcome:
            self.evaluations += 1
            return fake_outcome(plan, f)

        return evaluate

    def horizon(self, as_of: datetime, forecasts: tuple[DisturbanceForecast, ...], spec: HorizonSpec,
                in_force: Plan | None = None, running: Plan | None = None,
                continuation: tuple[BatchAdmission, ...] = ()) -> Callable[[Plan], Horizon]:
        """Each forecast period scored with fake_outcome, the fleet carried as is (the horizon's total)."""
        def path(plan: Plan) -> Horizon:
            snap_free = [(i, n, fake_outcome(plan, forecasts[i])) for i, n in steps(len(forecasts), spec)]
            self.evaluations += len(snap_free)
            return Horizon(tuple(snap_free), horizon_total([o for _, _, o in snap_free]))

        return path

    def replicas(self, as_of: datetime) -> dict[tuple[str, str, str], int]:
        return {}

    def waiting(self, as_of: datetime) -> dict[tuple[str, str, str], float]:
        return {}

    def serving(self) -> ServingModel:
        return ServingModel()


class PersistenceForecasts:
    """Forecasts the last observed period: arrival rates per class and the last published price."""

    def __init__(self, confidence: float = 0.9) -> None:
        self.confidence = confidence
        self.rates = {"code": 10.0, "chat": 3.0, "batch": 0.5}
        self.price = 100.0

    def start(self, ctx: PolicyContext, history: History) -> None:
        if history.prices.height:
            self.price = float(history.prices["lmp_usd_mwh"][-1])

    def update(self, obs: Observations) -> None:
        if obs.arrivals.height:
            counts = obs.arrivals.group_by("request_class").len()
            for cls, n in counts.iter_rows():
                self.rates[cls] = n / PERIOD_S
        if obs.prices.height:
            self.price = float(obs.prices.sort("interval_start")["lmp_usd_mwh"][-1])

    def forecast(self, as_of: datetime, periods: int) -> tuple[DisturbanceForecast, ...]:
        return tuple(forecast(self.price, self.confidence, self.rates["code"], self.rates["chat"],
                              self.rates["batch"], as_of + timedelta(seconds=PERIOD_S * k))
                     for k in range(periods))


class StubReference(Policy):
    """A reference policy that always returns the same plan."""

    name = "stub-reference"

    def __init__(self, plan: Plan | None = None) -> None:
        self._plan = plan or reference_plan()

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return self._plan

    def plan(self, obs: Observations) -> Plan:
        return self._plan


def context() -> PolicyContext:
    return PolicyContext(FLEET, ("PJM",), T0, PERIOD_S, 12, 0)


def history(price: float = 100.0) -> History:
    prices = pl.DataFrame({"interval_start": [T0 - timedelta(hours=h) for h in range(168, 0, -1)],
                           "lmp_usd_mwh": [price * (0.5 + (h % 24) / 24) for h in range(168, 0, -1)]})
    return History(pl.DataFrame(), pl.DataFrame(), prices)


def observations(k: int, code: int = 3000, chat: int = 900, batch: int = 150, price: float = 100.0,
                 tenant_regions: tuple[str, ...] = ("us-east",)) -> Observations:
    """Observations delivered at the close of period k (arrivals in (k-1, k], the price of hour k)."""
    as_of = T0 + timedelta(seconds=PERIOD_S * k)
    n = code + chat + batch
    classes = ["code"] * code + ["chat"] * chat + ["batch"] * batch
    event = [as_of - timedelta(seconds=PERIOD_S * (i + 0.5) / n) for i in range(n)]
    arrivals = pl.DataFrame({
        "request_class": classes,
        "model": [MODEL_OF[c] for c in classes],
        "tenant": ["t-" + c for c in classes],
        "allowed_regions": [list(tenant_regions)] * n,
        "event_at": event,
        "deadline_at": [e + timedelta(minutes=30 + (i % 150)) if c == "batch" else None
                        for i, (c, e) in enumerate(zip(classes, event, strict=True))],
        "sla_tpot_ms": [50.0 if c == "code" else 100.0 if c == "chat" else None for c in classes],
        "input_tokens": [1000] * n,
    })
    prices = pl.DataFrame({"interval_start": [as_of], "lmp_usd_mwh": [price]})
    empty = pl.DataFrame()
    return Observations(as_of, k, arrivals, empty, empty, empty, prices)
