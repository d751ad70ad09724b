"""`production-tuned`: the best single static configuration chosen on the 7 days before the window, plus a
price rule (the "best fixed" reference of the Koi paper, DESIGN.md).

The configuration (weight precision and KV-cache dtype where allowed, batch cap, SM clock, autoscaler target:
a `StaticConfig`) is the one that did best on the week before
the window: the replay harness measures candidate configurations on a past window of the same site
(streams/replay/tuning.py) and passes the winner as `config`, as an operator tunes on its own past
traffic. Without `config` (e.g. inside the optimizer, which has no simulator) it is chosen by scoring every
candidate with the operator's forward model over periods sampled from the history aggregates. Either way:
highest SLA-met per dollar among configurations whose violation rate stays within 0.1 pp of the as-deployed
configuration's in every class. The autoscaler, routing and ordering stay as deployed. Price rule: hold
deferrable work while the latest known price exceeds the past week's 90th percentile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import numpy as np
import polars as pl

from optimizer.baselines.production import ProductionPolicy
from optimizer.baselines.sizing import MODEL_OF_CLASS
from optimizer.registry import register
from schemas.availability import market_rows
from schemas.cost import CostConfig
from schemas.fleet import PRECISIONS_BY_GPU, SM_CLOCK_RANGE_MHZ, GpuType, Precision, kv_dtype_for
from schemas.forecast import ClassDemand, DisturbanceForecast, Interval
from schemas.plan import BatchAdmission, Plan
from schemas.policy import History, Observations, Policy, PolicyContext
from schemas.records import frame_schema
from worldmodel.forward import ForwardModel
from worldmodel.servingmodel import ServingModel
from worldmodel.snapshot import FleetSnapshot, PoolState

#: batch caps searched; None is the as-deployed cap, the engine's default max_num_seqs per GPU type
MAX_BATCHES: tuple[int | None, ...] = (None, 128, 256, 512)
DEPLOYED: tuple[str, int | None, float] = ("bf16", None, 1.0)
CLOCK_SHARES = (1.0, 0.85, 0.7)
SLA_SLACK = 0.001  # 0.1 pp


@dataclass(frozen=True)
class StaticConfig:
    """One static configuration of the deployed reference.

    precision : weights "bf16" | "fp8" (fp8 only where the GPU has it; bf16 elsewhere).
    kv_dtype : KV cache "auto" | "fp8" (fp8 only with fp8 weights; "auto" elsewhere).
    max_batch : sequences per replica, or None to keep each pool's as-deployed cap (the engine default).
    clock_share : SM clock as a share of the GPU's maximum.
    target : the autoscaler's utilization target.
    max_num_batched_tokens : chunked-prefill token budget (tokens), or None for the engine default per GPU type.
    """

    precision: str = "bf16"
    kv_dtype: str = "auto"
    max_batch: int | None = None
    clock_share: float = 1.0
    target: float = 0.8
    max_num_batched_tokens: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"precision": self.precision, "kv_dtype": self.kv_dtype, "max_batch": self.max_batch,
                "clock_share": self.clock_share, "target": self.target,
                "max_num_batched_tokens": self.max_num_batched_tokens}  # fmt: skip


#: The configuration as deployed (production's).
DEPLOYED = StaticConfig()


@register("production-tuned")
class TunedProductionPolicy(Policy):
    """Best static configuration on the past week + defer batch work above the past week's price p90.

    config : the `StaticConfig` measured best on the past week, or None to choose it with the forward model;
    sample_every_h : hours between history periods scored (h);
    price_quantile : the price rule's quantile.
    """

    name = "production-tuned"

    def __init__(
        self,
        config: StaticConfig | None = None,
        sample_every_h: float = 4.0,
        price_quantile: float = 0.9,
    ) -> None:
        self.config = config
        self.sample_every_h = sample_every_h
        self.price_quantile = price_quantile
        self._base: Plan | None = None
        self._steady: Plan | None = None
        self._prices = pl.DataFrame()
        self._market = ""
        self.threshold_usd_mwh = float("inf")
        self.chosen: dict[str, object] = {}

    def start(self, ctx: PolicyContext, history: History) -> Plan:
        deployed = ProductionPolicy()
        first = deployed.start(ctx, history)
        steady = deployed.plan(None)  # type: ignore[arg-type]  # as-deployed plan ignores observations
        config = self.config or self._choose(ctx, history, steady)
        self._base = _configure(first, config)
        self._steady = replace(_configure(steady, config), label=f"production-tuned: {config.as_dict()}")
        self._market = ctx.markets[0]  # the price rule reads the first market's price (the window's)
        prices = history.prices if history.prices.width else pl.DataFrame(schema=frame_schema("price"))  # fresh
        self._prices = market_rows(prices, self._market).select("interval_start", "lmp_usd_mwh", "published_at")
        week = self._prices.filter(pl.col("interval_start") >= ctx.window_start - timedelta(days=7))
        if week.height:
            self.threshold_usd_mwh = float(week["lmp_usd_mwh"].quantile(self.price_quantile))
        return self._with_rule(self._base, ctx.window_start)

    def plan(self, obs: Observations) -> Plan:
        assert self._steady is not None, "start() first"
        if obs.prices.height:
            mine = market_rows(obs.prices, self._market).select(self._prices.columns)
            self._prices = pl.concat([self._prices, mine])
        return self._with_rule(self._steady, obs.as_of)

    def _with_rule(self, plan: Plan, as_of: datetime) -> Plan:
        """Hold deferrable work while the latest price known as of `as_of` for the current hour exceeds p90."""
        known = self._prices.filter((pl.col("published_at") <= as_of) & (pl.col("interval_start") <= as_of))
        price = float(known.sort("interval_start")["lmp_usd_mwh"][-1]) if known.height else 0.0
        hold = price > self.threshold_usd_mwh
        adm = BatchAdmission.HOLD if hold else plan.batch_admission
        return replace(
            plan, batch_admission=adm, notes=(f"price {price:.1f} vs p90 {self.threshold_usd_mwh:.1f}",)
        )

    def _choose(self, ctx: PolicyContext, history: History, deployed: Plan) -> StaticConfig:
        model = ForwardModel(ServingModel(), CostConfig())
        forecasts = _history_forecasts(history, ctx.markets[0], ctx.period_s, self.sample_every_h)
        if not forecasts:
            return DEPLOYED
        scores: dict[StaticConfig, tuple[float, np.ndarray]] = {}
        for prec in ("bf16", "fp8"):
            for mb in (None, *MAX_BATCHES):
                for share in CLOCK_SHARES:
                    cfg = StaticConfig(prec, "auto", mb, share)
                    plan = _configure(deployed, cfg)
                    snap = _snapshot(plan, forecasts[0].period_start)
                    met = cost = 0.0
                    viol = []
                    for fc in forecasts:
                        out = model.evaluate(replace(snap, as_of=fc.period_start), plan, fc)
                        met += out.sla_met
                        cost += out.cost_usd
                        viol.append([c.violation_rate for c in out.classes])
                    scores[cfg] = (met / cost if cost > 0 else 0.0, np.mean(viol, axis=0))
        base_viol = scores[DEPLOYED][1]
        ok = {c: s for c, s in scores.items() if np.all(s[1] <= base_viol + SLA_SLACK)}
        best = max(ok, key=lambda c: ok[c][0])
        self.chosen = {**best.as_dict(), "predicted_gp_per_dollar": ok[best][0]}
        return best


def with_precision(plan: Plan, precision: str, kv_dtype: str = "auto") -> Plan:
    """`plan` with weights in `precision` and the KV cache in `kv_dtype` on every pool whose GPU allows them (bf16
    and "auto" on the others); nothing else changed.

    >>> from schemas.plan import PoolPlan
    >>> p = Plan((PoolPlan("s", "m", "H100", 1, 8, 4, "bf16", 1024, 1980), PoolPlan("s", "m", "A100", 0, 8, 8,
    ...           "bf16", 256, 1410)))
    >>> [(q.precision, q.kv_dtype) for q in with_precision(p, "fp8", "fp8").pools]  # the A100 has no fp8
    [('fp8', 'fp8'), ('bf16', 'auto')]
    """
    pools = []
    for p in plan.pools:
        g = GpuType(p.gpu)
        prec = Precision(precision) if precision in PRECISIONS_BY_GPU[g] else Precision.BF16
        pools.append(replace(p, precision=str(prec), kv_dtype=kv_dtype_for(prec, kv_dtype)))
    return replace(plan, pools=tuple(pools))


def with_clock_share(plan: Plan, share: float) -> Plan:
    """`plan` with every pool's SM clock at `share` of its GPU's maximum (MHz, rounded, not below the minimum).

    >>> from schemas.plan import PoolPlan
    >>> p = Plan((PoolPlan("s", "m", "H100", 1, 8, 4, "bf16", 1024, 1980), PoolPlan("s", "m", "A100", 0, 8, 8,
    ...           "bf16", 256, 1410)))
    >>> [q.sm_clock_mhz for q in with_clock_share(p, 0.85).pools]
    [1683, 1198]
    >>> [q.sm_clock_mhz for q in with_clock_share(p, 0.1).pools]  # the minimum clock
    [1095, 1005]
    """
    pools = []
    for p in plan.pools:
        lo, hi = SM_CLOCK_RANGE_MHZ[GpuType(p.gpu)]
        pools.append(replace(p, sm_clock_mhz=int(max(lo, round(hi * share)))))
    return replace(plan, pools=tuple(pools))


def with_token_budget(plan: Plan, tokens: int | None) -> Plan:
    """`plan` with every pool's chunked-prefill token budget at `tokens` per iteration (None: the engine's
    default); nothing else changed (a restart setting, like the precision).

    >>> from schemas.plan import PoolPlan
    >>> p = Plan((PoolPlan("s", "m", "H100", 1, 8, 4, "bf16", 1024, 1980),))
    >>> [q.max_num_batched_tokens for q in with_token_budget(p, 2048).pools]
    [2048]
    """
    return replace(plan, pools=tuple(replace(p, max_num_batched_tokens=tokens) for p in plan.pools))


def _configure(plan: Plan, cfg: StaticConfig) -> Plan:
    """`plan` with the configuration applied to every pool (precision and KV dtype where the GPU allows)."""
    engine = with_token_budget(with_precision(plan, cfg.precision, cfg.kv_dtype), cfg.max_num_batched_tokens)
    pools = [replace(p, max_batch=p.max_batch if cfg.max_batch is None else cfg.max_batch)
             for p in with_clock_share(engine, cfg.clock_share).pools]  # fmt: skip
    return replace(plan, pools=tuple(pools), autoscale_target=cfg.target)


def _snapshot(plan: Plan, as_of: datetime) -> FleetSnapshot:
    pools = tuple(
        PoolState(
            p.site,
            p.model,
            p.gpu,
            warm=max(p.replica_floor, 1),
            loading=0,
            cold=0,
            tp=p.tp,
            precision=p.precision,
            sm_clock_mhz=p.sm_clock_mhz,
            max_batch=p.max_batch,
            kv_dtype=p.kv_dtype,
        )
        for p in plan.pools
    )
    return FleetSnapshot(as_of=as_of, pools=pools, queues=())


def _history_forecasts(history: History, market: str, period_s: float, every_h: float) -> list[DisturbanceForecast]:
    """Realized history periods (every `every_h` hours) as forecasts with zero-width intervals."""
    apm = history.arrivals_per_minute
    if apm.height == 0:
        return []
    sizes = history.size_quantiles
    prices = market_rows(history.prices, market).sort("interval_start")
    t0, t1 = apm["minute_at"].min(), apm["minute_at"].max()
    out = []
    t = t0
    while t + timedelta(seconds=period_s) <= t1:
        t_end = t + timedelta(seconds=period_s)
        window = apm.filter((pl.col("minute_at") >= t) & (pl.col("minute_at") < t_end))
        sz = sizes.filter((pl.col("period_at") >= t) & (pl.col("period_at") < t_end))
        pr = prices.filter(pl.col("interval_start") <= t).tail(1)
        if window.height and sz.height and pr.height:
            demand = []
            for cls, model in MODEL_OF_CLASS.items():
                n = float(window.filter(pl.col("request_class") == cls)["requests"].sum())
                s = sz.filter(pl.col("request_class") == cls)
                if s.height == 0:
                    continue
                rate = n / period_s
                i50, i90 = float(s["input_tokens_p50"][0]), float(s["input_tokens_p90"][0])
                o50, o90 = float(s["output_tokens_p50"][0]), float(s["output_tokens_p90"][0])
                demand.append(
                    ClassDemand(
                        cls,
                        model,
                        Interval(rate, rate, rate, rate, rate),
                        (i50 + i90) / 2,
                        (o50 + o90) / 2,
                        i90,
                        o90,
                    )
                )
            price = float(pr["lmp_usd_mwh"][0])
            out.append(
                DisturbanceForecast(
                    t, period_s, tuple(demand), Interval(price, price, price, price, price), True, 1.0
                )
            )
        t += timedelta(hours=every_h)
    return out
