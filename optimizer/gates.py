"""Hard gates and the Pareto gate. Each gate is a small named function returning a GateResult with its
reason; a plan that fails any hard gate is never recommended.

Hard gates: sla (predicted violation rate per class above its budget), capacity (GPUs per type in the
inventory, weights and KV cache fitting max_batch), power (predicted peak IT power above the site cap),
residency (a tenant's model served nowhere in its allowed regions, or served outside them), policy
(precision not allowed for the model, GPU or tenant; more replicas changed than the swap budget). Capacity is a
two-sided lever: a ceiling below the replicas in use (a release under load) is no hard failure; like every lever
it must clear its measured margin in the Pareto gate (the one-way ceiling gate it replaces had been set after
one costly cut at 37740cf, when the forward model scored a single period).
Pareto gate: beat the reference plan's predicted gp/$ by the margin of the levers the candidate moves without
any class's violation rate rising more than 0.1 percentage point, at the point forecast or at the 95% demand
bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from optimizer.levers import PrecisionPolicy
from optimizer.objective import Objective
from optimizer.replica_capacity import kv_sequences
from schemas.fleet import SM_CLOCK_RANGE_MHZ, FleetSpec, GpuType, default_max_num_seqs, kv_dtype_offered
from schemas.forecast import DisturbanceForecast, PredictedOutcome
from schemas.plan import Plan
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import pool_name

#: The smallest predicted gain (ratio of the reference's gp/$) the Pareto gate counts as a gain: below it, two plans
#: the forward model scores alike differ by float rounding (1e-16 seen: the same plan's score summed in another
#: order), and a lever whose measured margin is 0 would be committed on that noise.
FLOAT_NOISE = 1e-9


@dataclass(frozen=True)
class GateResult:
    """name of the gate, passed, and the reason (why it passed or what failed)."""

    name: str
    passed: bool
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "passed": self.passed, "reason": self.reason}


@dataclass(frozen=True)
class Tenant:
    """A tenant's models and the regions its requests may run in (from request arrivals)."""

    models: tuple[str, ...]
    allowed_regions: tuple[str, ...]


@dataclass(frozen=True)
class GateConfig:
    """Gate parameters (all modeled operator settings).

    sla_budget : max predicted violation rate per class (0-1); classes absent use `default_sla_budget`.
    swap_budget : replicas that may start, stop or reload per period (count).
    kv_overcommit : max_batch may exceed the sequences whose KV fits (at the forecast mean context) by this
        factor, since the runtime admits by KV and preempts (ratio).
    pareto_tolerance_pp : allowed rise of a class's violation rate over the reference's (percentage points).
    pareto_min_gain : a fixed smallest predicted gp/$ gain over the reference's plan that justifies leaving it
        (ratio), or None (the default) for the per-lever margins measured on ground-truth branches
        (optimizer/margins.py, optimizer/lever_margins.json): predicted gains inside the forward model's
        measured error on plan differences do not leave the reference.
    """

    sla_budget: Mapping[str, float] = field(
        default_factory=lambda: {"code": 0.01, "chat": 0.01, "batch": 0.01})
    default_sla_budget: float = 0.01
    swap_budget: int = 16
    kv_overcommit: float = 2.0
    pareto_tolerance_pp: float = 0.1
    pareto_min_gain: float | None = None
    precision_policy: PrecisionPolicy = field(default_factory=PrecisionPolicy)


@dataclass(frozen=True)
class GateContext:
    """What the gates check a plan against: fleet, this period's forecast, the plan in force, tenants, and
    the planner's serving model (KV capacity)."""

    fleet: FleetSpec
    forecast: DisturbanceForecast
    previous: Plan | None
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    serving: ServingModel = field(default_factory=ServingModel)


def sla_gate(outcome: PredictedOutcome, cfg: GateConfig) -> GateResult:
    """Fail when any class's predicted violation rate exceeds its budget."""
    bad = [f"{c.request_class} {100 * c.violation_rate:.2f}% > budget "
           f"{100 * cfg.sla_budget.get(c.request_class, cfg.default_sla_budget):.2f}%"
           for c in outcome.classes
           if c.violation_rate > cfg.sla_budget.get(c.request_class, cfg.default_sla_budget)]
    return GateResult("sla", not bad, "; ".join(bad) or "every class within its violation budget")


def capacity_gate(plan: Plan, ctx: GateContext, cfg: GateConfig) -> GateResult:
    """Fail on GPUs beyond the inventory, floor > ceiling, clocks off range, weights that do not fit, or a
    max_batch whose KV cache at the forecast mean context exceeds kv_overcommit x what fits (the engine's own
    default max_num_seqs always passes: the engine admits by KV, as deployed)."""
    bad: list[str] = []
    used: dict[tuple[str, str], int] = defaultdict(int)
    ctx_tokens = _context_tokens(ctx.forecast)
    for p in plan.pools:
        name = pool_name(p.key)
        site = next((s for s in ctx.fleet.sites if s.name == p.site), None)
        if site is None:
            bad.append(f"{name}: no site {p.site} in the fleet")
            continue
        have = site.gpus(GpuType(p.gpu))
        used[(p.site, p.gpu)] += p.replica_floor * p.tp
        if p.replica_floor > p.replica_ceiling:
            bad.append(f"{name}: floor {p.replica_floor} > ceiling {p.replica_ceiling}")
        if p.replica_ceiling * p.tp > have:
            bad.append(f"{name}: ceiling {p.replica_ceiling} x tp {p.tp} > {have} {p.gpu} GPUs")
        lo, hi = SM_CLOCK_RANGE_MHZ[GpuType(p.gpu)]
        if not lo <= p.sm_clock_mhz <= hi:
            bad.append(f"{name}: clock {p.sm_clock_mhz} MHz outside {lo}-{hi}")
        if p.replica_ceiling == 0:
            continue
        fits = kv_sequences(ctx.serving, p, ctx_tokens.get(p.model, 1.0))
        if fits <= 0:
            bad.append(f"{name}: {p.precision} weights do not fit {p.tp} x {p.gpu}")
        elif p.max_batch > max(cfg.kv_overcommit * fits, default_max_num_seqs(p.gpu)):
            bad.append(f"{name}: max_batch {p.max_batch} > {cfg.kv_overcommit:g} x {fits:.0f} sequences "
                       f"whose KV fits at {ctx_tokens.get(p.model, 1.0):.0f} tokens")
    for (site_name, gpu), n in used.items():
        site = next((s for s in ctx.fleet.sites if s.name == site_name), None)
        if site is not None and n > site.gpus(GpuType(gpu)):
            bad.append(f"{site_name}: floors need {n} {gpu} GPUs, inventory {site.gpus(GpuType(gpu))}")
    return GateResult("capacity", not bad, "; ".join(bad) or "inventory, memory and KV feasible")


def power_gate(plan: Plan, outcome: PredictedOutcome, ctx: GateContext) -> GateResult:
    """Fail when the predicted peak IT power exceeds the power cap of the sites the plan uses (W)."""
    sites = {p.site for p in plan.pools if p.replica_ceiling > 0}
    cap = sum(s.power_cap_w for s in ctx.fleet.sites if s.name in sites)
    ok = outcome.peak_power_w <= cap
    return GateResult("power", ok, f"peak {outcome.peak_power_w / 1e3:.1f} kW {'<=' if ok else '>'} "
                                   f"cap {cap / 1e3:.1f} kW")


def residency_gate(plan: Plan, ctx: GateContext) -> GateResult:
    """Fail when a tenant's model is served only outside the tenant's allowed regions."""
    region = {s.name: s.region for s in ctx.fleet.sites}
    serving: dict[str, set[str]] = defaultdict(set)
    for p in plan.pools:
        if p.replica_ceiling > 0:
            serving[p.model].add(region.get(p.site, "?"))
    bad = [f"tenant {t}: {m} served in {sorted(serving[m])}, allowed {list(ten.allowed_regions)}"
           for t, ten in sorted(ctx.tenants.items()) for m in ten.models
           if ten.allowed_regions and not serving[m] & set(ten.allowed_regions)]
    return GateResult("residency", not bad, "; ".join(bad) or "every tenant served in an allowed region")


def policy_gate(plan: Plan, ctx: GateContext, cfg: GateConfig) -> GateResult:
    """Fail on a precision the GPU, model or a tenant of the model disallows, a KV-cache dtype the fleet does not
    offer with the pool's weights (`kv_dtype_offered`), or a swap over budget."""
    tenants_of: dict[str, list[str]] = defaultdict(list)
    for t, ten in ctx.tenants.items():
        for m in ten.models:
            tenants_of[m].append(t)
    bad = [f"{'/'.join(p.key)}: {p.precision} not allowed"
           for p in plan.pools
           if p.precision not in cfg.precision_policy.allowed(p.gpu, p.model, tuple(tenants_of[p.model]))]
    bad += [f"{'/'.join(p.key)}: kv_dtype {p.kv_dtype} not offered with {p.precision} weights"
            for p in plan.pools if not kv_dtype_offered(p.precision, p.kv_dtype)]
    changed = replicas_changed(ctx.previous, plan)
    if changed > cfg.swap_budget:
        bad.append(f"{changed} replicas changed > swap budget {cfg.swap_budget}")
    return GateResult("policy", not bad, "; ".join(bad) or f"precisions allowed; {changed} replicas changed "
                                                          f"<= swap budget {cfg.swap_budget}")


def hard_gates(plan: Plan, outcome: PredictedOutcome, ctx: GateContext,
               cfg: GateConfig) -> tuple[GateResult, ...]:
    """All hard gates, in a fixed order."""
    return (sla_gate(outcome, cfg), capacity_gate(plan, ctx, cfg), power_gate(plan, outcome, ctx),
            residency_gate(plan, ctx), policy_gate(plan, ctx, cfg))


def pareto_gate(candidate: PredictedOutcome, reference: PredictedOutcome, objective: Objective,
                tolerance_pp: float = 0.1, min_gain: float = 0.0) -> GateResult:
    """Pass only when the candidate beats the reference on predicted gp/$ (carry-adjusted point by more than
    `min_gain`, a ratio, and by more than float noise, `FLOAT_NOISE`; and risk-adjusted; see objective.py) and
    no class's predicted violation rate exceeds the reference's by more than `tolerance_pp` (pp), at the point
    forecast nor at the 95% demand bound (a capacity release costs most when demand runs high, and its effect
    outlasts the period the model scores)."""
    why: list[str] = []
    g, g_ref = objective.gp(candidate), objective.gp(reference)
    if g <= g_ref * (1.0 + min_gain) + abs(g_ref) * FLOAT_NOISE:
        why.append(f"gp/$ {g:.4g} <= reference {g_ref:.4g}" + (f" x {1.0 + min_gain:g}" if min_gain else ""))
    if objective.score(candidate) < objective.score(reference):
        why.append(f"risk-adjusted gp/$ {objective.score(candidate):.4g} < reference "
                   f"{objective.score(reference):.4g}")
    ref = {c.request_class: (c.violation_rate, c.violation_rate_hi) for c in reference.classes}
    for c in candidate.classes:
        r, r_hi = ref.get(c.request_class, (0.0, 0.0))
        rise_pp, rise_hi_pp = 100.0 * (c.violation_rate - r), 100.0 * (c.violation_rate_hi - r_hi)
        if rise_pp > tolerance_pp + 1e-12:
            why.append(f"{c.request_class} violation +{rise_pp:.2f} pp > {tolerance_pp:g} pp over reference")
        elif rise_hi_pp > tolerance_pp + 1e-12:
            why.append(f"{c.request_class} violation at the 95% demand bound +{rise_hi_pp:.2f} pp > "
                       f"{tolerance_pp:g} pp over reference")
    ok = not why
    return GateResult("pareto", ok, "; ".join(why) if why else
                      f"gp/$ {g:.4g} > reference {g_ref:.4g}, "
                      f"no class over +{tolerance_pp:g} pp")


def replicas_changed(previous: Plan | None, plan: Plan) -> int:
    """Replicas started, stopped or reloaded going from `previous` to `plan` (count): |floor change| per pool,
    plus the replicas kept warm through a precision or tp change (they reload)."""
    if previous is None:
        return 0
    before = {p.key: p for p in previous.pools}
    n = 0
    for p in plan.pools:
        q = before.pop(p.key, None)
        if q is None:
            n += p.replica_floor
            continue
        n += abs(p.replica_floor - q.replica_floor)
        if (p.precision, p.tp) != (q.precision, q.tp):
            n += min(p.replica_floor, q.replica_floor)
    return n + sum(q.replica_floor for q in before.values())


def _context_tokens(forecast: DisturbanceForecast) -> dict[str, float]:
    """Arrival-weighted mean resident context per model: input + half the output (tokens)."""
    num: dict[str, float] = defaultdict(float)
    den: dict[str, float] = defaultdict(float)
    for d in forecast.demand:
        w = max(d.arrivals_per_s.point, 1e-9)
        num[d.model] += w * (d.input_tokens_mean + 0.5 * d.output_tokens_mean)
        den[d.model] += w
    return {m: num[m] / den[m] for m in num}
