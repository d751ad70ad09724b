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
import multiprocessing
import statistics
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
from tqdm import tqdm

from optimizer.baselines.tuned import StaticConfig
from optimizer.registry import create
from optimizer.wiring import build_policy
from schemas.audit import decision_id
from schemas.fleet import default_fleet
from schemas.policy import REFERENCE_POLICIES
from schemas.protocol import CLASSES
from sinks.audit_store import FILE_GLOB, ParquetAuditStore
from streams.replay.branching import arrival_periods
from streams.replay.driver import RunResult, run_replay
from streams.replay.hindsight import (
    HINDSIGHT,
    BranchSettings,
    RegretAudit,
    g_star,
    hindsight_check,
    regret_stats,
    run_hindsight,
)
from streams.replay.metrics import PROVENANCE, per_period, request_outcomes, summarize
from streams.replay.ruler import ruler_record
from streams.replay.tuning import lead_in_fleet, tune_static
from streams.workload.builder import Workload, build_workload
from streams.workload.residency import assign_residency
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
    bar = tqdm(total=len(jobs) * len(arms), desc="replay", unit="run", disable=args.no_progress)
    for job, outcomes in _execute(jobs, args):
        for o in outcomes:
            windows[job.key] = o.window
            runs.setdefault(job.key, {p: [] for p in arms})[o.policy].append(o.summary)
            _store(db, o.frames)
            _audit(audit, o.decisions, job.seed)
            bar.update(1)
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


def _execute(jobs: list[Job], args: argparse.Namespace) -> Iterator[tuple[Job, list[Outcome]]]:
    """Run the jobs, in worker processes when --jobs > 1 (each job is independent), in job order."""
    n = min(max(1, args.jobs), len(jobs))
    if n == 1:
        for job in jobs:
            yield job, run_job(job, args)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        futures = [pool.submit(run_job, job, args) for job in jobs]
        for job, fut in zip(jobs, futures, strict=True):
            yield job, fut.result()


def run_job(job: Job, args: argparse.Namespace) -> list[Outcome]:
    """Build the job's workload and replay it under each policy."""
    physics = _physics(args)
    fleet = default_fleet(tuple(_csv(args.markets)))
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
        regions = tuple(site.region for site in fleet.sites)
        wl = replace(wl, requests=assign_residency(wl.requests, regions, job.market, seed=job.seed))
    w = wl.window
    window = {"start": w.start.isoformat(), "end": w.end.isoformat(), "mean_price_usd_mwh": w.mean_price_usd_mwh,
              "rule": w.rule, "year": job.year}  # fmt: skip
    tuning = None
    if "production-tuned" in job.policies:
        tuning = tune_static(job.market, wl.window.start, fleet, seed=job.seed, physics=physics,
                             period_minutes=args.period_minutes)  # fmt: skip
        window["production_tuned"] = {"config": tuning.config.as_dict(), "tuned_on": tuning.window_start.isoformat(),
                                      "candidates": tuning.table}  # fmt: skip
    initial = lead_in_fleet(job.market, wl.window.start, fleet, seed=job.seed, physics=physics,
                            all_sites=job.all_sites)  # fmt: skip
    outcomes = []
    audited = set(_csv(getattr(args, "realized_regret", "") or ""))
    hindsight = bool(getattr(args, "hindsight", False))
    settings = BranchSettings(K=getattr(args, "hindsight_k", 16), H=getattr(args, "branch_h", 2),
                              basis=args.cost_basis)  # fmt: skip
    period_s = args.period_minutes * 60.0
    # the references first: g* and the comparison set of the branches come from their runs
    order = [n for n in job.policies if n in REFERENCES] + [n for n in job.policies if n not in REFERENCES]
    refs: dict[str, RunResult] = {}
    summaries: dict[str, dict[str, Any]] = {}
    gstar = 0.0
    for name in order:
        audit = None
        if name in audited and name not in REFERENCES:
            audit = RegretAudit(refs, gstar, period_s, _window_periods(wl, period_s), job.seed, settings)
        res = _one(wl, name, fleet, args, physics, job.key, job.seed, job.all_sites, tuning and tuning.config,
                   initial, intercept=audit.intercept if audit else None)  # fmt: skip
        summary = summarize(res)
        summary["seed"] = job.seed
        summary.update(_decision_stats(res))
        if name in REFERENCES:
            refs[name] = res
            summaries[name] = summary
            if all(r in refs for r in REFERENCES if r in job.policies):  # the last reference has run
                strongest, gstar = g_star(summaries, args.cost_basis)
                window["g_star"] = {"reference": strongest, "gp_per_dollar": gstar, "cost_basis": args.cost_basis}
        summaries[name] = summary
        if args.emit_observations and res.observations is not None:
            emit_observations(Path(args.out) / "observations" / job.key / name / f"seed{job.seed}", res)
        if audit is not None:
            audit.attach(res)
            summary["realized_regret"] = audit.stats()
        outcomes.append(Outcome(name, summary, _frames(res, job.key), res.decisions, window))
    for name in [n for n in order if n in audited and n in REFERENCES]:  # a reference audited: run it again
        audit = RegretAudit(refs, gstar, period_s, _window_periods(wl, period_s), job.seed, settings)
        res = _one(wl, name, fleet, args, physics, job.key, job.seed, job.all_sites, tuning and tuning.config,
                   initial, intercept=audit.intercept)  # fmt: skip
        next(o for o in outcomes if o.policy == name).summary["realized_regret"] = audit.stats()
    if hindsight:
        res, choices = run_hindsight(wl, fleet, refs, gstar, period_s=period_s, physics=physics,
                                     all_sites=job.all_sites, initial_replicas=initial, settings=settings)  # fmt: skip
        summary = summarize(res)
        summary["seed"] = job.seed
        summary.update(_decision_stats(res))
        summaries[HINDSIGHT] = summary
        summary["hindsight"] = {"oracle": True, "deployable": False, **settings.describe(), "g_star": gstar,
                                "check": hindsight_check(summaries, args.cost_basis), "choices": choices}  # fmt: skip
        outcomes.append(Outcome(HINDSIGHT, summary, _frames(res, job.key), [], window))
    return outcomes


#: the references: they run first in a job (g*, the comparison set and the continuation come from them)
REFERENCES = ("production", "production-tuned", "naive")


def _window_periods(wl: Workload, period_s: float) -> int:
    """Periods that receive arrivals (the decisions the regret audit samples from)."""
    return arrival_periods(wl.requests["arrival_s"].to_numpy(), period_s)


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
    if getattr(args, "hindsight", False) and args.hindsight_k < 16:
        raise SystemExit("--hindsight-k must be at least 16")


def _physics(args: argparse.Namespace) -> Physics:
    return Physics(
        fp8_speedup_scale=args.fp8_speedup_scale,
        scaler_trigger=getattr(args, "scaler_trigger", "v1"),
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
    tuned: StaticConfig | None,
    initial: dict[tuple[str, str, str], int],
    intercept: Any = None,
) -> RunResult:
    """One replay; production-tuned runs the configuration measured best on the week before (`tuned`)."""
    if name == "production-tuned":
        policy = create(name, config=tuned)
    else:
        policy = build_policy(name, wl, seed, period_s=args.period_minutes * 60.0, window_periods=args.periods)
    bar = tqdm(desc=f"{key} {name} seed {seed}", unit="period", disable=args.no_progress, leave=False)
    try:
        return run_replay(
            wl,
            policy,
            fleet,
            period_s=args.period_minutes * 60.0,
            physics=physics,
            keep_observations=args.emit_observations,
            on_period=lambda _k: bar.update(1),
            all_sites=all_sites,
            initial_replicas=initial,
            intercept=intercept,
        )
    finally:
        bar.close()


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


def _decision_stats(res: RunResult) -> dict[str, Any]:
    recs = res.decisions
    # the decision's own latency (observe -> decide, the regret audit excluded) where the policy records it
    own = [r["decision_ms"] for r in recs if r.get("decision_ms") is not None]
    ms = own if own and len(own) == len(res.decision_ms) else res.decision_ms
    cpu = [r["decision_cpu_ms"] for r in recs if r.get("decision_cpu_ms") is not None]
    regrets = [r["regret"] for r in recs if r.get("regret") is not None]
    evals = [r["candidates_evaluated"] for r in recs if r.get("candidates_evaluated") is not None]
    return {
        "decisions": len(ms),
        "fallbacks": sum(1 for r in recs if r.get("fallback")),
        "evals_per_decision_median": statistics.median(evals) if evals else None,
        "regret_mean": float(np.mean(regrets)) if regrets else None,
        "regret_zero_share": float(np.mean([r <= 1e-12 for r in regrets])) if regrets else None,
        "decision_ms_p95": float(np.percentile(ms, 95)) if ms else None,
        "decision_cpu_ms_p95": float(np.percentile(cpu, 95)) if cpu else None,
    }


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
    if any("realized_regret" in s for s in per_seed):  # pooled over the seeds' audited decisions
        pooled = [v for s in per_seed for v in s.get("realized_regret", {}).get("values", [])]
        out["realized_regret"] = regret_stats(pooled)
    if "hindsight" in first:
        out["oracle"], out["deployable"] = True, False
        out["hindsight"] = {k: v for k, v in first["hindsight"].items() if k not in ("check", "choices")}
    out["by_seed"] = per_seed
    return out


def _hindsight_flags(market: dict[str, Any]) -> None:
    """A market's hindsight verdict: valid when hindsight >= every arm in gp/$ in each seed's run."""
    h = market["policies"].get(HINDSIGHT)
    if h is None:
        return
    checks = [s["hindsight"]["check"] for s in h["by_seed"]]
    market["hindsight"] = {
        "valid": all(c["valid"] for c in checks),
        "invalid_seeds": [s["seed"] for s, c in zip(h["by_seed"], checks, strict=True) if not c["valid"]],
        "beaten_by": sorted({n for c in checks for n in c["beaten_by"]}),
    }


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
            if r and r["n"]:
                print(
                    f"realized regret {name}: mean {r['mean']:.4f}  p50 {r['p50']:.4f}  p90 {r['p90']:.4f}  "
                    f"share>0 {r['share_positive']:.2f}  n {r['n']}"
                )
        if "hindsight" in m:
            h = m["hindsight"]
            verdict = "valid" if h["valid"] else f"INVALID (beaten by {', '.join(h['beaten_by'])})"
            print(f"* hindsight: an oracle on ground-truth branches, not deployable; the window's headroom; {verdict}")
