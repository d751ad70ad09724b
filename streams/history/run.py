"""`aurelius replay --history DIR | --from-topics BOOTSTRAP`: savings on an operator's own history.

Reads and checks the records (`HistoryReport`), derives the fleet and the workload, fits the as-deployed
autoscaler, then replays per seed: the two as-deployed forms (the recorded fleet imposed; the fitted
reactive policy, the savings baseline), the references and the aurelius arms of --policies. Writes the same
OUT/results.json, OUT/replay.duckdb and OUT/audit/ as the bundled replay (through `streams.replay.cli`'s
writers), with `history` (the report, the range, the fit) and `fidelity` (simulated vs recorded) beside the
savings: every arm's gp/$ gain over the fitted as-deployed policy on both cost bases.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from optimizer.wiring import wants_tuning
from schemas.fleet import FleetSpec
from schemas.kafka_client import settings_from_args
from schemas.policy import REFERENCE_POLICIES, History, Policy
from schemas.topics import Topics
from streams.calibration import calibrate
from streams.history import recorded
from streams.history.checks import Records, check
from streams.history.config import HistoryConfig, load_config
from streams.history.fidelity import fidelity_table, print_fidelity, simulated_outcomes
from streams.history.fit import (
    DEFAULT_TARGET,
    FIT_HOURS,
    AutoscalerFit,
    RecordedFleetPolicy,
    Scaling,
    fit_autoscaler,
    fitted_policy,
    refine_target,
)
from streams.history.reader import RawHistory, read_directory, read_topics
from streams.history.report import HistoryReport
from streams.history.savings import daily_gains, per_day
from streams.history.workload import build_history_workload, history, prices_for, replay_range
from streams.replay.cli import (
    BASES,
    _aggregate,
    _audit,
    _audit_store,
    _config,
    _csv,
    _decision_stats,
    _frames,
    _one,
    _physics,
    _reset_tables,
    _store,
    _strongest_reference,
    _tuning_record,
    _window_periods,
    emit_observations,
    print_tables,
)
from streams.replay.driver import RunResult, run_replay
from streams.replay.hindsight import HINDSIGHT, BranchSettings, RegretAudit, g_star, run_hindsight
from streams.replay.metrics import PROVENANCE, request_outcomes, summarize
from streams.replay.ruler import ruler_record
from streams.replay.tuning import TUNE_PERIODS, Tuning, tune_on
from streams.workload.builder import Workload
from worldmodel.groundtruth.runtime import Physics
from worldmodel.transients import AUTOSCALER_STABILIZATION_S

AS_DEPLOYED, IMPOSED = "as-deployed", "as-deployed-imposed"
#: results.json provenance of the figures a history replay adds.
HISTORY_PROVENANCE = {
    "offered": "measured",
    "fidelity.recorded": "measured (the operator's records)",
    "fidelity.simulated": "modeled",
    "history.fit": "fitted to measured replica counts",
}



def _utc(s: str | None) -> datetime | None:
    return None if not s else datetime.fromisoformat(s.replace("Z", "+00:00"))


def read(args: argparse.Namespace, report: HistoryReport) -> RawHistory:
    """The records of --history DIR or --from-topics (the range, and the 7 days before it, when given)."""
    if args.from_topics:
        start, end = _utc(args.history_start), _utc(args.history_end)
        if start is None or end is None:
            raise SystemExit("--from-topics needs --history-start and --history-end (ISO 8601 UTC)")
        topics = Topics(prefix=args.history_topic_prefix)
        return read_topics(args.from_topics, start - timedelta(days=7), end, report, topics, settings_from_args(args))
    return read_directory(args.history, report)


def _market(records: Records, config: HistoryConfig) -> str:
    if config.market:
        return config.market
    markets = records.prices["market"].unique().to_list()
    if len(markets) != 1:
        raise SystemExit(f"set `market` in --history-config: the price records name {markets or 'no market'}")
    return str(markets[0])


def _fit_record(fit: AutoscalerFit | None, report: HistoryReport) -> dict[str, Any] | None:
    if fit is None:
        report.add(
            "fit",
            "skipped",
            "gpu_telemetry",
            0,
            "too few telemetry samples to fit the autoscaler: "
            "as-deployed runs production's defaults (target 0.8, 300 s)",
        )
        return None
    if fit.stabilization_s != AUTOSCALER_STABILIZATION_S:
        report.add(
            "fit",
            "assumed",
            "replay",
            0,
            f"fitted scale-down stabilization {fit.stabilization_s:.0f} s; the "
            f"runtime's autoscaler keeps its {AUTOSCALER_STABILIZATION_S:.0f} s (reported, not applied)",
        )
    return {
        "records_fit": {
            "target": fit.target,
            "stabilization_s": fit.stabilization_s,
            "rmse_replicas": fit.rmse,
            "samples": fit.samples,
            "default_rmse_replicas": fit.default_rmse,
        },
        "refined": {
            "target": fit.refined_target,
            "span_hours": FIT_HOURS,
            "by_target": [{"target": t, **asdict(r)} for t, r in fit.refine_grid],
        },
        "applied": {"target": fit.applied_target, "stabilization_s": AUTOSCALER_STABILIZATION_S},
    }


@dataclass(frozen=True)
class Prepared:
    """Everything the arms share: checked records, range, recorded fleet and spans, prices, history, the fit."""

    records: Records
    config: HistoryConfig
    market: str
    start: datetime
    end: datetime
    spans: recorded.Spans
    fleet: FleetSpec
    prices: pl.DataFrame
    hist: History
    fit: AutoscalerFit | None
    #: the ground truth calibrated to the records (streams/calibration.py): the physics every arm runs on
    physics: Physics
    calibration: dict[str, Any]
    #: production-tuned's configuration, tuned on the records before the range (None: not asked, or no records)
    tuning: Tuning | None = None

    @property
    def initial(self) -> dict[tuple[str, str, str], int]:
        """Replicas per pool at the range start, as recorded."""
        return self.spans.initial()

    def workload(self, seed: int, report: HistoryReport) -> Workload:
        """One seed's workload (`streams.history.workload`)."""
        return build_history_workload(
            self.records, self.config, self.market, self.start, self.end, seed, self.prices, self.hist, report
        )


def prepare(args: argparse.Namespace, config: HistoryConfig, raw: RawHistory, report: HistoryReport) -> Prepared:
    """Check the records and derive what every arm shares; the fit refined on the seed-0 workload."""
    period_s = config.period_minutes * 60.0
    records = check(raw, config, report)
    market = _market(records, config)
    start, end = replay_range(records, period_s, _utc(args.history_start), _utc(args.history_end))
    last = max(f["event_at"].max() for f in (records.telemetry, records.fleet_events, records.completions) if f.height)  # type: ignore[type-var]
    spans = recorded.spans(records, start, max((last - start).total_seconds(), 0.0), report)
    fleet = recorded.fleet(records, config, market, report)
    prices = prices_for(records, market, start - timedelta(days=7), end + timedelta(hours=24), report)
    hist = history(records, start, prices, period_s, report)
    cal = calibrate(records.completions, records.telemetry, records.fleet_events, _physics(args))
    physics = cal.physics(_physics(args), fleet.sites) if getattr(args, "history_calibrate", True) else _physics(args)
    prep = Prepared(records, config, market, start, end, spans, fleet, prices, hist, fit_autoscaler(records, spans),
                    physics, {**cal.as_dict(), "applied": bool(physics.corrections)})
    prep = replace(prep, fit=_refine(prep, args))
    if any(wants_tuning(p) for p in _csv(args.policies)):
        prep = replace(prep, tuning=_tune(prep))
    return prep


def _tune(prep: Prepared) -> Tuning | None:
    """production-tuned's static configuration, searched on the operator's own records of the TUNE_PERIODS
    periods before the replay range (streams/replay/tuning.tune_on; the bundled replay tunes on the week
    before), from the fleet recorded then; None when the records do not reach that far back."""
    period_s = prep.config.period_minutes * 60.0
    past = prep.start - timedelta(seconds=TUNE_PERIODS * period_s)
    first = prep.records.arrivals["event_at"].min() if prep.records.arrivals.height else None
    if first is None or first > past + timedelta(seconds=period_s):  # type: ignore[operator]
        return None  # the records do not reach into the past window's first period
    quiet = HistoryReport()  # the past window's findings repeat the range's
    wl = build_history_workload(prep.records, prep.config, prep.market, past, prep.start, 0, prep.prices, prep.hist,
                                quiet)  # fmt: skip
    initial = recorded.spans(prep.records, past, TUNE_PERIODS * period_s, quiet).initial()
    return tune_on([(wl, initial)], prep.fleet, past, physics=prep.physics, periods=TUNE_PERIODS,
                   period_minutes=prep.config.period_minutes)  # fmt: skip


def _refine(prep: Prepared, args: argparse.Namespace) -> AutoscalerFit | None:
    """The records fit's target refined by replays (see `streams.history.fit`): the whole range with its drain
    when it spans at most `FIT_HOURS`, else its first `FIT_HOURS`, judged on the requests that arrived an hour
    before that stop (later ones may be unfinished at it)."""
    if prep.fit is None:
        return None
    fit = prep.fit
    span_s = (prep.end - prep.start).total_seconds()
    stop_s = None if span_s <= FIT_HOURS * 3600.0 else FIT_HOURS * 3600.0
    judged_s = span_s if stop_s is None else stop_s - 3600.0
    records = prep.records
    if stop_s is not None:
        records = replace(
            records, telemetry=records.telemetry.filter(pl.col("event_at") <= prep.start + timedelta(seconds=stop_s))
        )
    judged = replace(
        records, arrivals=records.arrivals.filter(pl.col("event_at") < prep.start + timedelta(seconds=judged_s))
    )
    rec = recorded.recorded_outcomes(judged, prep.start)
    offered = sum(c.offered for c in rec.classes.values())
    if rec.gpu_hours <= 0 or offered == 0:
        return fit
    target = Scaling(rec.gpu_hours, sum(c.offered * c.violation_rate for c in rec.classes.values()) / offered)
    wl = prep.workload(0, HistoryReport())
    period_s = args.period_minutes * 60.0

    def replay_at(target: float) -> Scaling:
        res = run_replay(
            wl,
            fitted_policy(replace(fit, refined_target=target)),
            prep.fleet,
            period_s=period_s,
            physics=prep.physics,
            initial_replicas=prep.initial,
            stop_at_s=stop_s,
        )
        o = request_outcomes(res)
        met = o["sla_met"][res.runtime.req.arrival < judged_s]
        return Scaling(float(summarize(res)["gpu_hours"]), float(1.0 - met.mean()))

    return refine_target(fit, replay_at, target)


def _as_deployed(prep: Prepared, period_s: float) -> Callable[[], dict[str, Policy]]:
    """A factory of fresh as-deployed policies (one pair per run), the recorded bounds computed once."""
    templates = recorded.pool_templates(prep.fleet, prep.spans)
    recorded_s = max(float(prep.spans.spans["end_s"].max() or 0.0), period_s)  # type: ignore[arg-type]
    bounds = prep.spans.per_period(period_s, math.ceil(recorded_s / period_s))  # past the records: the last held
    target = prep.fit.applied_target if prep.fit else DEFAULT_TARGET
    return lambda: {AS_DEPLOYED: fitted_policy(prep.fit), IMPOSED: RecordedFleetPolicy(templates, bounds, target)}


def _arm(
    name: str, wl: Workload, prep: Prepared, args: argparse.Namespace, own: dict[str, Policy], key: str,
    intercept: Any = None,
) -> RunResult:
    """One arm on one seed's workload: an as-deployed form, else through the bundled replay's `_one`."""
    if name in own:
        return run_replay(
            wl,
            own[name],
            prep.fleet,
            period_s=args.period_minutes * 60.0,
            physics=prep.physics,
            keep_observations=args.emit_observations,
            initial_replicas=prep.initial,
        )
    tuning = prep.tuning if wants_tuning(name) else None
    return _one(wl, name, prep.fleet, args, prep.physics, key, wl.seed, False, tuning, prep.initial,
                intercept=intercept)


def _arms(args: argparse.Namespace, prep: Prepared, report: HistoryReport) -> list[str]:
    """The as-deployed forms first, then --policies, references first (production-tuned skipped, with a report
    entry; production added when --hindsight or --realized-regret need it)."""
    policies = [p for p in _csv(args.policies) if p not in (AS_DEPLOYED, IMPOSED)]
    if "production-tuned" in policies and prep.tuning is None:
        policies.remove("production-tuned")
        report.add("production_tuned", "skipped", "replay", 0, "production-tuned is tuned on the records of the "
                   f"{TUNE_PERIODS} periods before the replay range, and the records hold none that early "
                   "(pass --history-start to keep part of them as the past)")  # fmt: skip
    if (getattr(args, "hindsight", False) or getattr(args, "realized_regret", "")) and "production" not in policies:
        policies.insert(0, "production")  # the branches' continuation and the gate's baseline
    # the references first: g*, the comparison set and the continuation come from their runs (as the bundled replay)
    policies.sort(key=lambda n: n not in REFERENCE_POLICIES)
    return [AS_DEPLOYED, IMPOSED, *policies]


def run(args: argparse.Namespace) -> int:
    """The command (module docstring)."""
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = HistoryReport()
    config = load_config(args.history_config)
    args.period_minutes, args.periods = config.period_minutes, None
    period_s = args.period_minutes * 60.0
    raw = read(args, report)
    prep = prepare(args, config, raw, report)
    fit_rec = _fit_record(prep.fit, report)
    arms = _arms(args, prep, report)
    own_policies = _as_deployed(prep, period_s)
    key = f"{prep.market}@history"
    db = duckdb.connect(str(out / "replay.duckdb"))
    _reset_tables(db)
    audit = _audit_store(out / "audit")
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    simulated = {}
    timing: dict[str, float] = {}
    window_s = (prep.end - prep.start).total_seconds()
    audited = set(_csv(getattr(args, "realized_regret", "") or ""))
    settings = BranchSettings(K=getattr(args, "hindsight_k", 16), H=getattr(args, "branch_h", 2),
                              basis=args.cost_basis)  # fmt: skip
    for seed in (int(s) for s in _csv(args.seeds)):
        wl = prep.workload(seed, report if seed == 0 else HistoryReport())  # the other seeds repeat seed 0's entries
        refs: dict[str, RunResult] = {}
        ref_summaries: dict[str, dict[str, Any]] = {}
        arm_runs: dict[str, RunResult] = {}  # the hindsight arm's lead candidates
        arm_summaries: dict[str, dict[str, Any]] = {}
        for arm in arms:
            own = own_policies()
            audit_ = None
            if arm in audited and arm not in REFERENCE_POLICIES and refs:
                gstar = g_star(ref_summaries, args.cost_basis)[1]
                audit_ = RegretAudit(refs, gstar, period_s, _window_periods(wl, period_s), seed, settings,
                                     floor=getattr(args, "regret_floor", False))
            res = _arm(arm, wl, prep, args, own, key, audit_.intercept if audit_ else None)
            timing[f"{arm}@seed{seed}"] = res.wall_s
            summary = summarize(res)
            if arm in REFERENCE_POLICIES:
                refs[arm], ref_summaries[arm] = res, summary
            summary["seed"] = seed
            summary.update(_decision_stats(res, period_s))
            summary["per_day"] = per_day(res, window_s)
            if audit_ is not None:
                audit_.attach(res)
                summary["realized_regret"] = audit_.stats()
            runs[arm].append(summary)
            if getattr(args, "hindsight", False):
                arm_runs[arm], arm_summaries[arm] = res, summary
            if seed == 0 and arm in own:
                simulated[arm] = simulated_outcomes(res, summary["gpu_hours"])
            if args.emit_observations and res.observations is not None:
                emit_observations(out / "observations" / key / arm / f"seed{seed}", res)
            _store(db, _frames(res, key))
            _audit(audit, res.decisions, seed)
        if getattr(args, "hindsight", False) and refs:
            gstar = g_star(ref_summaries, args.cost_basis)[1]
            lead = g_star(arm_summaries, args.cost_basis)[0]  # the strongest run, a replayed arm included
            res, choices = run_hindsight(wl, prep.fleet, {**refs, lead: arm_runs[lead]}, gstar,
                                         period_s=period_s, physics=prep.physics, initial_replicas=prep.initial,
                                         settings=settings, start_from=lead)  # fmt: skip
            summary = summarize(res)
            summary.update(seed=seed, **_decision_stats(res, period_s), per_day=per_day(res, window_s))
            summary["hindsight"] = {"oracle": True, "deployable": False, **settings.describe(), "g_star": gstar,
                                    "lead": lead, "choices": choices}  # fmt: skip
            runs.setdefault(HINDSIGHT, []).append(summary)
            _store(db, _frames(res, key))
    db.close()
    window = {
        "start": prep.start.isoformat(),
        "end": prep.end.isoformat(),
        "rule": "history",
        "mean_price_usd_mwh": wl.window.mean_price_usd_mwh,
        "market": prep.market,
    }
    market_rec: dict[str, Any] = {"window": window, "policies": {a: _aggregate(v) for a, v in runs.items()}}
    _strongest_reference(market_rec)
    base = market_rec["policies"][AS_DEPLOYED]
    market_rec["gain_vs_as_deployed"] = {
        a: {b: (p[k] - base[k]) / base[k] for b, k in BASES.items()}
        for a, p in market_rec["policies"].items()
        if a != AS_DEPLOYED
    }
    market_rec["per_day"] = daily_gains(runs, AS_DEPLOYED)
    fidelity = fidelity_table(recorded.recorded_outcomes(prep.records, prep.start, prep.end), simulated)
    results = {
        "schema_version": "1",
        "config": _config(args, prep.physics),
        "ruler": ruler_record(prep.physics),
        "markets": {key: market_rec},
        "provenance": {**PROVENANCE, **HISTORY_PROVENANCE},
        "history": {
            "report": report.as_dict(),
            "range": window,
            "fleet": _fleet_record(prep.fleet),
            "initial_replicas": {"|".join(k): v for k, v in prep.initial.items()},
            "fit": fit_rec,
            "calibration": prep.calibration,
            "production_tuned": _tuning_record(prep.tuning) if prep.tuning is not None else None,
            "records": raw.records,
            "read_s": raw.read_s,
            "replay_wall_s": timing,
            "total_s": time.perf_counter() - t0,
        },
        "fidelity": fidelity,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    _print(results, report, fidelity, args.cost_basis)
    print(f"\nwrote {out / 'results.json'}, {out / 'replay.duckdb'} and {out / 'audit'}")
    if getattr(args, "report", False):
        from streams.report.page import build  # lazy, as in the bundled replay: altair loads only when asked

        print(f"wrote {build(out)} and figures under {out / 'report' / 'figures'}")
    return 0


def _fleet_record(fleet: FleetSpec) -> list[dict[str, Any]]:
    return [
        {
            "site": s.name,
            "market": s.market,
            "power_cap_w": s.power_cap_w,
            "nodes": {str(g.gpu): g.nodes for g in s.groups},
        }
        for s in fleet.sites
    ]


def _print(results: dict[str, Any], report: HistoryReport, fidelity: dict[str, Any], basis: str) -> None:
    h = results["history"]
    print(
        f"history: {h['records']} records read in {h['read_s']:.2f} s; range {h['range']['start']} .. "
        f"{h['range']['end']}"
    )
    for line in report.lines():
        print("  " + line)
    if h["fit"]:
        f, r = h["fit"]["records_fit"], h["fit"]["refined"]
        print(
            f"fitted autoscaler: records fit target {f['target']:.2f}, stabilization {f['stabilization_s']:.0f} s "
            f"(rmse {f['rmse_replicas']:.2f} replicas over {f['samples']} samples; "
            f"defaults {f['default_rmse_replicas']:.2f})"
            + (
                f"; refined on up to {r['span_hours']:.0f} h of replays: target {r['target']:.3f} "
                f"(GPU-hours and violation rate of {len(r['by_target'])} replayed targets)"
                if r["target"] is not None
                else ""
            )
        )
    print_fidelity(fidelity)
    print_tables(results, basis)
    for m in results["markets"].values():
        gains = ", ".join(
            f"{a} {g['rented']:+.2%} rented / {g['owned']:+.2%} owned" for a, g in m["gain_vs_as_deployed"].items()
        )
        print(f"gain over as-deployed (gp/$): {gains}")
        if len(m["per_day"][AS_DEPLOYED]) > 1:
            for arm, days in m["per_day"].items():
                cells = ", ".join(f"{d['day']} {d['gain_vs_as_deployed']['rented']:+.2%}" for d in days)
                print(f"  per day, {arm} (rented): {cells}")
    if not fidelity["within_bounds"]:
        print("WARNING: the as-deployed replay is outside the fidelity bounds; read the savings with the table above")
