"""The Aurelius policy: observe -> forecast -> simulate -> decide, once per control period.

Each period: update the forecasters and the world model with the delivered observations, forecast the
next periods, generate physics-guided coupled candidates, run the bounded search (forward model + hard
gates + risk-adjusted gp/$), apply the Pareto gate against the reference policy's plan for the same period
and the confidence fallback, return the chosen plan and keep an audit record; then, outside the decision's
latency, score the independent audit grid and record the regret.

Everything it depends on is injected: a `ForecastProvider` (the forecasters, or an oracle fed the realized
future), a `WorldModelPort` (state + forward model: `evaluator(as_of, forecast, in_force)` returns
`plan -> PredictedOutcome`), both in optimizer/ports.py, and the reference policy (by registry name, or an
instance).

A fresh start (a history without prices and without arrivals: the Kafka worker without --history-from-replay)
lacks the market's price, GPU telemetry and request arrivals: until each has been delivered every decision is
the reference plan, flagged fallback with the reason naming what is missing (optimizer.fallback.missing_inputs),
and nothing is forecast or scored. With a history only the forecaster's own check applies (`MissingInputError`:
no price by the decision time); the replay's history has both, so its decisions are unchanged.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from forecasting.bundle import MissingInputError
from optimizer.audit_grid import audit_grid, grid_size, run_audit
from optimizer.baselines.tuned import with_clock_share, with_precision, with_token_budget
from optimizer.candidates import GenerationInputs, generate
from optimizer.clock_price import ClockPrices
from optimizer.decision_record import build_record
from optimizer.deferral_lp import DeferralSchedule, plan_deferral, risk_adjusted_price
from optimizer.fallback import (
    Decision,
    Scored,
    confidence_fallback,
    decide,
    missing_inputs,
    missing_inputs_fallback,
)
from optimizer.gates import GateConfig, GateContext, hard_gates
from optimizer.levers import LeverSpace, lever_space, plan_key
from optimizer.margins import FAMILY_FIELDS, LeverMargins, load_margins, pin_families
from optimizer.objective import Objective
from optimizer.observed import ObservedState
from optimizer.ports import ForecastProvider, WorldModelPort
from optimizer.ramp import RampLine, ramp_lines
from optimizer.registry import create, register
from optimizer.scale_guard import GuardInputs, ScaleGuard
from optimizer.search import LEVER_STAGES, SearchConfig, SearchResult, search
from schemas.cost import energy_breakeven_usd_mwh, marginal_gpu_usd_per_h
from schemas.forecast import DisturbanceForecast, PredictedOutcome
from schemas.plan import BatchAdmission, Plan
from schemas.policy import History, Observations, Policy, PolicyContext
from schemas.provenance import Provenance, Tagged
from schemas.records import frame_schema
from worldmodel.horizon import Horizon, HorizonSpec
from worldmodel.servingmodel import ServingModel

log = logging.getLogger(__name__)
MODES = ("full", "clock-only", "fixed-grid", "no-deferral")
#: The first decision's fallback: the fleet has not been observed yet, so the forward model would score plans
#: against assumed (pre-warmed) state; the reference's plan, the fleet as deployed, is the safe default.
START_FALLBACK = "start: no fleet observation yet, the reference plan as deployed"
#: SM clock steps of the regret audit's grid and of the clock-only ablation (count).
AUDIT_CLOCK_LEVELS = 5


class AureliusPolicy(Policy):
    """The optimizer behind the shared policy interface. Constructor args are the config.

    Parameters
    ----------
    mode : "full", "clock-only" (reference plan with the clock varied), "fixed-grid" (generated bundles,
        no adaptive expansion) or "no-deferral" (deferrable work admitted as deployed, only under pressure;
        no deferral LP).
    oracle : True for the oracle arm; `forecast_provider` must then return the realized future.
    reference : registry name of the reference policy (the strongest per market, e.g. "production-tuned"): the
        safe default of the confidence fallback.
    also_references : registry names of further reference policies run beside it; each period the reference
        plan with the best predicted score (feasible first) is the Pareto reference and the fallback, and every
        reference plan is a candidate.
    audit : score the >= 500-plan regret grid after each decision.
    confidence_threshold : forecast confidence (0-1) below which the reference plan is recommended.
    seed : recorded with each decision; the decision itself is deterministic.
    risk_aversion : rho of the objective (0-1), also the price risk weight of the deferral LP.
    horizon_periods : periods forecast for the deferral LP (count).
    forecast_provider, world_model, reference_policy, also_reference_policies : injected components (see
        module docstring); the policies take precedence over the names.
    gate_config, search_config : gate and search settings.
    name : the arm's name in results and audit records.
    clock_levels : SM clock steps the search may set (count; 1 = the maximum clock only, the default). The
        clock-only ablation always gets `AUDIT_CLOCK_LEVELS`. On the default windows (1 h, seed 1) the planner's
        clock choices lost gp/$ against the same policy without them (PJM 789.7 vs 797.7, ERCOT 353.7 vs
        355.2) and raised the code class's violations (ERCOT +3.2 pp): its corrections are not keyed by
        clock, so a clock it has not run at is scored on the uncalibrated roofline.
    floor_release : hand the plan in force to the evaluator, so the forward model releases the replicas only its
        floors held when a candidate lowers them (worldmodel/forward.py). Off by default: measured on the
        default windows (3 seeds) it turned more decisions into deviations whose autoscaler transients the
        model does not see: ERCOT gp/$ 479.0 (453.9-496.5) against 496.0 without it, PJM 1087.8 vs 1091.9,
        CAISO 917.1 vs 920.8 (benchmarks/results/).
    horizon : score each plan held over the forecast horizon (worldmodel/horizon.py: the forward model stepped
        period to period, replicas, deferred work and precision carried, terminal value for carried work), or
        None to score the decided period only. The audit grid stays one period long (a diagnostic).
    site_placement : three-site mode: also propose every plan placed, the work that may run anywhere moving to the
        site with the lowest forecast price (`candidates._placed`; arm `aurelius-placement`). Off by default: the
        forward model does not see the move's cold starts and doubled replicas, and on the ERCOT window (1 h,
        seed 0) the arm cut energy cost but lost gp/$ to production (benchmarks/results/).
    ablate : lever families (optimizer.margins.FAMILY_FIELDS) the planner may not move: every plan it scores
        has them set as in the reference plan, and the search's value sets hold the reference's value (the
        ablation arms `aurelius-no-capacity`, `-no-precision`, `-no-batch`; the clock is off by default).
    guard : the scale-up guard (optimizer/scale_guard.py) applied to the reference's plan once the fleet's live
        replicas are known, before anything is scored: the guarded plan is the Pareto yardstick, the fallback
        and what the candidates are built around; None (arm `aurelius-no-guard`) leaves the reference's plan as
        deployed. Decisions without inputs, or whose scoring failed, stay the reference's plan as deployed.
    reference_precision : (weights, KV dtype) measured best on the site's own traffic of the week before the
        window (the replay passes production-tuned's tuning, streams/replay/tuning.py), set on the reference's
        plan where the GPU allows them; None keeps the reference's own. The forward model does not decide
        precision: its measured error on a precision switch (the lever margins, 0.47-0.64 of gp/$) is larger
        than any gain it predicts, so the switch is taken from a ground-truth measurement instead.
    cost_basis : the operator's cost basis, "rented" (GPU-hours held at the rental rate + energy) or "owned" (the
        whole fleet paid for, capacity held costs its energy): what the objective counts, the price the capacity
        sizing and the deferral LP put on a GPU-hour, and the guard's fitted target (schemas/cost.py).
    reference_clock : the week before's SM clock-share measurements (optimizer/clock_price.py; the replay passes
        the tuning's): the guarded reference plan runs at the share of highest gp/$ repriced at the period's
        forecast price on `cost_basis`, among those within the tuning's SLA gate; None keeps the reference's
        clock (arm `aurelius-no-clock`). As with precision, a ground-truth measurement sets the lever, not the
        forward model, whose clock scoring lost gp/$ (`clock_levels`).
    reference_token_budget : the chunked-prefill token budget (tokens per iteration) the same tuning measured best,
        set on every pool of the reference's plan (the engine's other restart setting beside the precision; the
        planner has no lever for it); None keeps the engine's default (arm `aurelius-no-token-budget`).
    """

    name = "aurelius"

    def __init__(self, mode: str = "full", oracle: bool = False, reference: str = "production",
                 audit: bool = True, confidence_threshold: float = 0.5, seed: int = 0,
                 risk_aversion: float = 0.5, horizon_periods: int = 12,
                 forecast_provider: ForecastProvider | None = None, world_model: WorldModelPort | None = None,
                 reference_policy: Policy | None = None, gate_config: GateConfig | None = None,
                 search_config: SearchConfig | None = None, name: str | None = None,
                 also_references: tuple[str, ...] = (), also_reference_policies: tuple[Policy, ...] = (),
                 clock_levels: int = 1, floor_release: bool = False, site_placement: bool = False,
                 horizon: HorizonSpec | None = None, ablate: frozenset[str] = frozenset(),
                 guard: ScaleGuard | None = ScaleGuard(),
                 reference_precision: tuple[str, str] | None = None, cost_basis: str = "rented",
                 reference_clock: ClockPrices | None = None, reference_token_budget: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} not in {MODES}")
        if not ablate <= FAMILY_FIELDS.keys():
            raise ValueError(f"ablate {sorted(ablate)} not within the lever families {sorted(FAMILY_FIELDS)}")
        self.mode = mode
        self.oracle = oracle
        self.reference = reference
        self.audit = audit
        self.confidence_threshold = confidence_threshold
        self.seed = seed
        self.risk_aversion = risk_aversion
        self.horizon_periods = horizon_periods
        self.forecast_provider = forecast_provider
        self.world_model = world_model
        self.reference_policy = reference_policy
        self.also_references = also_references
        self.also_reference_policies = also_reference_policies
        self.clock_levels = AUDIT_CLOCK_LEVELS if mode == "clock-only" else clock_levels
        self.floor_release = floor_release
        self.site_placement = site_placement
        self.horizon = horizon
        self.ablate = frozenset(ablate)
        self.cost_basis = cost_basis
        self._gpu_usd_per_gpu_h = marginal_gpu_usd_per_h(cost_basis)  # raises on an unknown basis
        self.guard = replace(guard, cost_basis=cost_basis) if guard is not None else None
        self.reference_precision = reference_precision
        self.reference_clock = reference_clock
        self.reference_token_budget = reference_token_budget
        self._clock: dict[str, float] | None = None  # the last decision's clock share and the price it was set at
        self.margins = load_margins("one_period" if horizon is None else "horizon")
        self.gate_config = gate_config or GateConfig()
        self.search_config = search_config or _search_config(mode, self.margins)
        self.name = name or ("oracle" if oracle else "aurelius" if mode == "full" else f"aurelius-{mode}")
        self._ctx: PolicyContext | None = None
        self._observed = ObservedState()
        self._previous: Plan | None = None
        self._record: dict[str, Any] | None = None
        self._scorer: Callable[[Plan], Scored] | None = None
        self._ref_plan: Plan | None = None
        self._fresh = self._seen_telemetry = self._seen_arrivals = False
        self._guard_inputs = GuardInputs()
        self._last_forecast: DisturbanceForecast | None = None  # the last decision's forecast of its period
        self._ramps: dict[tuple[str, str], RampLine] = {}  # classes whose rate climbed inside the last period
        self._breakeven: float | None = None  # the fleet's energy break-even ($/MWh), set at start
        self._arrivals_since: datetime | None = None  # set at start and by the first arrivals (ramp_lines)

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        if self.forecast_provider is None or self.world_model is None:
            raise ValueError(f"{self.name}: inject forecast_provider and world_model (optimizer.aurelius)")
        self._ctx = ctx
        self._breakeven = energy_breakeven_usd_mwh(ctx.fleet.gpus_by_type())  # $/MWh; the fleet is fixed for the run
        if not history.prices.columns:  # an empty history without columns: the reference policies read its prices
            history = replace(history, prices=pl.DataFrame(schema=frame_schema("price")))
        self._observed = ObservedState()
        self._last_forecast = None
        self._ramps = {}
        self._fresh = history.prices.height == 0 and history.arrivals_per_minute.height == 0
        # the first instant the arrivals cover (the ramp's bins): the window start, or on a fresh start (a worker
        # without history) the first arrival observed, which may fall inside a period
        self._arrivals_since = None if self._fresh else ctx.window_start
        self._seen_telemetry = self._seen_arrivals = False
        ref = self.reference_policy or create(self.reference)
        self.reference_policy = ref
        ref_plan = self._at_reference_engine(ref.start(ctx, history))
        if not self.also_reference_policies:
            self.also_reference_policies = tuple(create(n) for n in self.also_references)
        others = tuple(r.start(ctx, history) for r in self.also_reference_policies)
        try:
            self.forecast_provider.start(ctx, history)
        except MissingInputError:  # its start-up forecast, the last step, needs a price: the decision says so
            pass
        self.world_model.start(ctx, history)
        self._previous = ref_plan
        return self._decide(ctx.window_start, 0, ref_plan, time.perf_counter(), time.process_time(), others,
                            START_FALLBACK)

    def plan(self, obs: Observations) -> Plan:
        t0, c0 = time.perf_counter(), time.process_time()
        assert self._ctx is not None and self.reference_policy is not None, "start() first"
        ref_plan = self._at_reference_engine(self.reference_policy.plan(obs))
        others = tuple(r.plan(obs) for r in self.also_reference_policies)
        try:
            self._observed.update_arrivals(obs.arrivals)
            ramps_on = self.guard is not None and self.guard.ramp
            if self._arrivals_since is None and obs.arrivals.height:
                self._arrivals_since = obs.arrivals["event_at"].min()
            since = self._arrivals_since
            self._ramps = ramp_lines(obs.arrivals, obs.as_of, self._ctx.period_s, since=since) if ramps_on else {}
            self._seen_telemetry |= obs.telemetry.height > 0
            self._seen_arrivals |= obs.arrivals.height > 0
            assert self.forecast_provider is not None and self.world_model is not None
            self.forecast_provider.update(obs)
            self.world_model.update(obs)
            return self._decide(obs.as_of, obs.period_index, ref_plan, t0, c0, others)
        except Exception as exc:  # noqa: BLE001 - odd but valid inputs must not stop the worker: the safe default
            log.exception("%s: decision for period %d failed; the reference plan stands", self.name, obs.period_index)
            reason = f"decision failed: {type(exc).__name__}: {str(exc)[:200]}"
            self._previous = ref_plan
            self._guard_inputs = GuardInputs()  # the reference's plan as deployed: no guard
            self._last_forecast = None
            self._ramps = {}
            return self._reference_only(obs.as_of, obs.period_index, ref_plan, t0, c0, reason, {})

    def _at_reference_engine(self, plan: Plan) -> Plan:
        """The reference's plan with the engine settings measured the week before, its label naming them: weights
        and KV dtype (`reference_precision`), chunked-prefill token budget (`reference_token_budget`); unchanged
        without them."""
        if self.reference_precision is not None:
            weights, kv = self.reference_precision
            plan = replace(with_precision(plan, weights, kv), label=f"{plan.label} at {weights}/kv {kv}")
        if self.reference_token_budget is not None:
            budget = self.reference_token_budget
            plan = replace(with_token_budget(plan, budget), label=f"{plan.label}, {budget} tokens/iteration")
        return plan

    def last_decision(self) -> dict[str, Any] | None:
        return self._record

    def reference_plan(self) -> Plan | None:
        """The reference policy's plan for the last decided period."""
        return self._ref_plan

    def scorer(self) -> Callable[[Plan], Scored] | None:
        """The last decision's scorer (its forward model, objective and hard gates, as of its as_of), None when
        that decision scored nothing (missing inputs). What benchmarks/lever_error.py compares with branches."""
        return self._scorer

    def _decide(self, as_of: datetime, period_index: int, ref_plan: Plan, t0: float, c0: float,
                other_refs: tuple[Plan, ...] = (), forced_fallback: str | None = None) -> Plan:
        assert self.forecast_provider is not None
        self._ref_plan = ref_plan
        self._guard_inputs = GuardInputs()
        self._clock = None  # set where the decision prices the clock (`_at_reference_clock`)
        missing = self._missing_inputs(as_of)
        forecasts: tuple[DisturbanceForecast, ...] = ()
        if not missing:
            try:
                forecasts = self.forecast_provider.forecast(as_of, self.horizon_periods)
            except MissingInputError as exc:  # the forecaster's own check (e.g. a price published after as_of)
                missing = (str(exc),)
        if missing:
            plan = self._without_inputs(as_of, period_index, ref_plan, t0, c0, missing)
        else:
            plan = self._planned(as_of, period_index, ref_plan, t0, c0, forecasts, other_refs, forced_fallback)
        self._last_forecast = forecasts[0] if forecasts else None
        if self.mode == "no-deferral" and plan.batch_admission == BatchAdmission.HOLD:
            # the ablation without deferral: a reference plan chosen as is must not bring its hold along
            plan = replace(plan, batch_admission=BatchAdmission.PRESSURE)
        self._previous = plan
        return plan

    def _guarded(self, as_of: datetime, ref_plan: Plan, forecasts: tuple[DisturbanceForecast, ...]) -> Plan:
        """The reference's plan under the scale-up guard, from the live replicas the world model saw by `as_of` and
        the replicas the forward model predicts the autoscaler needs (as deployed without a guard, or before the
        fleet has been observed)."""
        assert self.world_model is not None
        ref_plan = self._at_reference_clock(ref_plan, forecasts[0].price_usd_mwh.point)
        if self.guard is None:
            return ref_plan
        live = self.world_model.replicas(as_of)
        if live:
            price = GuardInputs(price_usd_mwh=forecasts[0].price_usd_mwh.point, breakeven_usd_mwh=self._breakeven)
            need = self._forecast_need(as_of, ref_plan, forecasts, self.guard.target_at(price))
            self._guard_inputs = replace(price, live=live, need=need, waiting=self.world_model.waiting(as_of))
        return self.guard.apply(ref_plan, self._guard_inputs)

    def _at_reference_clock(self, plan: Plan, price_usd_mwh: float) -> Plan:
        """The reference's plan at the clock share the week before's measurement pays most at the period's forecast
        price ($/MWh; `reference_clock`), its label naming it (unchanged without a measurement or at full clock)."""
        self._clock = None
        if self.reference_clock is None:
            return plan
        share = self.reference_clock.share_at(price_usd_mwh, self.cost_basis)
        self._clock = {"share": share, "price_usd_mwh": price_usd_mwh}
        if share >= 1.0:
            return plan
        return replace(with_clock_share(plan, share), label=f"{plan.label} at clock {share:g}")

    def _forecast_need(self, as_of: datetime, ref_plan: Plan, forecasts: tuple[DisturbanceForecast, ...],
                       target: float) -> dict[tuple[str, str, str], int]:
        """Per pool, the most replicas the forward model predicts the reference's autoscaler (at the guard's target,
        no ceiling but the inventory) places at the guard's demand (`ScaleGuard.demand`: the forecast's 80% upper
        bound, its point carried on by its rise since the period before, or the line through the last period's
        minute counts where they climbed) over this period and the next
        (count): a replica started now serves from the next period on (the cold start outlasts a period).
        target : the autoscaler's target the guard sets this period (ratio)."""
        assert self.world_model is not None and self.guard is not None
        plan = replace(ref_plan, autoscale_target=target)
        need: dict[tuple[str, str, str], int] = {}
        before = (self._last_forecast, *forecasts[:1])  # each period's forecast before it: the ramp's base
        for f, previous in zip(forecasts[:2], before, strict=False):
            # the point forecast alone: the counts are the point scenario's, the bounds' three evaluations unused
            demand = self.guard.demand(f, previous, self._ramps)
            out = self.world_model.evaluator(as_of, demand, None, self._previous, spread=False)(plan)
            for key, n in out.pool_replicas.items():
                need[key] = max(need.get(key, 0), math.ceil(n - 1e-9))
        return need

    def _missing_inputs(self, as_of: datetime) -> tuple[str, ...]:
        """On a fresh start, what has not been delivered yet (the first market's price, GPU telemetry, request
        arrivals); () once all have, and always after a start with history."""
        assert self._ctx is not None and self.world_model is not None
        if not self._fresh:
            return ()
        price = self.world_model.prices(self._ctx.markets[0], as_of).height > 0
        return missing_inputs(self._ctx.markets[0], price=price,
                              telemetry=self._seen_telemetry, arrivals=self._seen_arrivals)

    def _price_history(self, as_of: datetime, days: float = 7.0) -> tuple[float, ...]:
        """Published prices of the first market's intervals starting in the `days` (days) before as_of ($/MWh)."""
        assert self._ctx is not None and self.world_model is not None
        p = self.world_model.prices(self._ctx.markets[0], as_of)
        recent = p.filter((pl.col("interval_start") >= as_of - timedelta(days=days))
                          & (pl.col("interval_start") < as_of))
        return tuple(float(v) for v in recent["lmp_usd_mwh"])

    def _without_inputs(self, as_of: datetime, period_index: int, ref_plan: Plan, t0: float, c0: float,
                        missing: tuple[str, ...]) -> Plan:
        """The reference plan as is, flagged fallback with the missing inputs: nothing is forecast or scored."""
        return self._reference_only(as_of, period_index, ref_plan, t0, c0, missing_inputs_fallback(missing),
                                    {"missing_inputs": list(missing)})

    def _reference_only(self, as_of: datetime, period_index: int, ref_plan: Plan, t0: float, c0: float,
                        reason: str | None, extra: dict[str, Any]) -> Plan:
        """The reference plan as is, flagged fallback with `reason`; its audit record says so."""
        assert self._ctx is not None
        decision = Decision(ref_plan, None, True, reason, ())
        self._scorer = None
        self._record = build_record(
            policy=self.name, markets=self._ctx.markets, period_index=period_index, as_of=as_of,
            inputs=self._config_inputs(), forecasts=(), decision=decision, search=None, reference=None, audit=None,
            decision_ms=(time.perf_counter() - t0) * 1e3,
            extra={**self._extra(c0, ref_plan), "reference_plan": ref_plan.as_dict(), **extra},
        )
        return ref_plan

    def _extra(self, c0: float, reference: Plan) -> dict[str, Any]:
        """The record's policy keys: CPU time of this decision (robust to a shared machine), config, reference."""
        return {"decision_cpu_ms": (time.process_time() - c0) * 1e3, "mode": self.mode, "oracle": self.oracle,
                "reference_policy": self.reference, "pareto_reference": reference.label, "seed": self.seed,
                "cost_basis": self.cost_basis, "scale_guard": self._guard_record(),
                "reference_precision": list(self.reference_precision) if self.reference_precision else None,
                "reference_token_budget": self.reference_token_budget,
                "reference_clock": None if self.reference_clock is None else
                {**(self._clock or {}), "measured": self.reference_clock.as_dict()}}

    def _guard_record(self) -> dict[str, Any] | None:
        """The guard's settings, the live replicas it bounded the ceilings by ("site/model/gpu": count) and the
        classes whose rate climbed inside the last period ("class/model": level req/s at the decision, slope
        req/s per s)."""
        if self.guard is None:
            return None
        ramps = {f"{c}/{m}": {"level": round(r.level, 3), "slope": round(r.slope, 5)}
                 for (c, m), r in sorted(self._ramps.items())}  # fmt: skip
        return {**self.guard.as_dict(), **self._guard_inputs.as_dict(), "ramps": ramps,
                "target": self.guard.target_at(self._guard_inputs)}

    def _planned(self, as_of: datetime, period_index: int, ref_plan: Plan, t0: float, c0: float,
                 forecasts: tuple[DisturbanceForecast, ...], other_refs: tuple[Plan, ...],
                 forced_fallback: str | None) -> Plan:
        """Forecast in hand: score, search, gate and decide; keep the audit record."""
        assert self._ctx is not None and self.world_model is not None
        ref_plan = self._guarded(as_of, ref_plan, forecasts)
        serving = self.world_model.serving()
        in_force = self._previous if self.floor_release else None
        one_period = self.world_model.evaluator(as_of, forecasts[0], in_force, self._previous)
        schedule = None
        if self.mode in ("full", "fixed-grid"):
            schedule = plan_deferral(forecasts, self._previous, serving, self._observed.slack_quantiles(),
                                     risk_aversion=self.risk_aversion, gpu_usd_per_gpu_h=self._gpu_usd_per_gpu_h)
        paths: dict[tuple[object, ...], Horizon] = {}
        if self.horizon is not None:
            along = self.world_model.horizon(as_of, forecasts, self.horizon, in_force, self._previous,
                                             _continuation(schedule, len(forecasts)))

            def evaluate(plan: Plan) -> PredictedOutcome:
                paths[plan_key(plan)] = along(plan)
                return paths[plan_key(plan)].total
        else:
            evaluate = one_period
        objective = Objective(self.risk_aversion, _future_price_ratio(forecasts, self.risk_aversion),
                              schedule.carry_usd_per_request if schedule else None, self.cost_basis)
        tenants = self._observed.tenants()
        space = _hold_ablated(self._space(ref_plan, tenants, schedule), ref_plan, self.ablate)
        gctx = GateContext(self._ctx.fleet, forecasts[0], self._previous, tenants, serving)
        score = _scorer(evaluate, objective, gctx, self.gate_config)
        self._scorer = score
        if self.ablate:
            score = _pinned(score, ref_plan, self.ablate)
        if self.guard is not None and self._guard_inputs.live:  # every plan scored (and chosen) has its ceilings
            score = _bounded(score, self.guard, self._guard_inputs)
        reference = replace(score(ref_plan), plan=ref_plan)
        for other in other_refs:  # the strongest reference plan by prediction (feasible first) is the yardstick
            s = replace(score(other), plan=other)
            if (s.feasible, s.score) > (reference.feasible, reference.score):
                reference = s
        audit_space = self._space(ref_plan, tenants, schedule, AUDIT_CLOCK_LEVELS)  # every clock step
        n_grid = grid_size(ref_plan, audit_space)
        result: SearchResult | None = None
        why = forced_fallback or confidence_fallback(forecasts[0].confidence, self.confidence_threshold)
        if why is not None:
            decision = Decision(reference.plan, reference.outcome, True, why, reference.gates)
        else:
            cands = self._candidates(as_of, forecasts, ref_plan, space, serving, schedule)
            cands[1:1] = [replace(p, label=f"reference:{p.label}") for p in other_refs]
            result = search(cands, score, space, self.search_config, n_grid, ref_plan, self._previous)
            fixed = self.gate_config.pareto_min_gain
            margin = fixed if fixed is not None else (lambda p, r=reference.plan: self.margins.of(p, r))
            decision = decide(result.ranked, reference, objective, self.gate_config.pareto_tolerance_pp, margin)
        decision_ms = (time.perf_counter() - t0) * 1e3
        extra = self._extra(c0, reference.plan)
        audit = None
        if self.audit:  # one period long, a diagnostic: its own scorer when the decision looks further
            grid_score = score if self.horizon is None else _scorer(one_period, objective, gctx, self.gate_config)
            audit = run_audit(audit_grid(ref_plan, audit_space), grid_score, grid_score(decision.plan).score)
        self._record = build_record(
            policy=self.name, markets=self._ctx.markets, period_index=period_index, as_of=as_of,
            inputs=self._inputs(forecasts[0]), forecasts=forecasts, decision=decision, search=result,
            reference=reference, audit=audit, decision_ms=decision_ms,
            extra={**extra, "audit_grid_size": n_grid, "future_price_ratio": objective.future_price_ratio,
                   **_horizon_extra(paths, decision.plan, reference.plan)},
        )
        return decision.plan

    def _space(self, ref_plan: Plan, tenants: dict[str, Any], schedule: DeferralSchedule | None,
               clock_levels: int | None = None) -> LeverSpace:
        assert self._ctx is not None
        by_model: dict[str, list[str]] = {}
        for t, ten in tenants.items():
            for m in ten.models:
                by_model.setdefault(m, []).append(t)
        space = lever_space(self._ctx.fleet, ref_plan.pools, self.gate_config.precision_policy,
                            {m: tuple(ts) for m, ts in by_model.items()}, clock_levels or self.clock_levels)
        if self.mode == "clock-only":
            space = replace(space, admissions=(ref_plan.batch_admission,))
        elif self.mode == "no-deferral" or schedule is None:  # deferrable work waits only under pressure
            space = replace(space, admissions=(BatchAdmission.PRESSURE,))
        else:  # timing is the deferral LP's call (it prices holding over the horizon; one period cannot)
            space = replace(space, admissions=tuple(dict.fromkeys((schedule.admission(), BatchAdmission.PRESSURE))))
        return space

    def _candidates(self, as_of: datetime, forecasts: tuple[DisturbanceForecast, ...], ref_plan: Plan,
                    space: LeverSpace, serving: ServingModel, schedule: DeferralSchedule | None) -> list[Plan]:
        assert self._ctx is not None and self._previous is not None
        inp = GenerationInputs(
            fleet=self._ctx.fleet, space=space, reference=ref_plan, previous=self._previous,
            forecasts=forecasts, price_history_usd_mwh=self._price_history(as_of),
            tpot_slo_s=self._observed.tpot_slo_s, admission=schedule.admission() if schedule else None,
            swap_budget=self.gate_config.swap_budget, risk_aversion=self.risk_aversion,
            deferrable_release_rps=schedule.release[0] / forecasts[0].period_s if schedule else None,
            serving=serving, current_replicas=self.world_model.replicas(as_of),
            site_placement=self.site_placement, gpu_usd_per_gpu_h=self._gpu_usd_per_gpu_h,
        )
        return generate(inp, self.mode)

    def _config_inputs(self) -> dict[str, dict[str, object]]:
        m = Provenance.MODELED
        tagged = {
            "confidence_threshold": Tagged(self.confidence_threshold, "ratio", m, "policy config"),
            "risk_aversion": Tagged(self.risk_aversion, "ratio", m, "policy config"),
            "swap_budget": Tagged(self.gate_config.swap_budget, "replicas/period", m, "gate config"),
        }
        return {k: v.as_dict() for k, v in tagged.items()}

    def _inputs(self, f: DisturbanceForecast) -> dict[str, dict[str, object]]:
        m = Provenance.MODELED
        tagged = {
            "forecast_confidence": Tagged(f.confidence, "ratio", m, "forecasting"),
            "deferred_backlog": Tagged(f.deferred_backlog_requests, "requests", Provenance.MEASURED,
                                       "observed arrivals - completions"),
        }
        out: dict[str, dict[str, object]] = self._config_inputs() | {k: v.as_dict() for k, v in tagged.items()}
        known = {p.value for p in Provenance}
        for name, tag in f.provenance.items():
            out[f"forecast.{name}"] = {"provenance": tag if tag in known else m.value, "source": tag}
        return out


def _scorer(evaluate: Callable[[Plan], PredictedOutcome], objective: Objective, gctx: GateContext,
            gates: GateConfig) -> Callable[[Plan], Scored]:
    """A memoizing scorer: evaluate, rank by the objective, check the hard gates."""
    memo: dict[tuple[object, ...], Scored] = {}

    def score(plan: Plan) -> Scored:
        k = plan_key(plan)
        if k not in memo:
            out = evaluate(plan)
            memo[k] = Scored(plan, out, objective.score(out), hard_gates(plan, out, gctx, gates))
        return memo[k]

    return score


def _pinned(score: Callable[[Plan], Scored], reference: Plan, families: frozenset[str]) -> Callable[[Plan], Scored]:
    """`score` of each plan with `families` pinned to the reference's (the scored plan is the pinned one)."""
    return lambda plan: score(pin_families(plan, reference, families))


def _bounded(score: Callable[[Plan], Scored], guard: ScaleGuard, inputs: GuardInputs) -> Callable[[Plan], Scored]:
    """`score` of each plan with its ceilings bounded by the scale-up guard (the scored plan is the bounded one)."""
    return lambda plan: score(guard.bound(plan, inputs))


def _hold_ablated(space: LeverSpace, reference: Plan, families: frozenset[str]) -> LeverSpace:
    """The lever space with the ablated families' per-pool value sets held at the reference's value (the
    search spends no evaluations on moves the pinning would undo)."""
    if not families:
        return space
    ref = {p.key: p for p in reference.pools}
    pools = []
    for lv in space.pools:
        p = ref.get(lv.key)
        if p is not None:
            lv = replace(lv, clocks_mhz=(p.sm_clock_mhz,) if "clock" in families else lv.clocks_mhz,
                         precisions=(p.precision,) if "precision" in families else lv.precisions,
                         max_batches=(p.max_batch,) if "batch" in families else lv.max_batches)  # fmt: skip
        pools.append(lv)
    return replace(space, pools=tuple(pools))


def _continuation(schedule: DeferralSchedule | None, periods: int) -> tuple[BatchAdmission, ...]:
    """Per forecast period, how the decisions to come admit deferrable work (the horizon's continuation, every plan
    alike): held where the deferral LP releases none, else under pressure; under pressure throughout without it.

    >>> s = DeferralSchedule((0.0, 0.2, 40.0), 0.0, 0.0, "optimal")
    >>> [a.value for a in _continuation(s, 4)]
    ['hold', 'hold', 'pressure', 'pressure']
    """
    release = schedule.release if schedule is not None else ()
    return tuple(BatchAdmission.HOLD if k < len(release) and release[k] < 0.5 else BatchAdmission.PRESSURE
                 for k in range(periods))  # fmt: skip


def _horizon_extra(paths: dict[tuple[object, ...], Horizon], chosen: Plan, reference: Plan) -> dict[str, Any]:
    """The audit record's horizon: the chosen and the reference plan's predicted paths (empty without one)."""
    if not paths:
        return {}
    out: dict[str, Any] = {}
    for name, plan in (("chosen", chosen), ("reference", reference)):
        h = paths.get(plan_key(plan))
        if h is not None:
            out[f"horizon_{name}"] = h.path()
    return out


def _future_price_ratio(forecasts: tuple[DisturbanceForecast, ...], risk_aversion: float) -> float:
    """Mean risk-adjusted price over the periods after this one / this period's (ratio, at least 0.05)."""
    now = risk_adjusted_price(forecasts[0].price_usd_mwh, risk_aversion)
    later = [risk_adjusted_price(f.price_usd_mwh, risk_aversion) for f in forecasts[1:]]
    if not later or now <= 0:
        return 1.0
    return max(sum(later) / len(later) / now, 0.05)


def _search_config(mode: str, margins: LeverMargins) -> SearchConfig:
    """The search settings of an arm. A precision switch, a coordinate step or a generated candidate, must beat the
    same plan without it by the precision margin (the model's measured error on a precision switch): a switch
    costs a reload (335 s measured for a 70B replica, the model's prior 100 s) and again when reversed, and
    switches inside that error flapped the drain's precision (PJM 2023 seed 0 at 27293ea: 10 switches in 12
    decisions; the arm without the planner's precision made 16.6 % more gp/$)."""
    step = SearchConfig(step_gain={"precision": margins.by_family["precision"]})
    if mode == "clock-only":
        return replace(step, stages=(("clock",),))
    if mode == "fixed-grid":
        return replace(step, expand=False)
    if mode == "no-deferral":
        return replace(step, stages=(LEVER_STAGES[0], ("capacity",), *LEVER_STAGES[2:]))
    return step


#: The aurelius arms and their constructor settings, each registered under its name (optimizer.registry).
AURELIUS_ARMS: dict[str, dict[str, Any]] = {
    "aurelius": {"mode": "full"},
    "aurelius-clock-only": {"mode": "clock-only"},
    "aurelius-fixed-grid": {"mode": "fixed-grid"},
    "aurelius-no-deferral": {"mode": "no-deferral"},
    "aurelius-placement": {"mode": "full", "site_placement": True},
    "aurelius-no-capacity": {"mode": "full", "ablate": frozenset({"capacity", "target"})},
    "aurelius-no-precision": {"mode": "full", "ablate": frozenset({"precision"})},
    "aurelius-no-batch": {"mode": "full", "ablate": frozenset({"batch"})},
    "aurelius-no-guard": {"mode": "full", "guard": None},
    "aurelius-no-trend": {"mode": "full", "guard": ScaleGuard(trend=False)},
    "aurelius-no-ramp": {"mode": "full", "guard": ScaleGuard(ramp=False)},
    "aurelius-own-precision": {"mode": "full", "reference_precision": None},
    "aurelius-no-clock": {"mode": "full", "reference_clock": None},
    "aurelius-no-token-budget": {"mode": "full", "reference_token_budget": None},
    "aurelius-on-production": {"mode": "full", "reference": "production"},
    "aurelius-horizon": {"mode": "full", "horizon": HorizonSpec(), "horizon_periods": HorizonSpec().periods},
    "oracle": {"mode": "full", "oracle": True},
}


def _arm(arm: str, **fixed: Any) -> None:
    def factory(**kwargs: Any) -> AureliusPolicy:
        return AureliusPolicy(name=arm, **fixed, **kwargs)

    register(arm)(factory)


for _name, _settings in AURELIUS_ARMS.items():
    _arm(_name, **_settings)
