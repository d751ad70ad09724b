"""The planner's forward model: advance a frozen snapshot one control period under a candidate plan.

A queueing approximation with batching, not a per-request simulation. Per pool (model x GPU type x site):

1. replicas: the autoscaler's count ceil(lambda / (target x mu_r)) clamped to [floor, ceiling]
   (the floor when autoscaling is off); scale-down waits out its 300 s stabilization (a whole period);
   new replicas and precision reloads hold their GPUs for the load time while serving nothing (a reload
   takes the whole pool at once, as the runtime does, so what arrives meanwhile queues);
2. batch: Little's law, B = lambda_r x (T_prefill + n_out x TPOT(B)), solved by fixed point and capped by
   max_batch and the KV capacity; TPOT = t_decode(B) / (1 - lambda_r x T_prefill) (chunked prefill steals
   iteration time);
3. TTFT: two waits before the prompt runs, each an M/G/c queue (Allen-Cunneen wait, Sakasegawa's P(wait)):
   the prompt-chunk queue (c = replicas, service = the prompt's chunks, each riding a decode step) and,
   once batches fill, a batch slot (c = replicas x batch cap, held for the request's residence); before,
   the chunk queue ran at the full-batch throughput's utilization, so every busy pool was predicted to
   queue (p99 TTFT 3x the realized at production load); exponential conditional-wait tails give
   P(TTFT > SLA) and p99; sustained overload and initial backlog by a fluid queue Q(t) = Q0 + (lambda - mu) t;
4. TPOT tail: chunked-prefill interference over output lengths with a step spread (CV from self-calibration x
   the risk band), and at least the tail shape learned from completions (worldmodel/tails.py);
5. energy: GPU power from busy share, prefill share, batch and clock (ServingModel), the non-GPU power of every
   node hosting a replica (the nodes the snapshot's GPUs sit on, grown first fit: `_nodes_on`; before, GPUs / 8
   rounded up, 8-13 % under the observed energy once scale-downs left nodes part-used), idle GPUs of the site at
   idle, x PUE; cost through schemas/cost.py at the forecast (or published) price.

The spread comes from re-evaluating at the forecast's 80 % and 95 % demand bounds (and the price's upper
bound when unpublished): violation_rate_hi is the 95 %-demand violation, gp_per_dollar_lo the worst scenario.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from schemas import cost
from schemas.fleet import GPUS_PER_NODE as _GPUS_PER_NODE
from schemas.fleet import default_fleet
from schemas.forecast import ClassDemand, ClassOutcome, DisturbanceForecast, Interval, PredictedOutcome
from schemas.plan import BatchAdmission, Ordering, Plan, PoolPlan
from schemas.protocol import PROTOCOL_V1, Protocol
from worldmodel.servingmodel import (
    PoolConfig,
    ServingModel,
    clock_or_max,
    gamma_exceed,
    prompt_cv_from_p90,
    size_cv_from_p90,
)
from worldmodel.snapshot import FleetSnapshot
from worldmodel.tails import (
    chunk_mix,
    empirical_exceed,
    fluid_share,
    tpot_exceed,
)

_RHO_MAX = 0.98
_SCENARIOS = ("point", "lo80", "hi80", "hi95")


@dataclass(frozen=True)
class _Pool:
    """Static per-pool figures of one plan against one snapshot."""

    plan: PoolPlan
    cfg: PoolConfig
    current: int  # warm + loading replicas now (count)
    reloads: int  # replicas reloading for a precision change (count)
    load_s: float
    loading_left_s: tuple[float, ...]
    chunk_s: float  # compute time of one full chunked-prefill budget (s)
    released: int = 0  # replicas held only by the in-force plan's floor that this plan's floor lets go (count)
    power_clock_mhz: float = 0.0  # the clock its power is drawn at: the plan's, capped by the observed (MHz)


@dataclass
class _Load:
    """Demand offered to one model's pools: rates (req/s), mean sizes (tokens), size CV, backlog."""

    lam_i: float
    lam_b: float
    n_in: float
    n_out: float
    size_cv: float
    q0: float
    n_in_i: float = 0.0  # interactive prompts only: mean uncached tokens
    size_cv_i: float = 0.0  # and their size CV


@dataclass
class _PoolResult:
    replicas: float
    serving: float
    mu: float
    lam: float
    tpot_s: float
    t_pf: float
    p_wait: float
    theta: float
    busy: float
    batch: float
    power_w: float
    fluid: tuple[float, float]  # (initial backlog, net growth rate) of the fluid queue (req, req/s)
    mixed: tuple[float, float, float] = (0.0, 0.0, 0.0)  # decode step (s), share of iterations carrying a
    # prefill chunk (0-1), the chunk's compute (s): per-request TPOT spread from chunked-prefill interference
    slot_wait: tuple[float, float] = (0.0, 1.0)  # P(waiting for a batch slot) (0-1), its mean wait if so (s)


class ForwardModel:
    """Score a plan against a snapshot and a disturbance forecast for one control period.

    Parameters
    ----------
    serving_model : the planner's roofline model (its corrections are replaced by the snapshot's).
    cost_config : operator cost configuration (schemas/cost.py).
    protocol : classes, models and SLAs (default protocol v1).
    idle_power : count the site's unassigned GPUs at idle power (False, the default: a GPU that hosts no
        replica is powered down with its node; every node hosting a replica draws its non-GPU overhead).
    inventory : GPUs per (site, gpu type) (count); replicas beyond it cannot be placed (default: the
        operator's fleet inventory, schemas.fleet.default_fleet).
    unobserved_precision_risk : evaluate the upper demand scenarios crediting no gain to a precision never
        observed on its (gpu, model) (`Corrections.pessimistic`), which lowers gp/$_lo of such plans.
    site_markets : the market each site's energy is priced at (default: the operator's fleet); a site whose
        market the forecast carries in `other_markets` pays that price, any other the forecast's own.
    """

    def __init__(
        self,
        serving_model: ServingModel,
        cost_config: cost.CostConfig,
        protocol: Protocol = PROTOCOL_V1,
        idle_power: bool = False,
        inventory: Mapping[tuple[str, str], int] | None = None,
        unobserved_precision_risk: bool = False,
        site_markets: Mapping[str, str] | None = None,
    ) -> None:
        self.serving_model = serving_model
        self.cost_config = cost_config
        self.protocol = protocol
        self.idle_power = idle_power
        self.inventory = dict(inventory) if inventory is not None else _default_inventory()
        self.unobserved_precision_risk = unobserved_precision_risk
        self.site_markets = dict(site_markets) if site_markets is not None else _default_site_markets()

    def evaluate(self, snapshot: FleetSnapshot, plan: Plan, forecast: DisturbanceForecast) -> PredictedOutcome:
        """Predict one period's outcome of `plan` from `snapshot` under `forecast` (pure: reads only).

        Parameters
        ----------
        snapshot : frozen state at the period start.
        plan : the candidate plan.
        forecast : disturbances of the period (arrival rates with intervals, sizes, price).

        Returns
        -------
        PredictedOutcome at the point forecast, with violation_rate_hi and gp_per_dollar_lo from the bounds.
        """
        sm = self.serving_model.with_corrections(snapshot.corrections)
        period_s = forecast.period_s
        pools = [self._static(sm, snapshot, p) for p in plan.pools]
        # optionally the upper scenarios credit no gain to a precision never observed (a risk band for unseen
        # configurations); off by default: on PJM it moved the first plan to bf16 and invited a costly reload
        hi_corr = snapshot.corrections.pessimistic() if self.unobserved_precision_risk else snapshot.corrections
        sm_hi = self.serving_model.with_corrections(hi_corr)
        results = {
            s: self._scenario(sm_hi if s in ("hi80", "hi95") else sm, snapshot, plan, forecast, pools, s)
            for s in _SCENARIOS
        }
        point = results["point"]
        hi = results["hi95"]
        classes = tuple(
            ClassOutcome(
                c.request_class,
                c.offered,
                c.served,
                c.violation_rate,
                max(c.violation_rate, hi.by_class[c.request_class].violation_rate),
                c.ttft_p99_ms,
                c.tpot_p99_ms,
            )
            for c in point.classes
        )
        return PredictedOutcome(
            classes=classes,
            gpu_hours=point.gpu_hours,
            energy_kwh=point.energy_kwh,
            energy_cost_usd=point.energy_cost_usd,
            cost_usd=point.cost_usd,
            cost_usd_owned=point.cost_owned,
            reloads=sum(p.reloads for p in pools) + point.cold_starts,
            deferred_carryover=point.carryover,
            peak_power_w=max(r.peak_power_w for r in results.values()),
            sla_met=point.sla_met,
            gp_per_dollar=point.sla_met / point.cost_usd,
            gp_per_dollar_lo=min(r.sla_met / r.cost_usd for r in results.values()),
            notes=(f"period_s={period_s:g}", f"risk_band={snapshot.risk_band:.2f}"),
        )

    def _static(self, sm: ServingModel, snap: FleetSnapshot, p: PoolPlan) -> _Pool:
        cfg = PoolConfig(p.gpu, p.model, p.tp, p.precision, clock_or_max(p.gpu, p.sm_clock_mhz))
        state = snap.pool(p.key)
        load_s = sm.load_s(cfg)
        chunk_s = sm.prefill_s(cfg, sm.priors.chunk_tokens)
        if state is None:
            # no fleet state at all (nothing observed yet): the plan's floors are taken to be in place
            current = p.replica_floor if not snap.pools else 0
            return _Pool(p, cfg, current, 0, load_s, (), chunk_s)
        left = tuple(max(load_s - e, 0.0) for e in state.loading_elapsed_s)
        reloads = state.warm + state.loading if state.precision != p.precision else 0
        current = state.warm + state.loading
        released = max(min(current, snap.floors.get(p.key, 0)) - p.replica_floor, 0)
        # the power cap and heat hold the clock below the applied one; a lower plan clock runs cooler (untouched)
        throttled = state.clock_eff_mhz if state.clock_eff_mhz > 0 else cfg.sm_clock_mhz
        return _Pool(p, cfg, current, reloads, load_s, left, chunk_s, released, min(cfg.sm_clock_mhz, throttled))

    def _scenario(
        self,
        sm: ServingModel,
        snap: FleetSnapshot,
        plan: Plan,
        fc: DisturbanceForecast,
        pools: list[_Pool],
        scenario: str,
    ) -> _Scenario:
        T = fc.period_s
        hi = scenario in ("hi80", "hi95")
        cv = snap.corrections.step_cv
        cvs = (cv, cv * snap.risk_band) if hi else (cv,)  # the band widens the spread, pessimistically
        out = _Scenario()
        by_model: dict[str, list[ClassDemand]] = {}
        for p in pools:  # placement order: the plan's pools (the runtime starts replicas in this order)
            by_model.setdefault(p.plan.model, [])
        for d in fc.demand:
            by_model.setdefault(d.model, []).append(d)
        power_w: dict[str, float] = {}  # per site (W)
        gpus_used: dict[tuple[str, str], float] = {}
        gpu_hours: dict[str, float] = {}
        free: dict[tuple[str, str], float] = {k: float(v) for k, v in self.inventory.items()}
        served: dict[str, tuple[_Load, list[_PoolResult], float, tuple[float, float, float]]] = {}
        reloading: dict[str, float] = {}
        for model, demands in by_model.items():
            mpools = [p for p in pools if p.plan.model == model]
            if not mpools:
                continue
            load, batch_info = self._model_load(snap, plan, fc, demands, scenario, mpools, sm)
            res = self._serve_model(sm, plan, mpools, load, T, free)
            out.cold_starts += sum(max(math.ceil(r.replicas) - p.current, 0) for p, r in zip(mpools, res, strict=True))
            served[model] = (load, res, sum(r.mu for r in res), batch_info)
            # share of the model's replicas a precision change reloads (0-1): their in-flight work is requeued
            reloading[model] = min(sum(p.reloads for p in mpools) / max(sum(p.current for p in mpools), 1), 1.0)
            for p, r in zip(mpools, res, strict=True):
                power_w[p.plan.site] = power_w.get(p.plan.site, 0.0) + r.power_w
                key = (p.plan.site, p.plan.gpu)
                gpus_used[key] = gpus_used.get(key, 0.0) + r.replicas * p.plan.tp
                gpu_hours[p.plan.gpu] = gpu_hours.get(p.plan.gpu, 0.0) + r.replicas * p.plan.tp * T / 3600.0
        for d in fc.demand:  # class outcomes in the forecast's order
            load, res, mu, batch_info = served.get(d.model, (_Load(0, 0, 0, 0, 0, 0), [], 0.0, (0.0, 0.0, 0.0)))
            queue = snap.queue(d.request_class)
            self._class_outcome(
                out,
                d,
                _rate(d, scenario),
                load,
                res,
                mu,
                T,
                cvs,
                batch_info,
                tails=scenario == "point",
                learned=snap.corrections.tpot_tail.get(d.request_class, ()),
                requeued=(queue.outstanding if queue else 0) * reloading.get(d.model, 0.0),
            )
        for key, n in gpus_used.items():  # every node hosting a replica draws its overhead
            nodes = _nodes_on(n, *snap.placement.get(key, (0, 0)))
            power_w[key[0]] = power_w.get(key[0], 0.0) + nodes * sm.node_overhead_w(key[1])
        if self.idle_power:
            for (site, gpu), n in snap.gpus.items():
                idle = max(n - gpus_used.get((site, gpu), 0.0), 0.0)
                power_w[site] = power_w.get(site, 0.0) + idle * sm.gpu_power_w(gpu, clock_or_max(gpu, None), 0.0)
        total_w = sum(power_w.values())
        out.peak_power_w = total_w
        out.gpu_hours = sum(gpu_hours.values())
        out.energy_kwh = total_w * T / 3.6e6 * self.cost_config.pue.value
        out.energy_cost_usd = sum(
            cost.energy_cost_usd(w / 1e3, T / 3600.0, self._price(fc, site, scenario), self.cost_config)
            for site, w in power_w.items()
        )
        rented = cost.gpu_cost_rented_usd(gpu_hours, self.cost_config)
        owned = cost.gpu_cost_owned_usd(_by_gpu(snap.gpus), T / 3600.0, self.cost_config)
        out.cost_usd = max(rented + out.energy_cost_usd, 1e-9)
        out.cost_owned = max(owned + out.energy_cost_usd, 1e-9)
        return out

    def _price(self, fc: DisturbanceForecast, site: str, scenario: str) -> float:
        """The energy price of `site` in this scenario ($/MWh): its market's, the 95% bound where unpublished."""
        price, published = market_price(fc, self.site_markets.get(site))
        return price.hi95 if scenario == "hi95" and not published else price.point

    def _model_load(
        self,
        snap: FleetSnapshot,
        plan: Plan,
        fc: DisturbanceForecast,
        demands: list[ClassDemand],
        scenario: str,
        pools: list[_Pool],
        sm: ServingModel,
    ) -> tuple[_Load, tuple[float, float, float]]:
        """Offered load of one model and the batch work's (released, carried, missed) counts."""
        T = fc.period_s
        lam_i = lam_b = w_in = w_out = w_cv = w_in_i = w_cv_i = 0.0
        q0 = 0.0
        batch_backlog = 0.0
        deadlines: tuple[float, ...] = ()
        for d in demands:
            lam = _rate(d, scenario)
            spec = self.protocol.spec(d.request_class)
            n_in = d.input_tokens_mean * (1.0 - d.prefix_hit_rate)
            w_in += lam * n_in
            w_out += lam * d.output_tokens_mean
            cv = prompt_cv_from_p90(d.input_tokens_mean, d.input_tokens_p90)
            w_cv += lam * cv
            queue = snap.queue(d.request_class)
            if spec.deferrable:
                lam_b += lam
                batch_backlog = float(fc.deferred_backlog_requests or (queue.outstanding if queue else 0))
                deadlines = fc.deferred_deadlines_s or (queue.deadlines_s if queue else ())
            else:
                lam_i += lam
                w_in_i += lam * n_in
                w_cv_i += lam * cv
                running = sum(p.running * p.warm for p in snap.pools if p.model == d.model)
                q0 += max((queue.outstanding if queue else 0) - running, 0.0)
        lam_all = max(lam_i + lam_b, 1e-12)
        li = max(lam_i, 1e-12)
        load = _Load(lam_i, 0.0, w_in / lam_all, w_out / lam_all, w_cv / lam_all, q0, w_in_i / li, w_cv_i / li)
        if lam_b <= 0.0 and batch_backlog <= 0.0:
            return load, (0.0, 0.0, 0.0)
        waiting = lam_b * T + batch_backlog
        urgent = _urgent_share(deadlines, T) * batch_backlog
        mu_ceiling = sum(self._mu_replica(sm, p, load) * p.plan.replica_ceiling for p in pools)
        spare = max(plan.autoscale_target * mu_ceiling - lam_i, 0.0) * T
        if plan.batch_admission == BatchAdmission.IMMEDIATE:
            released = waiting
        elif plan.batch_admission == BatchAdmission.PRESSURE:
            released = max(min(waiting, spare), urgent)
        else:
            released = urgent
        servable = max(mu_ceiling - lam_i, 0.0) * T
        missed = max(urgent - servable, 0.0) + sum(1.0 for x in deadlines if x < 0.0) * (
            batch_backlog / max(len(deadlines), 1)
        )
        load.lam_b = released / T
        return load, (released, waiting - released, missed)

    @staticmethod
    def _util_per_request(sm: ServingModel, p: _Pool, load: _Load) -> float:
        """Replica-seconds of the autoscaler's metric one request adds (s): the runtime's utilization is batch
        slots held (running / max_batch) plus the share of time in prefill, so a request holds a slot for
        T_prefill + n_out x TPOT and the replica's compute for T_prefill (TPOT at the batch the target implies)."""
        ctx = load.n_in + load.n_out / 2.0
        t_pf = sm.prefill_s(p.cfg, load.n_in)
        t_dec = sm.decode_step_s(p.cfg, 0.8 * _batch_cap(sm, p, ctx), ctx)
        return (t_pf + load.n_out * t_dec) / max(p.plan.max_batch, 1) + t_pf

    def _mu_replica(self, sm: ServingModel, p: _Pool, load: _Load) -> float:
        """Throughput of one replica at its full batch (req/s)."""
        ctx = load.n_in + load.n_out / 2.0
        b_cap = _batch_cap(sm, p, ctx)
        t_pf = sm.prefill_s(p.cfg, load.n_in)
        return 1.0 / (t_pf + load.n_out * sm.decode_step_s(p.cfg, b_cap, ctx) / b_cap)

    def _serve_model(
        self,
        sm: ServingModel,
        plan: Plan,
        pools: list[_Pool],
        load: _Load,
        T: float,
        free: dict[tuple[str, str], float],
    ) -> list[_PoolResult]:
        lam = load.lam_i + load.lam_b
        mus = [self._mu_replica(sm, p, load) for p in pools]
        util_s = self._util_per_request(sm, pools[0], load) if pools else 0.0
        counts = self._place(plan, pools, mus, lam, free, util_s)
        # the router sends work to warm replicas only: a pool's share follows its serving capacity
        serving = [_serving(p, n, T) for p, n in zip(pools, counts, strict=True)]
        weights = [m * s for m, s in zip(mus, serving, strict=True)]
        total = sum(weights)
        return [
            self._serve_pool(
                sm,
                plan,
                p,
                n,
                srv,
                mu_r,
                lam * w / total if total > 0 else 0.0,
                load,
                load.q0 * w / total if total > 0 else 0.0,
                T,
            )
            for p, n, srv, mu_r, w in zip(pools, counts, serving, mus, weights, strict=True)
        ]

    @staticmethod
    def _place(
        plan: Plan, pools: list[_Pool], mus: list[float], lam: float, free: dict[tuple[str, str], float],
        util_s: float = 0.0,
    ) -> list[float]:
        """Replicas per pool of one model, as the runtime's autoscaler places them (count).

        The model's desired count is what keeps the replicas at the autoscale target (by throughput, and by the
        runtime's own metric: batch slots held plus prefill share, `util_s` per request), clamped to the plan's
        summed floor and ceiling. Scale-up is immediate; scale-down waits out the 300 s stabilization window,
        which spans the period, so existing replicas are kept, except those only the in-force plan's floor held
        (`snapshot.floors`) that this plan's floor lets go: the autoscaler's history of desired counts is taken
        before the floor clamp, so it releases them at once unless its own count needs them. Tried and measured
        worse: a half-period decay; scaling down to what the telemetry's running sequences per batch slot ask
        for (it misses the prefill share of the runtime's metric and predicted the reference's 8B pool to
        collapse to one replica); the same plus the GPU busy share (always 1.0 on a decoding 70B pool). The count
        is split floors first, then existing replicas, then growth in the plan's pool order, each pool
        within its ceiling and the GPUs left of its type (the inventory). With several sites each site's
        autoscaler grows by its share of the load (the router spreads work by serving capacity): growth is split
        over the sites in proportion to the replicas they hold, what a site's ceilings refuse going to the rest.
        """
        floors = [p.plan.replica_floor for p in pools]
        if plan.autoscale:
            mu_pref = mus[0] if mus else 0.0
            need = math.ceil(lam * max(1.0 / max(mu_pref, 1e-12), util_s) / plan.autoscale_target) if lam > 0 else 0
            desired = float(max(need, sum(p.current - p.released for p in pools)))
            desired = min(max(desired, sum(floors)), sum(p.plan.replica_ceiling for p in pools))
        else:
            desired = float(sum(floors))
        counts = [0.0] * len(pools)

        def grow(k: int, upto: float) -> None:
            nonlocal desired
            p = pools[k].plan
            room = free.get((p.site, p.gpu), math.inf) // max(p.tp, 1)  # a site not in the inventory: unbounded
            add = max(min(upto - counts[k], room, desired), 0.0)
            counts[k] += add
            desired -= add
            free[(p.site, p.gpu)] = free.get((p.site, p.gpu), math.inf) - add * p.tp

        for k in range(len(pools)):
            grow(k, floors[k])
        for k, p in enumerate(pools):
            kept = max(p.current - p.released, floors[k])
            grow(k, min(p.plan.replica_ceiling, kept) if plan.autoscale else floors[k])
        if plan.autoscale:
            sites = list(dict.fromkeys(p.plan.site for p in pools))
            if len(sites) > 1:  # one autoscaler per site: each grows by its share of the load, so growth
                # follows the sites' present counts (equal when none has any); a site at its ceilings
                # leaves its share to the others (the router sends them what it cannot take)
                have = {s: sum(counts[k] for k, p in enumerate(pools) if p.plan.site == s) for s in sites}
                total = sum(have.values())
                growth = desired
                for s in sites:
                    add = math.ceil(growth * (have[s] / total if total > 0 else 1.0 / len(sites)) - 1e-9)
                    for k, p in enumerate(pools):
                        if p.plan.site == s and add > 0:
                            before = counts[k]
                            grow(k, min(p.plan.replica_ceiling, counts[k] + add))
                            add -= counts[k] - before
            for k, p in enumerate(pools):
                grow(k, p.plan.replica_ceiling)
        return counts

    def _serve_pool(
        self,
        sm: ServingModel,
        plan: Plan,
        p: _Pool,
        n: float,
        serving: float,
        mu_r: float,
        lam: float,
        load: _Load,
        q0: float,
        T: float,
    ) -> _PoolResult:
        """One pool's period: n replicas of which `serving` serve on average (count; see `_serving`)."""
        pp = p.plan
        if p.reloads > 0:  # the runtime reloads the whole pool at once: what arrives meanwhile queues
            q0 += lam * min(p.load_s, T) * min(p.reloads, n) / max(n, 1.0)
        loading = n - serving
        ctx = load.n_in + load.n_out / 2.0
        t_pf = sm.prefill_s(p.cfg, load.n_in)
        b_cap = _batch_cap(sm, p, ctx)
        mu = serving * mu_r
        lam_r = min(lam, _RHO_MAX * mu) / serving if serving > 0 else 0.0
        rho_pf = min(lam_r * t_pf, _RHO_MAX)
        b = 1.0
        for _ in range(6):
            t_dec = sm.decode_step_s(p.cfg, b, ctx)
            b = min(max(lam_r * (t_pf + load.n_out * t_dec / (1.0 - rho_pf)), 1.0), b_cap)
        t_dec = sm.decode_step_s(p.cfg, b, ctx)
        chunks = load.n_in / sm.priors.chunk_tokens
        s = _prompt_service(sm, p.cfg, load.n_in, t_dec)
        # two places a request waits before its first token: the prompt-chunk queue of its replica, and, once
        # the batches are full, a batch slot (lam_r x residence / b_cap of them held; M/G/c with Sakasegawa's
        # P(wait) over the b_cap x replicas slots).
        # The chunk queue is one M/G/1 per replica: the router balances running sequences, which do not show a
        # replica's queued prompt chunks. As M/G/c over the pool's replicas (before) it put code's p99 TTFT at
        # 0.65x the realized on the 1 h imposed-action test once prompt sizes were gamma; per replica 0.94-1.04
        # (fp8, min clock, batch cap 32, observational PJM and ERCOT). Under EDF the batch prompts yield to
        # interactive deadlines at every chunk, so interactive prompts queue behind interactive prompts only.
        c = max(serving, 1.0)
        edf_on = plan.ordering == Ordering.EDF and load.lam_b > 0
        edf = (load.lam_i + 0.5 * load.lam_b) / (load.lam_i + load.lam_b) if edf_on else 1.0
        if edf_on:
            lam_q = lam_r * load.lam_i / (load.lam_i + load.lam_b)
            s_q = _prompt_service(sm, p.cfg, load.n_in_i, t_dec)
            cv_q = load.size_cv_i
        else:
            lam_q, s_q, cv_q = lam_r, s, load.size_cv
        rho = min(lam_q * s_q, _RHO_MAX)
        p_wait = rho
        theta = s_q * (1.0 + cv_q**2) / 2.0 / (1.0 - rho)
        residence = t_pf + load.n_out * t_dec / (1.0 - rho_pf)
        slots = b_cap * c
        rho_slot = min(lam_r * residence / b_cap * edf, _RHO_MAX)
        slot_wait = (_p_wait(rho_slot, slots), residence / (slots * (1.0 - rho_slot)))
        in_flight = lam_r * residence
        busy = 1.0 - math.exp(-in_flight)  # P(at least one sequence in flight), Poisson occupancy
        act = sm.activity_from_util(100.0 * busy)  # the proxy power is calibrated against (DCGM GPU_UTIL)
        clock = p.power_clock_mhz or p.cfg.sm_clock_mhz
        power = pp.tp * (serving * sm.gpu_power_w(pp.gpu, clock, act) + loading * sm.gpu_power_w(pp.gpu, clock, 0.1))
        # chunked prefill: lam_r x chunks/s iterations carry a chunk of compute c; the rest decode only
        mixed = chunk_mix(lam_r, t_pf, chunks, t_dec)
        return _PoolResult(
            n,
            serving,
            mu,
            lam,
            t_dec + mixed[1] * mixed[2],
            s,
            p_wait,
            theta,
            busy,
            b,
            power,
            (q0, lam - mu),
            mixed,
            slot_wait,
        )

    def _class_outcome(
        self,
        out: _Scenario,
        d: ClassDemand,
        lam: float,
        load: _Load,
        res: list[_PoolResult],
        mu: float,
        T: float,
        cvs: tuple[float, ...],
        batch_info: tuple[float, float, float],
        tails: bool = True,
        learned: tuple[tuple[float, float], ...] = (),
        requeued: float = 0.0,
    ) -> None:
        """One class's outcome. `requeued`: requests of the class in flight at the period start on replicas a
        precision change reloads (count); the runtime requeues them mid-stream, so an interactive one misses
        its SLA (a deferrable one recomputes within its deadline): they count as violations, over the
        period's offered plus in-flight requests, and as SLA-met lost against a plan that lets them finish."""
        spec = self.protocol.spec(d.request_class)
        offered = lam * T
        if spec.deferrable:
            released, carried, missed = batch_info
            viol = min(missed / offered, 1.0) if offered > 0 else 0.0
            out.carryover += carried
            # what runs this period within its deadline is met, backlog included; what is carried is the
            # objective's to credit (at the cost it will run at), so holding and releasing count the same work
            met = max(released - missed, 0.0)
            out.add(ClassOutcome(d.request_class, offered, released, viol, viol, 0.0, 0.0), met)
            return
        if offered <= 0.0:  # nothing offered: no rate to speak of, but the requests a reload requeues
            viol = 1.0 if requeued > 0.0 else 0.0
            out.add(ClassOutcome(d.request_class, 0.0, 0.0, viol, viol, 0.0, 0.0), -requeued)
            return
        lam_tot = sum(r.lam for r in res)
        if not res or mu <= 0.0:
            out.add(ClassOutcome(d.request_class, offered, 0.0, 1.0, 1.0, math.inf, math.inf), 0.0)
            return
        v_ttft = v_tpot = 0.0
        served = 0.0
        n_in = d.input_tokens_mean * (1.0 - d.prefix_hit_rate)
        size_cv = prompt_cv_from_p90(d.input_tokens_mean, d.input_tokens_p90)
        out_cv = size_cv_from_p90(d.output_tokens_mean, d.output_tokens_p90)
        slo, slo_tpot = spec.ttft_slo_ms / 1e3, spec.tpot_slo_ms / 1e3
        ttft_tails: list[tuple[float, Callable[[float], float]]] = []
        tpot_tails: list[tuple[float, Callable[[float], float]]] = []
        for r in res:
            if r.replicas <= 0:  # a pool with no replicas serves none of the class
                continue
            share = r.lam / lam_tot if lam_tot > 0 else 1.0 / len(res)
            s_cls = r.t_pf * max(n_in, 1.0) / max(load.n_in, 1.0)

            def ttft_exceed(x: float, r: _PoolResult = r, s_cls: float = s_cls) -> float:
                """P(TTFT > x s): the prompt's own prefill, the chunk-queue and slot waits, the fluid backlog."""
                wait_x = max(x - s_cls, 0.0)
                f_fluid = fluid_share(r.fluid[0], r.fluid[1], r.mu, wait_x, T)
                p_slot, theta_slot = r.slot_wait
                p = (
                    gamma_exceed(s_cls, size_cv, x)
                    + r.p_wait * math.exp(-wait_x / max(r.theta, 1e-9))
                    + p_slot * math.exp(-wait_x / max(theta_slot, 1e-9))
                )
                return f_fluid + (1.0 - f_fluid) * min(p, 1.0)

            def tpot_exceed_x(x: float, r: _PoolResult = r, all_cvs: bool = True) -> float:
                """P(a request's mean TPOT > x s): chunk interference, at least the tail shape learned from
                completions (TPOT / the replica's median) around the predicted typical TPOT (the mean; the
                interference model's median is within a few % of it)."""
                spreads = cvs if all_cvs else cvs[:1]
                p = max(tpot_exceed(r.mixed, cv, d.output_tokens_mean, out_cv, x) for cv in spreads)
                return max(p, empirical_exceed(learned, x / r.tpot_s)) if learned and r.tpot_s > 0.0 else p

            v_ttft += share * ttft_exceed(slo)
            v_tpot += share * tpot_exceed_x(slo_tpot)
            ttft_tails.append((share, ttft_exceed))
            tpot_tails.append((share, partial(tpot_exceed_x, all_cvs=False)))
            served += share * min(offered, r.mu * T)
        # the p99s (reported from the point scenario only) are the class's: quantiles of the pools' mixture
        ttft99 = 1e3 * _mixture_q99(ttft_tails, 2.0 * slo) if tails else 0.0
        tpot99 = 1e3 * _mixture_q99(tpot_tails, 2.0 * slo_tpot) if tails else 0.0
        viol = min(1.0 - (1.0 - v_ttft) * (1.0 - v_tpot), 1.0)
        met = offered * (1 - viol)
        if requeued > 0.0:
            viol = min((viol * offered + requeued) / (offered + requeued), 1.0)
            met -= requeued
        out.add(ClassOutcome(d.request_class, offered, served, viol, viol, ttft99, tpot99), met)


class _Scenario:
    """Accumulator of one demand scenario's outcome."""

    def __init__(self) -> None:
        self.classes: list[ClassOutcome] = []
        self.by_class: dict[str, ClassOutcome] = {}
        self.sla_met = self.carryover = self.gpu_hours = self.energy_kwh = 0.0
        self.energy_cost_usd = self.cost_usd = self.cost_owned = self.peak_power_w = 0.0
        self.cold_starts = 0

    def add(self, c: ClassOutcome, sla_met: float) -> None:
        self.classes.append(c)
        self.by_class[c.request_class] = c
        self.sla_met += sla_met


def _mixture_q99(tails: list[tuple[float, Callable[[float], float]]], guess: float) -> float:
    """The 99th percentile (s) of a mixture of pools' (share, P(X > x)) tails: the x where the share-weighted
    exceedance is 1 %, by bisection after doubling from `guess` (s); inf past a day."""

    def exceed(x: float) -> float:
        return sum(w * f(x) for w, f in tails)

    if not tails:
        return 0.0
    lo, hi = 0.0, max(guess, 1e-3)
    while exceed(hi) > 0.01:
        lo, hi = hi, 2.0 * hi
        if hi > 86_400.0:
            return math.inf
    for _ in range(10):  # the bracket [x, 2x] to 0.1 %
        mid = 0.5 * (lo + hi)
        if exceed(mid) > 0.01:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _p_wait(rho: float, servers: float) -> float:
    """P(an arrival waits) in an M/G/c queue at utilization rho (0-1) with c servers (Sakasegawa 1977)."""
    return min(rho ** (math.sqrt(2.0 * (servers + 1.0)) - 1.0), 1.0) if rho > 0.0 else 0.0


def _prompt_service(sm: ServingModel, cfg: PoolConfig, n_in: float, t_dec: float) -> float:
    """A prompt's time in the chunk queue (s): its compute, and one decode step per chunk (prefill is served
    in chunks that share iterations with decode)."""
    return sm.prefill_s(cfg, n_in) + max(1.0, n_in / sm.priors.chunk_tokens) * t_dec


def _nodes_on(gpus: float, gpus_now: int, nodes_now: int) -> int:
    """Nodes hosting `gpus` GPUs of one (site, gpu type) over the period (count), from the `nodes_now` nodes its
    `gpus_now` GPUs sit on at the snapshot: growth fills their free GPUs before it powers a node (first fit);
    a release empties at most one node per 8 GPUs released (the runtime stops the least-loaded replica,
    wherever it sits), never fewer than packed nodes."""
    packed = math.ceil(gpus / _GPUS_PER_NODE - 1e-9)
    if nodes_now <= 0:
        return packed
    if gpus >= gpus_now:
        spare = nodes_now * _GPUS_PER_NODE - gpus_now
        return nodes_now + math.ceil(max(gpus - gpus_now - spare, 0.0) / _GPUS_PER_NODE - 1e-9)
    return max(packed, nodes_now - math.floor((gpus_now - gpus) / _GPUS_PER_NODE))


def _batch_cap(sm: ServingModel, p: _Pool, ctx: float) -> float:
    """Sequences a replica of the pool can batch (count): its max_batch, at most what the KV cache holds at a
    resident context of `ctx` tokens, at least 1."""
    return max(min(p.plan.max_batch, sm.kv_capacity_tokens(p.cfg) / max(ctx, 1.0)), 1.0)


def _serving(p: _Pool, n: float, T: float) -> float:
    """Replicas of a pool serving on average over the period (count): n less the replica-seconds spent loading
    (new replicas, loads in flight, precision reloads) / T."""
    starting = max(n - p.current, 0)
    lost = starting * min(p.load_s + 15.0, T) + sum(min(x, T) for x in p.loading_left_s)
    lost += min(p.reloads, n) * min(p.load_s, T)
    return max(n - lost / T, 0.0)


def _rate(d: ClassDemand, scenario: str) -> float:
    return max(getattr(d.arrivals_per_s, scenario), 0.0)


def _urgent_share(deadlines_s: tuple[float, ...], T: float) -> float:
    """Share of waiting deferrable work whose deadline falls before the next period ends (0-1)."""
    if not deadlines_s:
        return 0.0
    return sum(1.0 for x in deadlines_s if x <= 2.0 * T) / len(deadlines_s)


def _default_inventory() -> dict[tuple[str, str], int]:
    """GPUs per (site, gpu type) of the operator's default fleet (count)."""
    return {(s.name, str(g.gpu)): s.gpus(g.gpu) for s in default_fleet().sites for g in s.groups}


def market_price(fc: DisturbanceForecast, market: str | None) -> tuple[Interval, bool]:
    """A market's price for the period ($/MWh) and whether it was published: from `fc.other_markets` where the
    forecast carries the market, else the forecast's own price."""
    for m in fc.other_markets:
        if m.market == market:
            return m.price_usd_mwh, m.published
    return fc.price_usd_mwh, fc.price_published


def _default_site_markets() -> dict[str, str]:
    """The market of each site of the operator's default fleet."""
    return {s.name: s.market for s in default_fleet().sites}


def _by_gpu(gpus: Mapping[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, gpu), n in gpus.items():
        out[gpu] = out.get(gpu, 0) + n
    return out
