"""`aurelius replay`: every policy on the bundled data, embedded, no broker.

Writes OUT/results.json (per market and policy, mean over seeds with each seed kept), OUT/replay.duckdb
(per-period and per-class aggregates, per-request outcomes with their SLA flag), the decision records of
policies that keep them (the aurelius arms) as the Parquet audit log under OUT/audit/ (query with
`aurelius audit sql "SELECT ..." --audit-dir OUT/audit`) and, with --emit-observations, the observation
stream as Parquet under OUT/observations/.

Replay audit ids: sha256("policy|markets|period_start") as live decisions, with the workload seed appended to
the policy ("aurelius@seed1") so the seeds of one replay keep one row each; the live id stays in the record.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import multiprocessing
import re
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from optimizer.wiring import build_policy, wants_tuning
from schemas.audit import decision_id
from schemas.fleet import default_fleet
from schemas.policy import REFERENCE_POLICIES
from schemas.protocol import CLASSES
from sinks.audit_store import FILE_GLOB, ParquetAuditStore
from streams.replay import memo
from streams.replay.branching import DEFAULT_REPLICATES, arrival_periods
from streams.replay.driver import RunResult, run_replay
from streams.replay.hindsight import (
    HINDSIGHT,
    BranchSettings,
    RegretAudit,
    g_star,
    hindsight_check,
    refused_summary,
    regret_summary,
    run_hindsight,
)
from streams.replay.metrics import PROVENANCE, per_period, request_outcomes, summarize
from streams.replay.ruler import ruler_record
from streams.replay.tuning import TUNE_DRAWS, Tuning
from streams.replay.warmup import COMPILE_ESTIMATE_S, compile_simulator, compiled
from streams.workload.builder import Workload, build_workload
from streams.workload.residency import with_residency
from worldmodel.groundtruth.runtime import Physics


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    markets = _csv(args.markets)
    years = [int(y) for y in _csv(args.years)] if args.years else [args.year]
    seeds = [int(s) for s in _csv(args.seeds)]
    policies = _csv(args.policies)
    _check_branching(args, policies)
    arms = policies + ([HINDSIGHT] if getattr(args, "hindsight", False) else [])
    physics = _physics(args)
    results: dict[str, Any] = {
        "schema_version": "1",
        "config": _config(args, physics),
        "ruler": ruler_record(physics),
        "markets": {},
        "provenance": PROVENANCE,
    }
    # one site per market, or the three-site mode: one shared workload (the first market's window) at every site
    scenarios = [(m, m, False) for m in markets] if args.sites == "one" else [("three-site", markets[0], True)]
    jobs = [
        Job(name if len(years) == 1 else f"{name}@{year}", market, all_sites, year, seed, tuple(policies))
        for year in years
        for name, market, all_sites in scenarios
        for seed in seeds
    ]
    db = duckdb.connect(str(out / "replay.duckdb"))
    _reset_tables(db)
    audit = _audit_store(out / "audit")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    windows: dict[str, dict[str, Any]] = {}
    if not compiled():  # a fresh clone or changed simulator sources: compile once, here, before any worker
        print(f"compiling the simulator, once, ~{COMPILE_ESTIMATE_S} s (later runs load it from the cache) ...",
              file=sys.stderr, flush=True)  # fmt: skip
        took = compile_simulator(jobs[0].market, jobs[0].year)
        print(f"compiled the simulator in {took:.0f} s", file=sys.stderr, flush=True)
    # one bar for the whole replay (worker processes print nothing): finished steps, and what runs now
    bar = tqdm(total=len(jobs), desc="replay", unit="step", disable=args.no_progress)
    with logging_redirect_tqdm():  # warnings (ours and the workers') print above the bar
        for job, outcomes in _execute(jobs, args, None if args.no_progress else bar):
            for o in outcomes:
                windows[job.key] = o.window
                runs.setdefault(job.key, {p: [] for p in arms})[o.policy].append(o.summary)
                _store(db, o.frames)
                _audit(audit, o.decisions, job.seed)
    bar.close()
    db.close()
    for key, per_policy in runs.items():
        results["markets"][key] = {
            "window": windows[key],
            "policies": {p: _aggregate(v) for p, v in per_policy.items()},
        }
        _oracle_gap(results["markets"][key])
        _strongest_reference(results["markets"][key])
        _hindsight_flags(results["markets"][key])
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print_tables(results, args.cost_basis)
    print(f"\nwrote {out / 'results.json'} and {out / 'replay.duckdb'}")
    if getattr(args, "report", False):
        # lazy: altair and vl-convert load only when a report is asked for, not on every replay
        from streams.report.page import build

        print(f"wrote {build(out)} and figures under {out / 'report' / 'figures'}")
    return 0


@dataclass(frozen=True)
class Job:
    """One workload (market or three-site scenario, year, seed) replayed under every policy."""

    key: str
    market: str
    all_sites: bool
    year: int
    seed: int
    policies: tuple[str, ...]


@dataclass
class Outcome:
    """What a job hands back per policy: results.json figures, DuckDB frames, decision records."""

    policy: str
    summary: dict[str, Any]
    frames: tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]
    decisions: list[dict[str, Any]]
    window: dict[str, Any]


def _execute(jobs: list[Job], args: argparse.Namespace, bar: Any = None) -> Iterator[tuple[Job, list[Outcome]]]:
    """Run the jobs, in job order; with --jobs > 1 as a graph of smaller tasks in worker processes.

    A job is split into its lead-in (the fleet at window start), the tuning on the week before (production-
    tuned's configuration, whose precision the aurelius arms take), and one replay per policy (after the
    lead-in, and the tuning for the policies that read it), so that two
    workers share three markets evenly. Every task is a deterministic function of its inputs: the figures
    are the same in any order, with any number of workers. With branching (--hindsight, --realized-regret)
    whole jobs run per worker: a job's branches need its reference runs in memory. `bar` counts finished
    tasks."""
    tasks = {(i, kind, p) for i, job in enumerate(jobs) for kind, p in _task_kinds(job)}
    n = min(max(1, args.jobs), len(tasks))
    if bar is not None:
        bar.reset(total=len(tasks))
    if n == 1:
        for job in jobs:
            yield job, run_job(job, args, bar)
        return
    ctx = multiprocessing.get_context("spawn")
    if _branching(args):  # branches need a job's reference runs in the process that runs its other arms
        with ProcessPoolExecutor(max_workers=min(n, len(jobs)), mp_context=ctx) as pool:
            futures = [pool.submit(run_job, job, args) for job in jobs]
            for job, fut in zip(jobs, futures, strict=True):
                res = fut.result()
                if bar is not None:
                    bar.update(len(_task_kinds(job)))
                yield job, res
        return
    logs = ctx.Queue()  # workers' log records, printed here once each (a bar line is never broken by them)
    listener = logging.handlers.QueueListener(logs, _ParentLog())
    listener.start()
    try:
        yield from _run_graph(jobs, args, bar, tasks, n, ctx, logs)
    finally:
        listener.stop()


class _ParentLog(logging.Handler):
    """Hands a worker's record to this process's loggers, each distinct message once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() not in self.seen:
            self.seen.add(record.getMessage())
            logging.getLogger(record.name).handle(record)


def _worker_init(logs: Any) -> None:
    root = logging.getLogger()
    root.handlers = [logging.handlers.QueueHandler(logs)]
    root.setLevel(logging.WARNING)


def _run_graph(
    jobs: list[Job],
    args: argparse.Namespace,
    bar: Any,
    tasks: set[tuple[int, str, str]],
    n: int,
    ctx: Any,
    logs: Any,
) -> Iterator[tuple[Job, list[Outcome]]]:
    done: dict[tuple[int, str, str], Any] = {}
    outcomes: dict[int, dict[str, Outcome]] = {i: {} for i in range(len(jobs))}
    running: dict[Any, tuple[int, str, str]] = {}
    emitted = 0
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=_worker_init, initargs=(logs,)) as pool:
        while tasks or running:
            for t in sorted(tasks, key=_priority):
                if len(running) >= n:
                    break
                i, kind, p = t
                job = jobs[i]
                if kind == "lead":
                    fut = pool.submit(_lead_task, job, args)
                elif kind == "tune":
                    fut = pool.submit(_tune_task, job, args)
                else:
                    deps = [(i, "lead", "")] + ([(i, "tune", "")] if wants_tuning(p) else [])
                    if any(d not in done for d in deps):
                        continue
                    tuning = done.get((i, "tune", ""))
                    fut = pool.submit(_replay_task, job, p, args, done[(i, "lead", "")], tuning)
                tasks.discard(t)
                running[fut] = t
            if bar is not None:
                bar.set_postfix_str(", ".join(_label(jobs[i], k, p) for i, k, p in sorted(running.values())))
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                i, kind, p = running.pop(fut)
                if kind == "replay":
                    outcomes[i][p] = fut.result()
                else:
                    done[(i, kind, "")] = fut.result()
                if bar is not None:
                    bar.update(1)
            while emitted < len(jobs) and len(outcomes[emitted]) == len(jobs[emitted].policies):
                job = jobs[emitted]
                tuning = done.get((emitted, "tune", ""))
                res = [outcomes[emitted][p] for p in job.policies]
                if tuning is not None:  # the tuning rides with every outcome's window, as run_job puts it
                    for o in res:
                        o.window["production_tuned"] = _tuning_record(tuning)
                yield job, res
                outcomes[emitted] = {}
                emitted += 1


def _branching(args: argparse.Namespace) -> bool:
    """Whether the replay branches on the ground truth (--hindsight, --realized-regret)."""
    return bool(getattr(args, "hindsight", False) or getattr(args, "realized_regret", ""))


def _task_kinds(job: Job) -> list[tuple[str, str]]:
    tune = [("tune", "")] if any(wants_tuning(p) for p in job.policies) else []
    return [("lead", ""), *tune, *(("replay", p) for p in job.policies)]


def _priority(t: tuple[int, str, str]) -> tuple[int, int]:
    """Lead-ins first (they unlock the replays), then tunings, then replays, each in job order."""
    i, kind, _ = t
    return ({"lead": 0, "tune": 1, "replay": 2}[kind], i)


def _label(job: Job, kind: str, policy: str) -> str:
    return f"{job.key} seed {job.seed} {policy or kind}"


def _lead_task(job: Job, args: argparse.Namespace) -> dict[tuple[str, str, str], int]:
    return _lead(job, args, _workload(job, args).window.start)


def _tune_task(job: Job, args: argparse.Namespace) -> Tuning:
    return _tune(job, args, _workload(job, args).window.start)


def _lead(job: Job, args: argparse.Namespace, start: datetime) -> dict[tuple[str, str, str], int]:
    """The fleet at the window's start (`memo.lead_in`: from the cache where an earlier run measured it)."""
    return memo.lead_in(job.market, start, default_fleet(tuple(_csv(args.markets))), seed=job.seed,
                        physics=_physics(args), all_sites=job.all_sites, cached=_cached(args))


def _tune(job: Job, args: argparse.Namespace, start: datetime) -> Tuning:
    """The week-before search (`memo.tuning`: from the cache where an earlier run measured it)."""
    return memo.tuning(job.market, start, default_fleet(tuple(_csv(args.markets))), seed=job.seed,
                       physics=_physics(args), period_minutes=args.period_minutes, draws=_draws(args),
                       all_sites=job.all_sites, cached=_cached(args))


def _cached(args: argparse.Namespace) -> bool:
    """Whether the week before may be read from the cache (not `--no-cache`)."""
    return not getattr(args, "no_cache", False)


def _draws(args: argparse.Namespace) -> int:
    """Draws of the week before the search pools (`--tune-draws`, >= 1; None: `TUNE_DRAWS`)."""
    n = getattr(args, "tune_draws", None)
    n = TUNE_DRAWS if n is None else int(n)
    if n < 1:
        raise SystemExit(f"--tune-draws must be at least 1, got {n}")
    return n


def _replay_task(
    job: Job,
    policy: str,
    args: argparse.Namespace,
    initial: dict[tuple[str, str, str], int],
    tuning: Tuning | None,
) -> Outcome:
    wl = _workload(job, args)
    fleet = default_fleet(tuple(_csv(args.markets)))
    return _outcome(job, policy, wl, fleet, args, _physics(args), initial, tuning, _window(job, wl, None), None)


_WORKLOADS: dict[tuple[Any, ...], Workload] = {}


def _workload(job: Job, args: argparse.Namespace) -> Workload:
    """The job's workload (with residency in the three-site mode); a worker keeps its last three."""
    key = (job, args.window_rule, args.start, args.periods, args.period_minutes, args.source)
    if key not in _WORKLOADS:
        wl = build_workload(
            job.market,
            job.year,
            rule=args.window_rule,
            start=datetime.fromisoformat(args.start) if args.start else None,
            periods=args.periods,
            period_minutes=args.period_minutes,
            seed=job.seed,
            source=args.source,
        )
        if job.all_sites:
            wl = with_residency(wl, default_fleet(tuple(_csv(args.markets))), job.market, seed=job.seed)
        while len(_WORKLOADS) >= 3:
            _WORKLOADS.pop(next(iter(_WORKLOADS)))
        _WORKLOADS[key] = wl
    return _WORKLOADS[key]


def _window(job: Job, wl: Workload, tuning: Tuning | None) -> dict[str, Any]:
    w = wl.window
    window = {"start": w.start.isoformat(), "end": w.end.isoformat(), "mean_price_usd_mwh": w.mean_price_usd_mwh,
              "rule": w.rule, "year": job.year}  # fmt: skip
    if tuning is not None:
        window["production_tuned"] = _tuning_record(tuning)
    return window


def _tuning_record(tuning: Tuning) -> dict[str, Any]:
    return {"config": tuning.config.as_dict(), "tuned_on": tuning.window_start.isoformat(), "candidates": tuning.table}


def run_job(job: Job, args: argparse.Namespace, bar: Any = None) -> list[Outcome]:
    """Build the job's workload and replay it under each policy (in this process)."""
    physics = _physics(args)
    fleet = default_fleet(tuple(_csv(args.markets)))
    wl = _workload(job, args)
    tuning = None
    if any(wants_tuning(p) for p in job.policies):
        tuning = _tune(job, args, wl.window.start)
        _tick(bar)
    window = _window(job, wl, tuning)
    initial = _lead(job, args, wl.window.start)
    _tick(bar)
    outcomes = []
    audited = set(_csv(getattr(args, "realized_regret", "") or ""))
    hindsight = bool(getattr(args, "hindsight", False))
    settings = BranchSettings(K=getattr(args, "hindsight_k", 16), H=getattr(args, "branch_h", 2),
                              replicates=_replicates(args),
                              basis=args.cost_basis)  # fmt: skip
    period_s = args.period_minutes * 60.0
    # the references first: g*, the comparison set and the continuation come from their runs
    order = sorted(job.policies, key=lambda n: n not in REFERENCE_POLICIES)
    refs: dict[str, RunResult] = {}
    runs: dict[str, RunResult] = {}
    summaries: dict[str, dict[str, Any]] = {}
    gstar = 0.0
    for name in order:
        audit = None
        if name in audited and name not in REFERENCE_POLICIES:
            audit = RegretAudit(refs, gstar, period_s, _window_periods(wl, period_s), job.seed, settings,
                                floor=getattr(args, "regret_floor", False))
        res = _one(wl, name, fleet, args, physics, job.key, job.seed, job.all_sites, tuning,
                   initial, intercept=audit.intercept if audit else None)  # fmt: skip
        summary = summarize(res)
        summary["seed"] = job.seed
        summary.update(_decision_stats(res, args.period_minutes * 60.0))
        if name in REFERENCE_POLICIES:
            refs[name] = res
            summaries[name] = summary
            last = all(r in refs for r in REFERENCE_POLICIES if r in job.policies)
            if (audited or hindsight) and last:
                strongest, gstar = g_star(summaries, args.cost_basis)
                window["g_star"] = {"reference": strongest, "gp_per_dollar": gstar, "cost_basis": args.cost_basis}
        summaries[name] = summary
        if hindsight:
            runs[name] = res
        if args.emit_observations and res.observations is not None:
            emit_observations(Path(args.out) / "observations" / job.key / name / f"seed{job.seed}", res)
        if audit is not None:
            audit.attach(res)
            summary["realized_regret"] = audit.stats()
        outcomes.append(Outcome(name, summary, _frames(res, job.key), res.decisions, window))
        _tick(bar)
    for name in [n for n in order if n in audited and n in REFERENCE_POLICIES]:  # a reference audited: run it again
        audit = RegretAudit(refs, gstar, period_s, _window_periods(wl, period_s), job.seed, settings,
                            floor=getattr(args, "regret_floor", False))
        res = _one(wl, name, fleet, args, physics, job.key, job.seed, job.all_sites, tuning,
                   initial, intercept=audit.intercept)  # fmt: skip
        next(o for o in outcomes if o.policy == name).summary["realized_regret"] = audit.stats()
    if hindsight:
        lead = g_star(summaries, args.cost_basis)[0]  # the strongest run of the job, a replayed arm included
        res, choices = run_hindsight(wl, fleet, {**refs, lead: runs[lead]}, gstar, period_s=period_s,
                                     physics=physics, all_sites=job.all_sites, initial_replicas=initial,
                                     settings=settings, start_from=lead)  # fmt: skip
        summary = summarize(res)
        summary["seed"] = job.seed
        summary.update(_decision_stats(res, args.period_minutes * 60.0))
        summaries[HINDSIGHT] = summary
        summary["hindsight"] = {"oracle": True, "deployable": False, **settings.describe(), "g_star": gstar,
                                "lead": lead, "drain": "branched as the window's periods are, on the requests "
                                "open at each fork (before 2026-12-05: the lead's plans replayed)",
                                "check": hindsight_check(summaries, args.cost_basis),
                                "choices": choices}  # fmt: skip
        outcomes.append(Outcome(HINDSIGHT, summary, _frames(res, job.key), [], window))
    return outcomes


def _window_periods(wl: Workload, period_s: float) -> int:
    """Periods that receive arrivals (the decisions the regret audit samples from)."""
    return arrival_periods(wl.requests["arrival_s"].to_numpy(), period_s)


def _pooled_regret(audits: list[dict[str, Any]]) -> dict[str, Any]:
    """regret_summary over several runs' audited decisions."""
    return regret_summary([v for a in audits for v in a.get("values", [])],
                          [v for a in audits for v in a.get("gap_per_request", {}).get("values", [])])  # fmt: skip


def _replicates(args: argparse.Namespace) -> int:
    """Noise replicates per branch: --branch-replicates, else the ruler's default."""
    r = getattr(args, "branch_replicates", None)
    return DEFAULT_REPLICATES if r is None else int(r)


def _check_branching(args: argparse.Namespace, policies: list[str]) -> None:
    """The branching flags need production (the continuation); the hindsight arm is no policy."""
    if HINDSIGHT in policies:
        raise SystemExit("hindsight is an oracle arm, not a policy: use --hindsight, not --policies")
    audited = _csv(getattr(args, "realized_regret", "") or "")
    if (getattr(args, "hindsight", False) or audited) and "production" not in policies:
        raise SystemExit("--hindsight and --realized-regret need production among --policies (the continuation)")
    unknown = [p for p in audited if p not in policies]
    if unknown:
        raise SystemExit(f"--realized-regret names policies not replayed: {unknown}")
    if getattr(args, "regret_floor", False) and not audited:
        raise SystemExit("--regret-floor measures the floor of --realized-regret: name the audited policies there")
    if getattr(args, "hindsight", False) and args.hindsight_k < 16:
        raise SystemExit("--hindsight-k must be at least 16")
    if _replicates(args) < 0:
        raise SystemExit("--branch-replicates must be 0 (the realization alone) or more")


def _tick(bar: Any) -> None:
    if bar is not None:
        bar.update(1)


def _outcome(
    job: Job,
    name: str,
    wl: Workload,
    fleet: Any,
    args: argparse.Namespace,
    physics: Physics,
    initial: dict[tuple[str, str, str], int],
    tuning: Tuning | None,
    window: dict[str, Any],
    bar: Any,
) -> Outcome:
    """Replay one policy on the job's workload; its results.json figures, DuckDB frames and decisions."""
    if bar is not None:
        bar.set_postfix_str(_label(job, "replay", name))
    res = _one(wl, name, fleet, args, physics, job.key, job.seed, job.all_sites, tuning, initial)
    summary = summarize(res)
    summary["seed"] = job.seed
    summary.update(_decision_stats(res, args.period_minutes * 60.0))
    if args.emit_observations and res.observations is not None:
        emit_observations(Path(args.out) / "observations" / job.key / name / f"seed{job.seed}", res)
    return Outcome(name, summary, _frames(res, job.key), res.decisions, window)


def _physics(args: argparse.Namespace) -> Physics:
    return Physics(
        fp8_speedup_scale=args.fp8_speedup_scale,
        scaler_trigger=getattr(args, "scaler_trigger", "v1"),
        decode_power_fit=getattr(args, "decode_power_fit", "record"),
        **({"clock_power_exponent": args.clock_power_exponent} if args.clock_power_exponent else {}),
        cold_start_s=getattr(args, "cold_start_s", None),
    )


def _one(
    wl: Workload,
    name: str,
    fleet: Any,
    args: argparse.Namespace,
    physics: Physics,
    key: str,
    seed: int,
    all_sites: bool,
    tuning: Tuning | None,
    initial: dict[tuple[str, str, str], int],
    intercept: Any = None,
) -> RunResult:
    """One replay; production-tuned runs the configuration measured best on the week before (`tuning`), the
    aurelius arms take its precision and its clock measurements (optimizer/wiring.build_policy)."""
    policy = build_policy(name, wl, seed, period_s=args.period_minutes * 60.0, window_periods=args.periods,
                          tuned=tuning and tuning.config, clock=tuning and tuning.clock, cost_basis=args.cost_basis,
                          all_sites=all_sites)
    return run_replay(
        wl,
        policy,
        fleet,
        period_s=args.period_minutes * 60.0,
        physics=physics,
        keep_observations=args.emit_observations,
        all_sites=all_sites,
        initial_replicas=initial,
        intercept=intercept,
    )


def _audit_store(directory: Path) -> Any:
    """A fresh Parquet audit log under OUT/audit (files of an earlier replay into the same OUT removed)."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in directory.glob(FILE_GLOB):
        f.unlink()
    return ParquetAuditStore(directory)


def _audit(store: Any, decisions: list[dict[str, Any]], seed: int) -> None:
    """Write one run's decision records to the audit log (one flush per run)."""
    for rec in decisions:
        at = datetime.fromisoformat(str(rec["period_start"]).replace("Z", "+00:00"))
        row = dict(
            rec,
            live_decision_id=rec["decision_id"],
            seed=seed,
            decision_id=decision_id(f"{rec['policy']}@seed{seed}", rec["markets"], at),
        )
        store.add(row)
    store.flush()


def _decision_stats(res: RunResult, period_s: float) -> dict[str, Any]:
    recs = res.decisions
    # the decision's own latency (observe -> decide, the regret audit excluded) where the policy records it
    own = [r["decision_ms"] for r in recs if r.get("decision_ms") is not None]
    ms = own if own and len(own) == len(res.decision_ms) else res.decision_ms
    cpu = [r["decision_cpu_ms"] for r in recs if r.get("decision_cpu_ms") is not None]
    regrets = [r["regret"] for r in recs if r.get("regret") is not None]
    evals = [r["candidates_evaluated"] for r in recs if r.get("candidates_evaluated") is not None]
    # decisions that serve arrivals (periods 1 .. the last arrival's), and why those fell back, by kind
    last = arrival_periods(res.runtime.req.arrival, period_s)
    inside = [r for r in recs if 1 <= r.get("period_index", 0) < last]
    kinds = Counter(_reason_kind(r.get("fallback_reason") or "") for r in inside if r.get("fallback"))
    return {
        "decisions": len(ms),
        "fallbacks": sum(1 for r in recs if r.get("fallback")),
        "in_window_decisions": len(inside),
        "in_window_fallbacks": dict(sorted(kinds.items())),
        "evals_per_decision_median": statistics.median(evals) if evals else None,
        "regret_mean": float(np.mean(regrets)) if regrets else None,
        "regret_zero_share": float(np.mean([r <= 1e-12 for r in regrets])) if regrets else None,
        "decision_ms_p95": float(np.percentile(ms, 95)) if ms else None,
        "decision_cpu_ms_p95": float(np.percentile(cpu, 95)) if cpu else None,
    }


def _reason_kind(reason: str) -> str:
    """A fallback reason's kind: its text before the first colon, numbers as #, the detail dropped.

    >>> _reason_kind("pareto: gp/$ 1 <= reference 1"), _reason_kind("forecast confidence 0.42 < threshold 0.50")
    ('pareto', 'forecast confidence # < threshold #')
    >>> _reason_kind("no candidate passed the hard gates (best: sla: chat 2.77% > budget 1.00%)")
    'no candidate passed the hard gates'
    """
    return re.sub(r"\d+(\.\d+)?", "#", reason.split(":", 1)[0]).removesuffix(" (best")


def _aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of every numeric headline figure, with min/max of gp/$ and each seed kept."""
    out: dict[str, Any] = {}
    first = per_seed[0]
    for k, v in first.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "seed":
            vals = [s[k] for s in per_seed if s.get(k) is not None]
            out[k] = float(np.mean(vals)) if vals else None
    out["classes"] = {
        c: {
            k: float(np.mean([s["classes"][c][k] for s in per_seed if s["classes"][c].get(k) is not None] or [np.nan]))
            for k in first["classes"][c]
        }
        for c in first["classes"]
    }
    for k in ("gp_per_dollar", "gp_per_dollar_owned"):
        out[f"{k}_min"] = min(s[k] for s in per_seed)
        out[f"{k}_max"] = max(s[k] for s in per_seed)
    if "in_window_fallbacks" in first:  # summed over the seeds, by kind
        kinds: Counter[str] = Counter()
        for s in per_seed:
            kinds.update(s.get("in_window_fallbacks", {}))
        out["in_window_fallbacks"] = dict(sorted(kinds.items()))
    audits = [s["realized_regret"] for s in per_seed if "realized_regret" in s]
    if audits:  # pooled over the seeds' audited decisions
        out["realized_regret"] = _pooled_regret(audits)
        for part in ("floor", "sla_gated", "fallback", "planned"):
            if any(part in a for a in audits):
                out["realized_regret"][part] = _pooled_regret([a[part] for a in audits if part in a])
        refused = [e for a in audits for e in a.get("refused", {}).get("entries", [])]
        if refused:
            out["realized_regret"]["refused"] = refused_summary(refused)
    if "hindsight" in first:
        out["oracle"], out["deployable"] = True, False
        out["hindsight"] = {k: v for k, v in first["hindsight"].items() if k not in ("check", "choices", "lead")}
        out["hindsight"]["leads"] = [s["hindsight"].get("lead") for s in per_seed]
    out["by_seed"] = per_seed
    return out


def _hindsight_flags(market: dict[str, Any]) -> None:
    """A market's hindsight verdict (valid when hindsight >= every arm in gp/$ in each seed's run) and each
    non-reference arm's share of the headroom on the hindsight's cost basis: its gain over the strongest
    reference / the hindsight arm's (None when the hindsight arm found no gain), over the seeds' means
    (`captured`) and in each seed's run against that seed's strongest reference (`captured_by_seed`, keyed by
    seed; None where the arm found no gain there or the seed is invalid)."""
    h = market["policies"].get(HINDSIGHT)
    if h is None:
        return
    checks = [s["hindsight"]["check"] for s in h["by_seed"]]
    invalid = [s["seed"] for s, c in zip(h["by_seed"], checks, strict=True) if not c["valid"]]
    market["hindsight"] = {
        "valid": all(c["valid"] for c in checks),
        "invalid_seeds": invalid,
        "beaten_by": sorted({n for c in checks for n in c["beaten_by"]}),
    }
    gains = market.get("gain_vs_strongest", {})
    if HINDSIGHT in gains:
        basis = h["hindsight"]["cost_basis"]
        room = gains[HINDSIGHT][basis]
        market["hindsight"]["headroom"] = {"cost_basis": basis, "gain": room}
        market["hindsight"]["captured"] = {
            n: (g[basis] / room if room > 0 else None) for n, g in gains.items() if n != HINDSIGHT
        }
        market["hindsight"]["captured_by_seed"] = _captured_by_seed(market["policies"], BASES[basis], set(invalid))


def _captured_by_seed(pol: dict[str, Any], key: str, invalid: set[int]) -> dict[str, dict[str, float | None]]:
    """Per arm (not a reference, not the hindsight arm) and seed: (arm - strongest reference) / (hindsight -
    strongest reference) in gp/$ on `key`, the strongest reference that seed's; None where the hindsight arm
    found no gain over it or the seed is in `invalid`.

    >>> pol = {"production": {"by_seed": [{"seed": 0, "gp_per_dollar": 100.0}, {"seed": 1, "gp_per_dollar": 90.0}]},
    ...        "hindsight": {"by_seed": [{"seed": 0, "gp_per_dollar": 150.0}, {"seed": 1, "gp_per_dollar": 80.0}]},
    ...        "aurelius": {"by_seed": [{"seed": 0, "gp_per_dollar": 120.0}, {"seed": 1, "gp_per_dollar": 95.0}]}}
    >>> _captured_by_seed(pol, "gp_per_dollar", set())
    {'aurelius': {'0': 0.4, '1': None}}
    """
    refs = [r for r in REFERENCE_POLICIES if r in pol]
    if not refs:  # no reference run to read a seed's share against
        return {}
    seeds = {name: {s["seed"]: s[key] for s in p["by_seed"]} for name, p in pol.items()}
    out: dict[str, dict[str, float | None]] = {}
    for name, by_seed in seeds.items():
        if name in refs or name == HINDSIGHT:
            continue
        shares: dict[str, float | None] = {}
        for seed, got in sorted(by_seed.items()):
            ref = max(seeds[r][seed] for r in refs)
            room = seeds[HINDSIGHT][seed] - ref
            shares[str(seed)] = (got - ref) / room if room > 0 and seed not in invalid else None
        out[name] = shares
    return out


def _oracle_gap(market: dict[str, Any]) -> None:
    pol = market["policies"]
    if "oracle" in pol and "aurelius" in pol:
        o, a = pol["oracle"]["gp_per_dollar"], pol["aurelius"]["gp_per_dollar"]
        market["oracle_gap"] = (o - a) / o if o else None


#: results.json's gp/$ key per cost basis.
BASES = {"rented": "gp_per_dollar", "owned": "gp_per_dollar_owned"}


def _strongest_reference(market: dict[str, Any]) -> None:
    """The reference with the highest mean gp/$ per cost basis (from the reference runs alone), and every other
    arm's gain over it: (gp/$ - strongest's) / strongest's."""
    pol = market["policies"]
    refs = [p for p in REFERENCE_POLICIES if p in pol]
    if not refs:
        return
    market["strongest_reference"] = {b: max(refs, key=lambda p: pol[p][k]) for b, k in BASES.items()}
    market["gain_vs_strongest"] = {
        name: {
            b: (p[k] - pol[market["strongest_reference"][b]][k]) / pol[market["strongest_reference"][b]][k]
            for b, k in BASES.items()
        }
        for name, p in pol.items()
        if name not in refs
    }


def _reset_tables(db: duckdb.DuckDBPyConnection) -> None:
    for t in ("periods", "classes", "requests"):
        db.execute(f"DROP TABLE IF EXISTS {t}")


def _frames(res: RunResult, key: str) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """replay.duckdb rows of one run: per-period aggregates, per-class aggregates, per-request outcomes."""
    periods = per_period(res).with_columns(pl.lit(key).alias("market"))
    o = request_outcomes(res)
    req = res.runtime.req
    requests = pl.DataFrame(
        {
            "market": key,
            "policy": res.policy,
            "seed": res.seed,
            "request_id": res.workload.requests["request_id"],
            "request_class": np.array(CLASSES)[o["cls"]],
            "arrival_s": req.arrival,
            "ttft_s": o["ttft_s"],
            "tpot_s": o["tpot_s"],
            "done_s": req.done,
            "output_tokens": req.out,
            "cached_input_tokens": req.cached,
            "sla_met": o["sla_met"],
            "unfinished": ~o["done"],
        }
    )
    classes = requests.group_by("market", "policy", "seed", "request_class").agg(
        pl.len().alias("offered"),
        pl.col("sla_met").sum().alias("sla_met"),
        pl.col("unfinished").sum().alias("unfinished"),
        pl.col("ttft_s").quantile(0.99).alias("ttft_p99_s"),
        pl.col("tpot_s").quantile(0.99).alias("tpot_p99_s"),
    )
    return periods, classes, requests


def _store(db: duckdb.DuckDBPyConnection, frames: tuple[pl.DataFrame, ...]) -> None:
    periods, classes, requests = frames
    for name, frame in (("periods", periods), ("classes", classes), ("requests", requests)):
        db.register("frame", frame.to_arrow())
        exists = db.execute(f"SELECT count(*) FROM information_schema.tables WHERE table_name = '{name}'").fetchone()
        if exists and exists[0]:
            db.execute(f"INSERT INTO {name} SELECT * FROM frame")
        else:
            db.execute(f"CREATE TABLE {name} AS SELECT * FROM frame")
        db.unregister("frame")


def emit_observations(path: Path, res: RunResult) -> None:
    path.mkdir(parents=True, exist_ok=True)
    assert res.observations is not None
    for kind, frames in res.observations.items():
        frames = [f for f in frames if f.height]
        if frames:
            pl.concat(frames, how="vertical_relaxed").write_parquet(path / f"{kind}.parquet")


def _config(args: argparse.Namespace, physics: Physics) -> dict[str, Any]:
    cfg = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    cfg["physics"] = physics.__dict__
    return cfg


def print_tables(results: dict[str, Any], basis: str) -> None:
    """One table per market: the headline figures of each policy (mean over seeds)."""
    for key, m in results["markets"].items():
        w = m["window"]
        print(
            f"\n{key}: window {w['start']} .. {w['end']}  mean price {w['mean_price_usd_mwh']:.1f} $/MWh"
            f"  (headline basis: {basis})"
        )
        hdr = (
            f"{'policy':<22}{'offered':>9}{'sla_met':>9}{'viol%':>7}{'gp/$':>9}{'gp/$own':>9}{'cost$':>9}"
            f"{'own$':>9}{'E MWh':>7}{'E share':>8}{'GPU-h':>8}{'ttft99':>8}{'tpot99':>8}"
        )
        print(hdr)
        for name, p in m["policies"].items():
            label = f"{name} (oracle*)" if p.get("deployable") is False else name
            print(
                f"{label:<22}{p['offered']:>9.0f}{p['sla_met']:>9.0f}{100 * p['sla_violation_rate']:>7.2f}"
                f"{p['gp_per_dollar']:>9.1f}{p['gp_per_dollar_owned']:>9.1f}{p['cost_usd']:>9.0f}"
                f"{p['cost_usd_owned']:>9.0f}{p['energy_mwh']:>7.2f}{p['energy_share']:>8.3f}"
                f"{p['gpu_hours']:>8.1f}{(p['ttft_p99_ms'] or 0):>8.0f}{(p['tpot_p99_ms'] or 0):>8.0f}"
            )
        if "oracle_gap" in m:
            print(f"oracle gap: {m['oracle_gap']:.3%}")
        if "strongest_reference" in m:
            b = "rented" if basis != "owned" else "owned"
            gains = ", ".join(f"{n} {g[b]:+.2%}" for n, g in m["gain_vs_strongest"].items())
            best = m["strongest_reference"][b]
            print(f"strongest reference ({b}): {best}" + (f"; gain over it: {gains}" if gains else ""))
        for name, p in m["policies"].items():
            r = p.get("realized_regret")
            for what, q in (("realized regret", r), ("  its noise floor", (r or {}).get("floor")),
                            ("  SLA-gated (diagnostic)", (r or {}).get("sla_gated")),
                            ("  of fallback decisions (the baseline's plan)", (r or {}).get("fallback")),
                            ("  of planned decisions (the planner's own)", (r or {}).get("planned"))):
                if q and q["n"]:
                    print(
                        f"{what} {name}: mean {q['mean']:.4f}  p50 {q['p50']:.4f}  p90 {q['p90']:.4f}  "
                        f"share>0 {q['share_positive']:.2f}  gap/request {q['gap_per_request']['mean']:.4f}  n {q['n']}"
                    )
            f = (r or {}).get("refused")
            if f and f["realized_gain"]["n"]:
                g, pg = f["realized_gain"], f["predicted_gain"]
                predicted = f"  predicted mean {pg['mean']:+.2%}" if pg["n"] else ""
                print(f"  fallbacks' refused candidates {name}: realized gp/$ gain mean {g['mean']:+.2%}  "
                      f"p50 {g['p50']:+.2%}  p90 {g['p90']:+.2%}{predicted}  better within SLA "
                      f"{f['better_within_sla']} of {f['n']}")
        if "hindsight" in m:
            h = m["hindsight"]
            verdict = "valid" if h["valid"] else f"INVALID (beaten by {', '.join(h['beaten_by'])})"
            print(f"* hindsight: an oracle on ground-truth branches, not deployable; the window's headroom; {verdict}")
            for name, share in h.get("captured", {}).items():
                if share is not None:
                    per_seed = h.get("captured_by_seed", {}).get(name, {})
                    seeds = ", ".join(f"seed {k} {'-' if v is None else f'{v:.0%}'}" for k, v in per_seed.items())
                    print(f"  headroom captured ({h['headroom']['cost_basis']}) by {name}: {share:.0%}"
                          + (f" ({seeds})" if len(per_seed) > 1 else ""))
