"""The real components behind the Aurelius policy's `ForecastProvider` port.

- `ForecastingProvider`: forecasting's `MarketForecaster` facade (every site's market price in the three-site
  mode), plus the waiting deferrable backlog (arrived, not completed; deadlines from as_of) and the share of
  each model's arrivals pinned to one region, counted from the same observations.
- `OracleForecastProvider`: the same facade fed the realized future (arrivals per class per period, p50/p90
  input and output sizes, realized prices) computed from the replay's `Workload`, flagged oracle in every
  forecast's provenance. Only the `oracle` arm gets it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from forecasting.bundle import MarketForecaster
from schemas.forecast import DisturbanceForecast, Interval
from schemas.policy import History, Observations, PolicyContext
from schemas.protocol import CLASSES

#: Waiting deferrable requests' deadlines handed to the forecast (a quantile sample; count).
DEADLINE_SAMPLE = 24


class _Backlog:
    """Deferrable requests that arrived and have not completed, with their deadlines (from observations)."""

    def __init__(self) -> None:
        self.deadline: dict[str, datetime] = {}

    def update(self, obs: Observations) -> None:
        a = obs.arrivals
        if a.height and "deadline_at" in a.columns:
            d = a.filter(pl.col("deadline_at").is_not_null()).select("request_id", "deadline_at")
            self.deadline.update(zip(d["request_id"].to_list(), d["deadline_at"].to_list(), strict=True))
        c = obs.completions
        if c.height and self.deadline:
            for rid in c["request_id"].to_list():
                self.deadline.pop(rid, None)

    def apply(self, f: DisturbanceForecast, as_of: datetime) -> DisturbanceForecast:
        if not self.deadline:
            return f
        left = np.sort(np.array([(d - as_of).total_seconds() for d in self.deadline.values()]))
        if len(left) > DEADLINE_SAMPLE:
            left = np.quantile(left, np.linspace(0.0, 1.0, DEADLINE_SAMPLE))
        return replace(
            f, deferred_backlog_requests=len(self.deadline), deferred_deadlines_s=tuple(float(x) for x in left)
        )


class _Residency:
    """Arrivals per model whose tenant may run in one region only, per region (counts, from observations)."""

    def __init__(self) -> None:
        self.total: dict[str, int] = {}
        self.pinned: dict[tuple[str, str], int] = {}

    def update(self, obs: Observations) -> None:
        a = obs.arrivals
        if a.height == 0 or not {"model", "allowed_regions"} <= set(a.columns):
            return
        for model, n in a.group_by("model").len().iter_rows():
            self.total[model] = self.total.get(model, 0) + int(n)
        one = a.filter(pl.col("allowed_regions").list.len() == 1)
        if one.height:
            counts = one.group_by("model", pl.col("allowed_regions").list.first().alias("region")).len()
            for model, region, n in counts.iter_rows():
                self.pinned[(model, region)] = self.pinned.get((model, region), 0) + int(n)

    def shares(self) -> dict[tuple[str, str], float]:
        return {k: n / self.total[k[0]] for k, n in self.pinned.items() if self.total.get(k[0])}


class ForecastingProvider:
    """`ForecastProvider` over forecasting's `MarketForecaster` (one market) plus the observed backlog.

    Two adjustments to the facade's output, both recorded in each forecast's provenance:

    - confidence (what the fallback reads) is the demand forecasters' (arrivals per class); the price
      forecaster's confidence is kept as `confidence.price`. Price uncertainty already enters the decision
      through the risk-adjusted price (point + rho x (hi80 - point)) and gp/$_lo, and it is widest exactly in
      the price spikes the optimizer exists for; gating on it would hand every expensive hour to the fallback.
    - periods after the replay window (`PolicyContext`: window_start + periods x period_s) get zero arrivals:
      the benchmark protocol's drain offers no new requests (DESIGN.md "Time"), which every policy is told
      through the context. Without this the planner would keep capacity for forecast demand that the
      protocol never sends. `window_end_known=False` turns it off (a live deployment has no drain).

    Parameters
    ----------
    horizon_periods : default periods forecast (count).
    truth : oracle only: series name -> (values, step starts) realized (see `MarketForecaster`).
    window_end_known : apply the protocol's drain (above).
    window_periods : periods that receive arrivals, when the replay was configured shorter than its context's
        window (`aurelius replay --periods N`: arrivals for N periods, the run still spans the 3-h window).
    """

    oracle = False

    def __init__(
        self,
        horizon_periods: int = 12,
        truth: dict[str, tuple[Any, Any]] | None = None,
        window_end_known: bool = True,
        window_periods: int | None = None,
    ) -> None:
        self.horizon_periods = horizon_periods
        self.window_periods = window_periods
        self.truth = truth
        self.window_end_known = window_end_known
        self.mf: Any = None
        self.backlog = _Backlog()
        self.residency = _Residency()
        self._window_end: datetime | None = None

    def start(self, ctx: PolicyContext, history: History) -> None:

        self.mf = MarketForecaster(
            ctx.markets[0], period_s=ctx.period_s, horizon_periods=self.horizon_periods, seed=ctx.seed,
            truth=self.truth, other_markets=ctx.markets[1:],
        )
        self.mf.start(history, as_of=ctx.window_start)
        self.backlog = _Backlog()
        self.residency = _Residency()
        periods = self.window_periods or ctx.periods
        self._window_end = ctx.window_start + timedelta(seconds=periods * ctx.period_s)
        self.mf.forecast(ctx.window_start, self.horizon_periods)  # warm the models on the history (start-up)

    def update(self, obs: Observations) -> None:
        assert self.mf is not None, "start() first"
        self.mf.update(obs)
        self.backlog.update(obs)
        if len(self.mf.other_markets):  # residency is a choice only with several sites
            self.residency.update(obs)

    def forecast(self, as_of: datetime, periods: int) -> tuple[DisturbanceForecast, ...]:
        assert self.mf is not None, "start() first"
        raw = self.mf.forecast(as_of, periods)
        series = self.mf.last_forecasts
        demand_conf = [
            series[f"arrivals/{c}"].confidence for c in CLASSES if f"arrivals/{c}" in series
        ]
        price = series.get("price")
        pinned = self.residency.shares()
        out = []
        for f in raw:
            drained = self.window_end_known and self._window_end is not None and f.period_start >= self._window_end
            conf = 1.0 if drained else float(min(demand_conf, default=0.0))
            prov = {
                **f.provenance,
                "confidence": "arrivals forecasters (price: risk-adjusted objective)",
                "confidence.facade": f"{f.confidence:.3f}",
                "confidence.price": f"{price.confidence:.3f}" if price is not None else "n/a",
            }
            demand = f.demand
            if drained:
                zero = Interval(0.0, 0.0, 0.0, 0.0, 0.0)
                demand = tuple(replace(d, arrivals_per_s=zero) for d in f.demand)
                prov["arrivals"] = "protocol drain: no arrivals after the window"
            if self.oracle:
                prov |= {"oracle": "true", "forecast": "oracle (realized future)"}
            out.append(replace(f, demand=demand, confidence=conf, provenance=prov, pinned_share=pinned))
        out[0] = self.backlog.apply(out[0], as_of)
        return tuple(out)


class OracleForecastProvider(ForecastingProvider):
    """The realized future of `workload` as the forecast: oracle arm only (flagged oracle in provenance).

    Arrivals per class per period, p50/p90 input and output tokens per class per period (the output sizes
    the policy could not know at arrival) and realized hourly prices come from the workload; the prefix
    reuse series stays the learned forecaster's (it depends on routing, not on the workload alone).
    """

    oracle = True

    def __init__(
        self, workload: Any, period_s: float = 300.0, horizon_periods: int = 12, window_periods: int | None = None
    ) -> None:
        super().__init__(horizon_periods, realized_series(workload, period_s), window_periods=window_periods)


def realized_series(workload: Any, period_s: float) -> dict[str, tuple[np.ndarray, list[datetime]]]:
    """The workload's realized disturbance series in `MarketForecaster` series names (oracle only)."""
    start = workload.window.start
    req = workload.requests.with_columns((pl.col("arrival_s") // period_s).cast(pl.Int64).alias("_k"))
    n = int(req["_k"].max()) + 1 if req.height else 0
    steps = [start + timedelta(seconds=k * period_s) for k in range(n)]
    out: dict[str, tuple[np.ndarray, list[datetime]]] = {}
    agg = req.group_by("request_class", "_k").agg(
        pl.len().alias("arrivals"),
        pl.col("input_tokens").quantile(0.5).alias("input_p50"),
        pl.col("input_tokens").quantile(0.9).alias("input_p90"),
        pl.col("output_tokens").quantile(0.5).alias("output_p50"),
        pl.col("output_tokens").quantile(0.9).alias("output_p90"),
    )
    for c in CLASSES:
        part = agg.filter(pl.col("request_class") == c)
        ks = part["_k"].to_numpy()
        for kind in ("arrivals", "input_p50", "input_p90", "output_p50", "output_p90"):
            y = np.zeros(n) if kind == "arrivals" else np.full(n, np.nan)
            y[ks] = part[kind].to_numpy().astype(float)
            if kind != "arrivals":  # a period without arrivals of the class keeps the previous size
                y = (
                    pl.Series(y)
                    .fill_nan(None)
                    .fill_null(strategy="forward")
                    .fill_null(strategy="backward")
                    .fill_null(0.0)
                    .to_numpy()
                )
            out[f"{kind}/{c}"] = (y, steps)
    prices = (
        workload.prices.sort("interval_start", "published_at")
        .unique("interval_start", keep="last")
        .sort("interval_start")
    )
    out["price"] = (prices["lmp_usd_mwh"].to_numpy().astype(float), prices["interval_start"].to_list())
    return out
