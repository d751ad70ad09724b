"""`aurelius audit summary`: the questions an operator asks of the audit log, answered with DuckDB SQL over the
Parquet files (the deduplicated read-only view of sinks/sql.py), as a table on stdout and optionally as CSV.

1. decisions: how many per policy, over which periods, how many were fallbacks;
2. fallbacks by reason (the reason's kind, the text before its first ':' or '(', and the commonest full reasons);
3. predicted savings against the reference plan to date: the sum of -predicted_delta.cost_usd and the mean
   relative gp/$ change. These are the forward model's predictions, not measurements: a live worker can only
   predict savings (what the reference would have cost is never observed);
4. realized regret, where a replay measured it (an audit record's realized.regret), also over the fallback
   decisions (the baseline's plan) and the planned ones apart; a live log has none;
5. the plans most often chosen (identical chosen_plan JSON grouped; label and pools summarized).

The CSV is long-form: question, policy, item, value, unit, note.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from sinks import sql

SAVINGS_NOTE = ("predicted by the forward model against the reference plan, not measured: a live worker can only "
                "predict savings")
REGRET_NOTE = "measured by a replay against the simulator (realized.regret)"
NO_REGRET = ("no realized regret in this log: a live worker cannot measure it; a replay that re-runs decisions "
             "against the simulator records it")
TOP_PLANS = 5
TOP_REASONS = 5

Q_DECISIONS = """
SELECT policy, count(*) AS decisions, count(DISTINCT market) AS markets, min(period_start) AS first_period,
       max(period_start) AS last_period, count(*) FILTER (WHERE fallback) AS fallbacks,
       round(100.0 * count(*) FILTER (WHERE fallback) / count(*), 1) AS fallback_pct,
       count(*) FILTER (WHERE json_extract_string(record, '$.live_decision_id') IS NOT NULL) AS from_replay
FROM audit GROUP BY policy ORDER BY policy
"""
Q_FALLBACK_KINDS = """
SELECT policy, trim(regexp_extract(fallback_reason, '^[^:(]*')) AS reason_kind, count(*) AS fallbacks
FROM audit WHERE fallback GROUP BY ALL ORDER BY policy, fallbacks DESC, reason_kind
"""
Q_FALLBACK_REASONS = f"""
SELECT policy, fallback_reason AS reason, count(*) AS fallbacks FROM audit WHERE fallback
GROUP BY ALL ORDER BY policy, fallbacks DESC, reason LIMIT {TOP_REASONS}
"""
Q_SAVINGS = """
SELECT policy,
       count(*) FILTER (WHERE d_cost IS NOT NULL) AS decisions_with_reference,
       round(coalesce(sum(-d_cost), 0), 4) AS predicted_savings_usd,
       round(coalesce(sum(-d_cost) FILTER (WHERE NOT fallback), 0), 4) AS predicted_savings_usd_non_fallback,
       round(100.0 * avg(d_gp_rel), 3) AS predicted_gp_per_dollar_change_pct
FROM (SELECT policy, fallback,
             TRY_CAST(json_extract(predicted_delta, '$.cost_usd') AS DOUBLE) AS d_cost,
             TRY_CAST(json_extract(predicted_delta, '$.gp_per_dollar_rel') AS DOUBLE) AS d_gp_rel FROM audit)
GROUP BY policy ORDER BY policy
"""
Q_REGRET = """
SELECT policy, count(r) AS decisions_measured, round(avg(r), 5) AS realized_regret_mean,
       round(quantile_cont(r, 0.5), 5) AS realized_regret_median, round(max(r), 5) AS realized_regret_max,
       count(r) FILTER (WHERE fallback) AS decisions_measured_fallback,
       round(avg(r) FILTER (WHERE fallback), 5) AS realized_regret_mean_fallback,
       round(avg(r) FILTER (WHERE NOT fallback), 5) AS realized_regret_mean_planned,
       count(g) AS refused_measured, round(avg(g), 5) AS refused_realized_gain_mean,
       count(g) FILTER (WHERE gap > 0 AND within) AS refused_better_within_sla
FROM (SELECT policy, fallback, TRY_CAST(json_extract(realized, '$.regret') AS DOUBLE) AS r,
             TRY_CAST(json_extract(realized, '$.refused.gain') AS DOUBLE) AS g,
             TRY_CAST(json_extract(realized, '$.refused.value_gap') AS DOUBLE) AS gap,
             TRY_CAST(json_extract(realized, '$.refused.within_sla') AS BOOLEAN) AS within FROM audit)
WHERE r IS NOT NULL GROUP BY policy ORDER BY policy
"""
#: the regret question's items and units (`rows`); refused_*: the fallbacks' refused candidates, branched
REGRET_ITEMS = {"decisions_measured": "decisions", "realized_regret_mean": "ratio", "realized_regret_median": "ratio",
                "realized_regret_max": "ratio", "decisions_measured_fallback": "decisions",
                "realized_regret_mean_fallback": "ratio", "realized_regret_mean_planned": "ratio",
                "refused_measured": "decisions", "refused_realized_gain_mean": "ratio",
                "refused_better_within_sla": "decisions"}
Q_PLANS = f"""
SELECT policy, chosen_plan, count(*) AS chosen, min(period_start) AS first_chosen
FROM audit WHERE chosen_plan IS NOT NULL GROUP BY policy, chosen_plan
QUALIFY row_number() OVER (PARTITION BY policy ORDER BY count(*) DESC, min(period_start)) <= {TOP_PLANS}
ORDER BY policy, chosen DESC, first_chosen
"""


@dataclass
class Summary:
    """The answers as frames (one per question) and the notes printed with them."""

    decisions: pl.DataFrame
    fallback_kinds: pl.DataFrame
    fallback_reasons: pl.DataFrame
    savings: pl.DataFrame
    regret: pl.DataFrame
    plans: pl.DataFrame
    notes: list[str] = field(default_factory=list)


def plan_summary(plan_json: str | None) -> str:
    """A plan in one line: per pool model/GPU floor..ceiling x tp, precision, KV dtype, batch, clock; admission."""
    if not plan_json:
        return ""
    plan = json.loads(plan_json)
    pools = [
        f"{p.get('model')}/{p.get('gpu')} {p.get('replica_floor')}..{p.get('replica_ceiling')}x{p.get('tp')} "
        f"{p.get('precision')}/{p.get('kv_dtype', 'auto')} b{p.get('max_batch')} {p.get('sm_clock_mhz')}MHz"
        for p in plan.get("pools", [])
    ]
    return "; ".join(pools) + f"; batch {plan.get('batch_admission')}"


def summarize(audit_dir: str | Path) -> Summary:
    """Run the canned queries over the audit log in `audit_dir`."""
    q = {name: sql.query(text, audit_dir) for name, text in (
        ("decisions", Q_DECISIONS), ("kinds", Q_FALLBACK_KINDS), ("reasons", Q_FALLBACK_REASONS),
        ("savings", Q_SAVINGS), ("regret", Q_REGRET), ("plans", Q_PLANS))}
    plans = q["plans"]
    if plans.height:
        plans = plans.with_columns(
            pl.col("chosen_plan").map_elements(lambda s: json.loads(s).get("label", ""), return_dtype=pl.String)
            .alias("label"),
            pl.col("chosen_plan").map_elements(plan_summary, return_dtype=pl.String).alias("plan"),
        ).select("policy", "chosen", "label", "plan", "first_chosen")
    else:
        plans = pl.DataFrame(schema={"policy": pl.String, "chosen": pl.Int64, "label": pl.String, "plan": pl.String})
    notes = [f"predicted savings: {SAVINGS_NOTE}."]
    notes.append(f"realized regret: {REGRET_NOTE}." if q["regret"].height else f"realized regret: {NO_REGRET}.")
    return Summary(q["decisions"], q["kinds"], q["reasons"], q["savings"], q["regret"], plans, notes)


def rows(s: Summary) -> list[dict[str, Any]]:
    """The summary as long-form rows: question, policy, item, value, unit, note."""
    out: list[dict[str, Any]] = []

    def add(question: str, policy: str, item: str, value: Any, unit: str, note: str = "") -> None:
        out.append({"question": question, "policy": policy, "item": item, "value": value, "unit": unit,
                    "note": note})

    for r in s.decisions.iter_rows(named=True):
        add("decisions", r["policy"], "count", r["decisions"], "decisions")
        add("decisions", r["policy"], "fallbacks", r["fallbacks"], "decisions")
        add("decisions", r["policy"], "first_period", str(r["first_period"]), "UTC")
        add("decisions", r["policy"], "last_period", str(r["last_period"]), "UTC")
        add("decisions", r["policy"], "from_replay", r["from_replay"], "decisions")
    for r in s.fallback_kinds.iter_rows(named=True):
        add("fallbacks_by_reason", r["policy"], r["reason_kind"] or "(none)", r["fallbacks"], "decisions")
    for r in s.savings.iter_rows(named=True):
        add("predicted_savings", r["policy"], "cost_usd", r["predicted_savings_usd"], "USD", SAVINGS_NOTE)
        add("predicted_savings", r["policy"], "cost_usd_non_fallback", r["predicted_savings_usd_non_fallback"],
            "USD", SAVINGS_NOTE)
        add("predicted_savings", r["policy"], "gp_per_dollar_change_mean", r["predicted_gp_per_dollar_change_pct"],
            "%", SAVINGS_NOTE)
        add("predicted_savings", r["policy"], "decisions_with_reference", r["decisions_with_reference"], "decisions")
    if s.regret.height:
        for r in s.regret.iter_rows(named=True):
            for k, unit in REGRET_ITEMS.items():
                add("realized_regret", r["policy"], k, r[k], unit, REGRET_NOTE)
    else:
        add("realized_regret", "", "decisions_measured", 0, "decisions", NO_REGRET)
    for r in s.plans.iter_rows(named=True):
        add("top_plans", r["policy"], r["plan"], r["chosen"], "decisions", r["label"])
    return out


def render(s: Summary) -> str:
    """The summary as text tables, one per question, with the notes."""
    sections = [
        ("Decisions", s.decisions),
        ("Fallbacks by reason (kind)", s.fallback_kinds),
        (f"Commonest fallback reasons (top {TOP_REASONS})", s.fallback_reasons),
        ("Predicted savings against the reference plan, to date (PREDICTED, not measured)", s.savings),
        ("Realized regret (measured by a replay)", s.regret),
        (f"Plans most often chosen (top {TOP_PLANS} per policy)", s.plans.drop("first_chosen", strict=False)),
    ]
    parts = []
    with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=110, tbl_width_chars=220, tbl_hide_dataframe_shape=True,
                   tbl_hide_column_data_types=True):
        for title, df in sections:
            parts.append(f"== {title}")
            parts.append(str(df) if df.height else "(none)")
    parts += [f"note: {n}" for n in s.notes]
    return "\n".join(parts) + "\n"


def write_csv(s: Summary, path: str | Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["question", "policy", "item", "value", "unit", "note"])
        w.writeheader()
        w.writerows(rows(s))


def run(args: argparse.Namespace) -> int:
    if not Path(args.audit_dir).is_dir():
        print(f"aurelius audit summary: no audit log directory {args.audit_dir}", file=sys.stderr)
        return 2
    try:
        s = summarize(args.audit_dir)
    except (duckdb.Error, sql.QueryLimitError) as exc:
        print(f"aurelius audit summary: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(render(s))
    if args.csv:
        write_csv(s, args.csv)
        print(f"wrote {args.csv}")
    return 0
