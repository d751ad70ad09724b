"""The ground-truth side of AID's imposed-action test (``aurelius worldmodel-validate``).

:func:`realize` replays one market's window under either the logging policy (``production``) or a plan
imposed for the whole window, and yields one :class:`~streams.replay.validate_cli.RealizedPeriod` per control
period through the drain: the plan in force, the observations that arrived in the period (what a policy
would receive), the period's site energy and rented cost, and per-class outcomes of the requests that
*arrived* in it (unfinished requests count as violations).

Imposing a plan means a policy that returns it at every period close: the runtime's autoscaler then
moves only between the plan's floor and ceiling (a fixed capacity has floor == ceiling, or autoscale off).
Energy and cost come from the simulator's 10 s site ticks (metrics.period_costs), so summed over the
periods they equal the run's totals in results.json.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from optimizer.registry import create
from schemas.cost import CostConfig
from schemas.fleet import default_fleet
from schemas.plan import Plan
from schemas.policy import History, Observations, Policy, PolicyContext
from schemas.protocol import CLASSES
from streams.replay.driver import RunResult, run_replay
from streams.replay.metrics import period_costs, request_outcomes
from streams.replay.validate_cli import RealizedClass, RealizedPeriod
from streams.workload.builder import build_workload

LOGGING_POLICY = "production"


class ImposedPolicy(Policy):
    """A policy that returns the same plan at every period close (the imposed action).

    Parameters
    ----------
    plan : the plan imposed for the whole window (the autoscaler stays within its floor and ceiling).
    """

    name = "imposed"

    def __init__(self, plan: Plan) -> None:
        self._plan = plan

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        return self._plan

    def plan(self, obs: Observations) -> Plan:
        return self._plan


class _Recording(Policy):
    """Delegates to a policy and keeps every plan it returned (plans[k] is in force in period k)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.plans: list[Plan] = []

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        self.plans.append(self.inner.start(ctx, history))
        return self.plans[-1]

    def plan(self, obs: Observations) -> Plan:
        self.plans.append(self.inner.plan(obs))
        return self.plans[-1]

    def last_decision(self) -> dict[str, Any] | None:
        return self.inner.last_decision()


def run_window(market: str, plan: Plan | None, args: argparse.Namespace) -> tuple[RunResult, list[Plan]]:
    """Replay the window the CLI's window flags select under `plan` (None: the logging policy).

    Parameters
    ----------
    market : "PJM", "ERCOT" or "CAISO".
    plan : plan imposed for the whole window, or None for the logging policy's own plans.
    args : window flags (year, window_rule, start, periods, period_minutes, seed, source).

    Returns
    -------
    The raw run (observations kept) and the plan in force in each period.
    """
    start = datetime.fromisoformat(args.start) if getattr(args, "start", None) else None
    wl = build_workload(
        market,
        int(args.year),
        rule=args.window_rule,
        start=start,
        periods=args.periods,
        period_minutes=float(args.period_minutes),
        seed=int(args.seed),
        source=args.source,
    )
    policy = _Recording(ImposedPolicy(plan) if plan is not None else create(LOGGING_POLICY))
    period_s = float(args.period_minutes) * 60.0
    window_s = args.periods * period_s if args.periods else None  # a shortened window drains right after
    run = run_replay(
        wl, policy, default_fleet((market,)), period_s=period_s, window_s=window_s, keep_observations=True
    )
    return run, policy.plans




def realize(market: str, plan: Plan | None, args: argparse.Namespace) -> Iterator[RealizedPeriod]:
    """Ground-truth periods of one market's window (and drain) under `plan` (None: the logging policy).

    Parameters
    ----------
    market : the market whose default site and window are replayed.
    plan : imposed for the whole window, or None (``production`` decides every period).
    args : the CLI's window flags.

    Yields
    ------
    RealizedPeriod per control period in order, through the end of the drain.
    """
    run, plans = run_window(market, plan, args)
    yield from realized_periods(run, plans, float(args.period_minutes) * 60.0)


def realized_periods(
    run: RunResult, plans: list[Plan], period_s: float, cost: CostConfig | None = None
) -> Iterator[RealizedPeriod]:
    """Split one kept-observation run into :class:`RealizedPeriod` s (see :func:`realize`)."""
    assert run.observations is not None, "run_replay(..., keep_observations=True)"
    costs = period_costs(run, period_s, cost)
    classes = _class_outcomes(run, period_s, run.periods)
    start = run.workload.window.start
    for k in range(run.periods):
        as_of = start + timedelta(seconds=(k + 1) * period_s)
        obs = Observations(
            as_of=as_of,
            period_index=k + 1,
            prices=_prices(run, k, as_of, period_s),
            **{name: run.observations[name][k] for name in ("arrivals", "completions", "telemetry", "fleet_events")},
        )
        row = costs.row(k, named=True) if k < costs.height else {"energy_kwh": 0.0, "cost_usd": 0.0}
        yield RealizedPeriod(
            k,
            plans[min(k, len(plans) - 1)],
            obs,
            float(row["energy_kwh"]),
            float(row["cost_usd"]),
            classes[k],
        )


def _prices(run: RunResult, k: int, as_of: datetime, period_s: float) -> pl.DataFrame:
    """Price records published in period k (the replay keeps them for every period but the last)."""
    assert run.observations is not None
    kept = run.observations["prices"]
    if k < len(kept):
        return kept[k]
    prices = run.workload.prices
    f = pl.col("published_at") <= as_of
    if k > 0:
        f &= pl.col("published_at") > as_of - timedelta(seconds=period_s)
    return prices.filter(f).sort("published_at")


def _class_outcomes(run: RunResult, period_s: float, periods: int) -> list[dict[str, RealizedClass]]:
    """Per period, per class: outcomes of the requests that arrived in the period."""
    o = request_outcomes(run)
    k_arr = (run.runtime.req.arrival // period_s).astype(np.int64)
    out: list[dict[str, RealizedClass]] = [{} for _ in range(periods)]
    for k in range(periods):
        in_k = k_arr == k
        for c, name in enumerate(CLASSES):
            m = in_k & (o["cls"] == c)
            n = int(m.sum())
            if n == 0:
                continue
            out[k][name] = RealizedClass(
                offered=n,
                violation_rate=float((n - o["sla_met"][m].sum()) / n),
                ttft_p99_ms=_p99_ms(o["ttft_s"][m]),
                tpot_p99_ms=_p99_ms(o["tpot_s"][m & o["done"]]),
            )
    return out


def _p99_ms(x: np.ndarray) -> float:
    """99th percentile (ms) of the finite values (s); nan when there are none."""
    x = x[np.isfinite(x)]
    return float(np.percentile(x, 99) * 1000.0) if x.size else float("nan")


__all__ = ["ImposedPolicy", "LOGGING_POLICY", "realize", "realized_periods", "run_window"]
