"""One Vega-Lite chart (altair) per figure of the report; each takes a market's rows (streams/report/data.py) and
returns a chart, or None when its rows are absent. Nothing is drawn by hand: layout, scales and marks are
Vega-Lite's."""

from __future__ import annotations

from collections.abc import Callable

import altair as alt

from streams.report.data import MarketData, Row, fallback_counts

WIDTH = 430
HEIGHT = 200
#: Class colours kept the same in every figure.
CLASS_SCALE = alt.Scale(domain=["code", "chat", "batch"], range=["#4c78a8", "#f58518", "#54a24b"])


def _data(rows: list[Row]) -> alt.Data:
    return alt.Data(values=rows)


def _time(field: str = "period_start") -> alt.X:
    return alt.X(f"{field}:T", title="period start (UTC)")


def price(m: MarketData) -> alt.Chart | None:
    """Price per period ($/MWh) over the window and the drain, the drain shaded."""
    first = m.periods[0]["policy"] if m.periods else None
    rows = [r for r in m.periods if r["policy"] == first and r["price_usd_mwh"] is not None]
    if not rows:
        return None
    base = alt.Chart(_data(rows))
    band = base.transform_filter("datum.phase == 'drain'").mark_rect(opacity=0.12, color="gray").encode(
        x=_time(), x2="period_end:T"
    )
    line = base.mark_line(point=True, interpolate="step-after").encode(
        x=_time(),
        y=alt.Y("price_usd_mwh:Q", title="price ($/MWh)"),
        color=alt.Color("phase:N", scale=alt.Scale(domain=["window", "drain"], range=["#e45756", "#9d9d9d"])),
        tooltip=["period:Q", "period_start:T", alt.Tooltip("price_usd_mwh:Q", format=".1f"), "phase:N"],
    )
    return (band + line).properties(width=WIDTH, height=HEIGHT, title="Price over the window and the drain")


def arrivals(m: MarketData) -> alt.Chart | None:
    """Requests arriving per period, stacked by class."""
    if not m.arrivals:
        return None
    return alt.Chart(_data(m.arrivals)).mark_bar().encode(
        x=alt.X("period:O", title="period"),
        y=alt.Y("arrivals:Q", title="requests arrived", stack="zero"),
        color=alt.Color("request_class:N", title="class", scale=CLASS_SCALE),
        tooltip=["period:O", "period_start:T", "request_class:N", alt.Tooltip("arrivals:Q", format=",.0f")],
    ).properties(width=WIDTH, height=HEIGHT, title="Arrivals per class")


def warm_gpus(m: MarketData) -> alt.Chart | None:
    """Warm (or loading) GPUs per policy, mean per period."""
    if not m.periods:
        return None
    return alt.Chart(_data(m.periods)).mark_line(interpolate="step-after").encode(
        x=_time(),
        y=alt.Y("gpus_warm:Q", title="warm GPUs (mean per period)"),
        color=alt.Color("policy:N"),
        strokeDash=alt.StrokeDash("phase:N", scale=alt.Scale(domain=["window", "drain"], range=[[1, 0], [4, 3]])),
        tooltip=["policy:N", "period:Q", alt.Tooltip("gpus_warm:Q", format=".1f"), "phase:N"],
    ).properties(width=WIDTH, height=HEIGHT, title="Warm GPUs per policy")


def gp_per_dollar(m: MarketData) -> alt.Chart | None:
    """Goodput per dollar per policy, both cost bases, with the seeds' min..max."""
    rows = [r for r in m.policies if r["gp_per_dollar"] is not None]
    if not rows:
        return None
    base = alt.Chart(_data(rows)).encode(y=alt.Y("policy:N", title=None))
    bars = base.mark_bar().encode(
        x=alt.X("gp_per_dollar:Q", title="SLA-met requests per $ (mean over seeds)"),
        color=alt.Color("policy:N", legend=None),
        tooltip=["policy:N", "basis:N", alt.Tooltip("gp_per_dollar:Q", format=".1f"),
                 alt.Tooltip("gp_per_dollar_min:Q", format=".1f"), alt.Tooltip("gp_per_dollar_max:Q", format=".1f"),
                 "seeds:Q"],
    )
    rule = base.mark_errorbar(ticks=True, color="black").encode(
        x=alt.X("gp_per_dollar_min:Q", title=""), x2="gp_per_dollar_max:Q"
    )
    return (bars + rule).properties(width=WIDTH // 2 - 40, height=HEIGHT // 2).facet(
        column=alt.Column("basis:N", title="cost basis")
    ).resolve_scale(x="independent").properties(title="gp/$ per policy (bar: mean; whisker: seed range)")


def cost(m: MarketData) -> alt.Chart | None:
    """Total cost per policy on both bases."""
    rows = [r for r in m.policies if r["cost_usd"] is not None]
    if not rows:
        return None
    return alt.Chart(_data(rows)).mark_bar().encode(
        y=alt.Y("policy:N", title=None),
        x=alt.X("cost_usd:Q", title="cost ($, window + drain)"),
        color=alt.Color("policy:N", legend=None),
        tooltip=["policy:N", "basis:N", alt.Tooltip("cost_usd:Q", format=",.2f")],
    ).properties(width=WIDTH // 2 - 40, height=HEIGHT // 2).facet(
        column=alt.Column("basis:N", title="cost basis")
    ).resolve_scale(x="independent").properties(title="Cost per policy")


def violations(m: MarketData) -> alt.Chart | None:
    """SLA violation rate per class and policy."""
    if not m.violations:
        return None
    return alt.Chart(_data(m.violations)).mark_bar().encode(
        x=alt.X("request_class:N", title="class", sort=["code", "chat", "batch"]),
        xOffset="policy:N",
        y=alt.Y("violation_rate:Q", title="SLA violation rate", axis=alt.Axis(format="%")),
        color=alt.Color("policy:N"),
        tooltip=["policy:N", "request_class:N", alt.Tooltip("violation_rate:Q", format=".2%")],
    ).properties(width=WIDTH, height=HEIGHT, title="Violation rate per class")


def energy_share(m: MarketData) -> alt.Chart | None:
    """Energy's share of the cost per policy on both bases."""
    rows = [r for r in m.policies if r["energy_share"] is not None]
    if not rows:
        return None
    return alt.Chart(_data(rows)).mark_bar().encode(
        x=alt.X("policy:N", title=None),
        xOffset="basis:N",
        y=alt.Y("energy_share:Q", title="energy / total cost", axis=alt.Axis(format="%")),
        color=alt.Color("basis:N", title="cost basis"),
        tooltip=["policy:N", "basis:N", alt.Tooltip("energy_share:Q", format=".1%")],
    ).properties(width=WIDTH, height=HEIGHT, title="Energy share of cost")


def timeline(m: MarketData) -> alt.Chart | None:
    """Per decision: GPUs at the floors of the chosen plan and of the reference plan; fallbacks marked by kind."""
    rows = [d for d in m.decisions if d["chosen_gpus"] is not None]
    if not rows:
        return None
    long = [
        {**d, "plan": which, "gpus": d[f"{which}_gpus"]}
        for d in rows
        for which in ("chosen", "reference")
        if d[f"{which}_gpus"] is not None
    ]
    tip = ["policy:N", "seed:Q", "period:Q", "chosen_label:N", "reference_label:N", "fallback:N", "reason:N"]
    lines = alt.Chart(_data(long)).mark_line(interpolate="step-after").encode(
        x=_time(), y=alt.Y("gpus:Q", title="GPUs at the plan's floors"),
        color=alt.Color("plan:N", scale=alt.Scale(domain=["chosen", "reference"], range=["#4c78a8", "#bab0ac"])),
        strokeDash=alt.StrokeDash("policy:N"), detail="seed:N",
    )
    marks = alt.Chart(_data(rows)).mark_point(filled=True, size=60).encode(
        x=_time(), y="chosen_gpus:Q",
        shape=alt.Shape("reason_kind:N", title="fallback (kind)"),
        color=alt.condition("datum.fallback", alt.value("#e45756"), alt.value("#4c78a8")),
        tooltip=tip,
    )
    return (lines + marks).properties(
        width=WIDTH, height=HEIGHT, title="Decisions: chosen vs reference plan (red: fallback)"
    )


def fallbacks(m: MarketData) -> alt.Chart | None:
    """Fallbacks per reason kind."""
    rows = fallback_counts(m.decisions)
    if not rows:
        return None
    return alt.Chart(_data(rows)).mark_bar().encode(
        y=alt.Y("reason_kind:N", title="fallback reason"), x=alt.X("count:Q", title="decisions"),
        color="policy:N", tooltip=["policy:N", "reason_kind:N", "count:Q"],
    ).properties(width=WIDTH, height=max(60, 24 * len({r["reason_kind"] for r in rows})), title="Fallbacks by reason")


def regret(m: MarketData) -> alt.Chart | None:
    """Realized regret per audited decision, where the replay measured it."""
    rows = [d for d in m.decisions if d["realized_regret"] is not None]
    if not rows:
        return None
    return alt.Chart(_data(rows)).mark_point(filled=True).encode(
        x=_time(), y=alt.Y("realized_regret:Q", title="realized regret"), color="policy:N",
        tooltip=["policy:N", "seed:Q", "period:Q", alt.Tooltip("realized_regret:Q", format=".3f")],
    ).properties(width=WIDTH, height=HEIGHT, title="Realized regret per audited decision")


#: The figures in page order: (file stem, caption, builder).
FIGURES: tuple[tuple[str, str, Callable[[MarketData], alt.Chart | None]], ...] = (
    ("price", "Market price per control period; the shaded, grey part is the drain after the last arrival.", price),
    ("arrivals", "Requests arriving per period by class (the workload every policy served).", arrivals),
    ("warm_gpus", "Warm or loading GPUs per policy (mean per period; dashed: drain).", warm_gpus),
    ("gp_per_dollar", "Goodput per dollar on the rented and the owned cost basis; whiskers span the seeds.",
     gp_per_dollar),
    ("cost", "Total cost of the window and drain per policy, on both cost bases.", cost),
    ("violations", "SLA violation rate per class and policy.", violations),
    ("energy_share", "Energy's share of the total cost per policy.", energy_share),
    ("timeline", "Each decision: GPUs at the floors of the chosen and the reference plan; a red point is a "
     "fallback, its shape the reason (hover for the full reason).", timeline),
    ("fallbacks", "Fallbacks by reason.", fallbacks),
    ("regret", "Realized regret of the audited decisions (re-run against the simulator).", regret),
)
