"""What the report draws, loaded from a replay's output directory into plain rows (lists of dicts).

Sources: OUT/results.json (headline figures per market and policy, each seed kept), OUT/replay.duckdb (tables
`periods` and `requests`, streams/replay/cli.py) and the Parquet audit log OUT/audit/ (read through the
deduplicating view of sinks/sql.py). Every source but results.json may be missing; what is absent is listed in
`ReportData.missing` and the page says so instead of drawing it. Realized regret (an audit record's
`realized.regret`) and a `hindsight` arm in results.json appear only where a replay measured them.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from sinks import sql
from sinks.audit_store import FILE_GLOB

Row = dict[str, Any]

#: Cost bases of results.json: label -> (gp/$ key, cost key, energy-share key).
BASES = {
    "rented": ("gp_per_dollar", "cost_usd", "energy_share"),
    "owned": ("gp_per_dollar_owned", "cost_usd_owned", "energy_share_owned"),
}
#: The arm whose gp/$ the hindsight headroom is measured against.
HEADROOM_ARM = "aurelius"


@dataclass
class MarketData:
    """One market (results.json key) of the report: rows for each figure."""

    key: str
    window: dict[str, Any]
    periods: list[Row] = field(default_factory=list)  # per policy x period: price, warm GPUs, arrivals, phase
    arrivals: list[Row] = field(default_factory=list)  # per period x class: arrivals (mean over seeds)
    policies: list[Row] = field(default_factory=list)  # per policy x basis: gp/$ (+ seed range), cost, energy share
    violations: list[Row] = field(default_factory=list)  # per policy x class: SLA violation rate
    decisions: list[Row] = field(default_factory=list)  # per audited decision: chosen vs reference, fallback
    headroom: float | None = None  # (hindsight gp/$ - aurelius gp/$) / hindsight gp/$, where both are present
    hindsight_check: dict[str, Any] | None = None  # results.json market "hindsight": valid, beaten_by, ...


@dataclass
class ReportData:
    out: Path
    results: dict[str, Any]
    period_s: float
    markets: list[MarketData]
    missing: list[str] = field(default_factory=list)

    @property
    def has_realized_regret(self) -> bool:
        return any(d.get("realized_regret") is not None for m in self.markets for d in m.decisions)


def load(out: str | Path) -> ReportData:
    """Load a replay output directory (results.json required; replay.duckdb and audit/ optional)."""
    out = Path(out)
    results_path = out / "results.json"
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} not found: run `aurelius replay --out {out}` first")
    results = json.loads(results_path.read_text())
    period_s = 60.0 * float(results.get("config", {}).get("period_minutes") or 5.0)
    missing: list[str] = []
    markets = [_market(key, m) for key, m in results.get("markets", {}).items()]

    db_path = out / "replay.duckdb"
    if db_path.is_file():
        con = duckdb.connect(str(db_path), read_only=True)
        try:
            tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
            for m in markets:
                if "periods" in tables:
                    m.periods = _periods(con, m.key, period_s)
                if "requests" in tables:
                    m.arrivals = _arrivals(con, m.key, period_s, m.window)
        finally:
            con.close()
        if not any(m.periods for m in markets):
            missing.append("replay.duckdb has no `periods` rows: no price, warm-GPU or arrival figures")
    else:
        missing.append(f"{db_path.name} not found: no price, warm-GPU or arrival figures")

    audit_dir = out / "audit"
    if audit_dir.is_dir() and any(audit_dir.glob(FILE_GLOB)):
        decisions = _decisions(audit_dir)
        for m in markets:
            m.decisions = _for_market(decisions, m, period_s)
    else:
        missing.append("no Parquet audit log under audit/: no decision timeline (policies without decision "
                       "records, e.g. production alone, write none)")
    data = ReportData(out, results, period_s, markets, missing)
    if not data.has_realized_regret:
        missing.append("no realized regret in the audit log (recorded only by a replay that re-runs decisions "
                       "against the simulator)")
    if all(m.headroom is None for m in markets):
        missing.append("no hindsight arm in results.json: no hindsight headroom")
    return data


def _market(key: str, m: dict[str, Any]) -> MarketData:
    md = MarketData(key, m.get("window", {}))
    policies = m.get("policies", {})
    for name, p in policies.items():
        for basis, (gp_key, cost_key, share_key) in BASES.items():
            seeds = [s.get(gp_key) for s in p.get("by_seed", []) if s.get(gp_key) is not None]
            md.policies.append({
                "policy": name, "basis": basis, "gp_per_dollar": p.get(gp_key),
                "gp_per_dollar_min": p.get(f"{gp_key}_min", min(seeds) if seeds else p.get(gp_key)),
                "gp_per_dollar_max": p.get(f"{gp_key}_max", max(seeds) if seeds else p.get(gp_key)),
                "seeds": len(seeds) or 1, "cost_usd": p.get(cost_key), "energy_share": p.get(share_key),
                "sla_violation_rate": p.get("sla_violation_rate"),
            })
        for cls, c in (p.get("classes") or {}).items():
            rate = c.get("sla_violation_rate")
            if rate is not None and not (isinstance(rate, float) and math.isnan(rate)):
                md.violations.append({"policy": name, "request_class": cls, "violation_rate": rate})
    hind = policies.get("hindsight")
    if isinstance(m.get("hindsight"), dict) and "valid" in m["hindsight"]:
        md.hindsight_check = m["hindsight"]
    arm = policies.get(HEADROOM_ARM)
    if isinstance(hind, dict) and arm and hind.get("gp_per_dollar") and arm.get("gp_per_dollar") is not None:
        md.headroom = (hind["gp_per_dollar"] - arm["gp_per_dollar"]) / hind["gp_per_dollar"]
    return md


def _iso(v: Any) -> str:
    return v.isoformat() if isinstance(v, datetime) else str(v)


def _periods(con: duckdb.DuckDBPyConnection, key: str, period_s: float) -> list[Row]:
    """Per policy and period, mean over seeds; phase `window` up to the last period with arrivals, then `drain`."""
    rows = con.execute(
        "SELECT policy, period, min(period_start), avg(arrivals), avg(gpus_mean), avg(price_usd_mwh), "
        "avg(it_energy_kwh) FROM periods WHERE market = ? GROUP BY policy, period ORDER BY policy, period",
        [key],
    ).fetchall()
    last = max((r[1] for r in rows if (r[3] or 0) > 0), default=-1)
    return [
        {"policy": p, "period": int(k), "period_start": _iso(t),
         "period_end": _iso(t + timedelta(seconds=period_s)) if isinstance(t, datetime) else None,
         "arrivals": a, "gpus_warm": g,
         "price_usd_mwh": price, "it_energy_kwh": e, "phase": "window" if k <= last else "drain"}
        for p, k, t, a, g, price, e in rows
    ]


def _arrivals(con: duckdb.DuckDBPyConnection, key: str, period_s: float, window: dict[str, Any]) -> list[Row]:
    """Arrivals per period and class of the market's workload (one policy's copy; mean over seeds)."""
    first = con.execute("SELECT min(policy) FROM requests WHERE market = ?", [key]).fetchone()
    if not first or first[0] is None:
        return []
    rows = con.execute(
        "SELECT CAST(floor(arrival_s / ?) AS BIGINT) AS k, request_class, count(*) / count(DISTINCT seed) "
        "FROM requests WHERE market = ? AND policy = ? GROUP BY k, request_class ORDER BY k, request_class",
        [period_s, key, first[0]],
    ).fetchall()
    start = _parse(window.get("start"))
    return [
        {"period": int(k), "period_start": (start + timedelta(seconds=k * period_s)).isoformat() if start else k,
         "request_class": c, "arrivals": float(n)}
        for k, c, n in rows
    ]


def _parse(v: Any) -> datetime | None:
    if not v:
        return None
    return datetime.fromisoformat(str(v).replace("Z", "+00:00"))


def _plan_gpus(plan: dict[str, Any] | None) -> float | None:
    """GPUs a plan keeps warm at its floors (sum of replica_floor x tp)."""
    if not plan or "pools" not in plan:
        return None
    return float(sum(int(p.get("replica_floor", 0)) * int(p.get("tp", 1)) for p in plan["pools"]))


def reason_kind(reason: str | None) -> str:
    """A fallback reason's kind: the text before its first ':' or '(' ("pareto", "start", ...)."""
    if not reason:
        return ""
    head = re.split(r"[:(]", reason, maxsplit=1)[0].strip()
    return head if len(head) <= 40 else head[:37] + "..."


def _decisions(audit_dir: Path) -> list[Row]:
    df = sql.query(
        "SELECT market, policy, period_index, period_start, fallback, fallback_reason, regret, chosen_plan, "
        "reference_plan, predicted_delta, realized, json_extract(record, '$.seed') AS seed FROM audit "
        "ORDER BY market, policy, seed, period_index",
        audit_dir,
    )
    out = []
    for r in df.iter_rows(named=True):
        chosen = json.loads(r["chosen_plan"]) if r["chosen_plan"] else None
        ref = json.loads(r["reference_plan"]) if r["reference_plan"] else None
        delta = json.loads(r["predicted_delta"]) if r["predicted_delta"] else None
        realized = json.loads(r["realized"]) if r["realized"] else None
        rr = realized.get("regret") if isinstance(realized, dict) else None
        out.append({
            "market": r["market"], "policy": r["policy"],
            "seed": int(json.loads(r["seed"])) if r["seed"] not in (None, "null") else 0,
            "period": r["period_index"], "period_start": _iso(r["period_start"]),
            "fallback": bool(r["fallback"]), "reason": r["fallback_reason"] or "",
            "reason_kind": reason_kind(r["fallback_reason"]) if r["fallback"] else "",
            "chosen_label": (chosen or {}).get("label", ""), "reference_label": (ref or {}).get("label", ""),
            "chosen_gpus": _plan_gpus(chosen), "reference_gpus": _plan_gpus(ref),
            "predicted_cost_delta_usd": (delta or {}).get("cost_usd"),
            "planned_regret": r["regret"], "realized_regret": rr if isinstance(rr, (int, float)) else None,
        })
    return out


def _for_market(decisions: list[Row], m: MarketData, period_s: float) -> list[Row]:
    """The decisions of one results.json market: same market name(s), inside the market's periods."""
    base = m.key.split("@")[0]
    start = _parse(m.window.get("start"))
    n = max((p["period"] for p in m.periods), default=-1) + 1
    end = start + timedelta(seconds=max(n, 1) * period_s) if start else None
    out = []
    for d in decisions:
        same = d["market"] == base or (base == "three-site" and "," in (d["market"] or ""))
        at = _parse(d["period_start"])
        inside = start is None or at is None or (start <= at and (n == 0 or at < end))
        if same and inside:
            out.append(d)
    return out


def fallback_counts(decisions: list[Row]) -> list[Row]:
    """Fallbacks per policy and reason kind."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for d in decisions:
        if d["fallback"]:
            counts[(d["policy"], d["reason_kind"])] += 1
    return [{"policy": p, "reason_kind": k, "count": n} for (p, k), n in sorted(counts.items())]
