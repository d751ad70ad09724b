"""The planner's forward model: advance a frozen snapshot one control period under a candidate plan.

A queueing approximation with batching, not a per-request simulation. This module composes the steps, each
in its module: the offered load and deferred work (worldmodel/demand.py), 1 (placement.py, transients.py), 2-3 and
the GPU power of 5 (queueing.py), the class tails of 3-4 (outcomes.py), the rest of 5 (period_cost.py). Per pool
(model x GPU type x site):

1. replicas: the autoscaler's count ceil(lambda / (target x mu_r)) clamped to [floor, ceiling]
   (the floor when autoscaling is off); replicas more than 10% above the need go once the 300 s
   stabilization window, run from the last scale-up's end, allows (transients.py); new replicas and
   precision reloads hold their GPUs for the load time while serving nothing (a reload takes the whole pool
   at once, as the runtime does, so what arrives meanwhile queues);
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
   node hosting a replica (the nodes the snapshot's GPUs sit on, grown first fit: `period_cost._nodes_on`;
   before, GPUs / 8 rounded up, 8-13 % under the observed energy once scale-downs left nodes part-used), idle
   GPUs of the site at idle, x PUE; cost through schemas/cost.py at the forecast (or published) price.

The spread comes from re-evaluating at the forecast's 80 % and 95 % demand bounds (and the price's upper
bound when unpublished): violation_rate_hi is the 95 %-demand violation, gp_per_dollar_lo the worst scenario.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from schemas import cost
from schemas.fleet import default_fleet
from schemas.forecast import ClassDemand, ClassOutcome, DisturbanceForecast, PredictedOutcome
from schemas.plan import Plan
from schemas.protocol import PROTOCOL_V1, Protocol
from worldmodel.demand import model_load, scenario_rate
from worldmodel.outcomes import Scenario, class_outcome
from worldmodel.period_cost import account_period, default_site_markets
from worldmodel.placement import place, serving_replicas
from worldmodel.queueing import Load, Pool, PoolResult, mu_replica, pool_static, serve_pool, util_per_request
from worldmodel.servingmodel import Corrections, ServingModel
from worldmodel.snapshot import FleetSnapshot

_SCENARIOS = ("point", "lo80", "hi80", "hi95")


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
        self.inventory = dict(inventory) if inventory is not None else default_fleet().inventory()
        self.unobserved_precision_risk = unobserved_precision_risk
        self.site_markets = dict(site_markets) if site_markets is not None else default_site_markets()
        self._serving_models: dict[int, tuple[Corrections, ServingModel]] = {}

    def evaluate(self, snapshot: FleetSnapshot, plan: Plan, forecast: DisturbanceForecast,
                 scenarios: tuple[str, ...] = _SCENARIOS) -> PredictedOutcome:
        """Predict one period's outcome of `plan` from `snapshot` under `forecast` (pure: reads only).

        Parameters
        ----------
        snapshot : frozen state at the period start.
        plan : the candidate plan.
        forecast : disturbances of the period (arrival rates with intervals, sizes, price).
        scenarios : the demand scenarios evaluated ("point" first; ("point",) alone: no spread, the point
            figures stand for the bounds, as the horizon's later steps use it).

        Returns
        -------
        PredictedOutcome at the point forecast, with violation_rate_hi and gp_per_dollar_lo from the bounds.
        """
        sm = self._serving(snapshot.corrections)
        period_s = forecast.period_s
        pools = [pool_static(sm, snapshot, p) for p in plan.pools]
        # optionally the upper scenarios credit no gain to a precision never observed (a risk band for unseen
        # configurations); off by default: on PJM it moved the first plan to bf16 and invited a costly reload
        hi_corr = snapshot.corrections.pessimistic() if self.unobserved_precision_risk else snapshot.corrections
        sm_hi = self._serving(hi_corr)
        results = {
            s: self._scenario(sm_hi if s in ("hi80", "hi95") else sm, snapshot, plan, forecast, pools, s)
            for s in scenarios
        }
        point = results["point"]
        hi = results.get("hi95", point)
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
            pool_replicas=dict(point.replicas),
        )

    def _serving(self, corrections: Corrections) -> ServingModel:
        """The serving model with `corrections`, one per corrections object (a decision's candidates and horizon
        steps share their snapshot's, so the serving model's memo of correction factors is shared too)."""
        hit = self._serving_models.get(id(corrections))
        if hit is None or hit[0] is not corrections:  # the object is held, so its id is not reused meanwhile
            if len(self._serving_models) >= 8:
                self._serving_models.clear()
            hit = (corrections, self.serving_model.with_corrections(corrections))
            self._serving_models[id(corrections)] = hit
        return hit[1]

    def _scenario(
        self,
        sm: ServingModel,
        snap: FleetSnapshot,
        plan: Plan,
        fc: DisturbanceForecast,
        pools: list[Pool],
        scenario: str,
    ) -> Scenario:
        """One demand scenario's outcome: per model its load and pools served, per class its outcome, then the
        period's energy and cost."""
        T = fc.period_s
        hi = scenario in ("hi80", "hi95")
        cv = snap.corrections.step_cv
        cvs = (cv, cv * snap.risk_band) if hi else (cv,)  # the band widens the spread, pessimistically
        out = Scenario()
        by_model: dict[str, list[ClassDemand]] = {}
        for p in pools:  # placement order: the plan's pools (the runtime starts replicas in this order)
            by_model.setdefault(p.plan.model, [])
        for d in fc.demand:
            by_model.setdefault(d.model, []).append(d)
        power_w: dict[str, float] = {}  # per site (W)
        gpus_used: dict[tuple[str, str], float] = {}
        gpu_hours: dict[str, float] = {}
        free: dict[tuple[str, str], float] = {k: float(v) for k, v in self.inventory.items()}
        served: dict[str, tuple[Load, list[PoolResult], float, tuple[float, float, float]]] = {}
        reloading: dict[str, float] = {}
        for model, demands in by_model.items():
            mpools = [p for p in pools if p.plan.model == model]
            if not mpools:
                continue
            load, batch_info = model_load(self.protocol, snap, plan, fc, demands, scenario, mpools, sm)
            res = _serve_model(sm, plan, mpools, load, T, free)
            out.cold_starts += sum(max(math.ceil(r.replicas) - p.current, 0) for p, r in zip(mpools, res, strict=True))
            served[model] = (load, res, sum(r.mu for r in res), batch_info)
            # share of the model's replicas a precision change reloads (0-1): their in-flight work is requeued
            reloading[model] = min(sum(p.reloads for p in mpools) / max(sum(p.current for p in mpools), 1), 1.0)
            for p, r in zip(mpools, res, strict=True):
                power_w[p.plan.site] = power_w.get(p.plan.site, 0.0) + r.power_w
                key = (p.plan.site, p.plan.gpu)
                gpus_used[key] = gpus_used.get(key, 0.0) + r.replicas * p.plan.tp
                gpu_hours[p.plan.gpu] = gpu_hours.get(p.plan.gpu, 0.0) + r.replicas * p.plan.tp * T / 3600.0
                out.replicas[p.plan.key] = r.replicas
        for d in fc.demand:  # class outcomes in the forecast's order
            load, res, mu, batch_info = served.get(d.model, (Load(0, 0, 0, 0, 0, 0), [], 0.0, (0.0, 0.0, 0.0)))
            queue = snap.queue(d.request_class)
            class_outcome(
                out,
                self.protocol.spec(d.request_class),
                d,
                scenario_rate(d, scenario),
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
        account_period(
            out, sm, snap, fc, scenario, power_w, gpus_used, gpu_hours, self.cost_config, self.site_markets,
            self.idle_power,
        )
        return out


def _serve_model(
    sm: ServingModel,
    plan: Plan,
    pools: list[Pool],
    load: Load,
    T: float,
    free: dict[tuple[str, str], float],
) -> list[PoolResult]:
    """One model's pools over a period of `T` s: replicas placed (drawing down `free` GPUs), the model's
    arrivals and backlog split by serving capacity, each pool served."""
    lam = load.lam_i + load.lam_b
    mus = [mu_replica(sm, p, load) for p in pools]
    util_s = util_per_request(sm, pools[0], load) if pools else 0.0
    counts = place(plan, pools, mus, lam, free, util_s, T)
    # the router sends work to warm replicas only: a pool's share follows its serving capacity
    serving = [serving_replicas(p, n, T) for p, n in zip(pools, counts, strict=True)]
    weights = [m * s for m, s in zip(mus, serving, strict=True)]
    total = sum(weights)
    return [
        serve_pool(
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
