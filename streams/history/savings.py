"""Savings per UTC day of the replay range: SLA-met requests and cost on both bases per day, and each arm's
gp/$ gain over the as-deployed baseline per day (the totals are results.json's `gain_vs_as_deployed`).

A day's requests are those that arrived in it; its cost is that of the 10 s ticks in it
(`streams.replay.metrics.cost_between`), the drain after the range charged to the range's last day.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np

from streams.replay.driver import RunResult
from streams.replay.metrics import cost_between, request_outcomes


def day_bounds(start: datetime, window_s: float, end_s: float) -> list[tuple[str, float, float]]:
    """(UTC date, from s, to s) per day the range [start, start + window_s) touches; the last runs to end_s.

    >>> from datetime import UTC
    >>> day_bounds(datetime(2023, 4, 21, 18, tzinfo=UTC), 12 * 3600.0, 13 * 3600.0)
    [('2023-04-21', 0.0, 21600.0), ('2023-04-22', 21600.0, 46800.0)]
    """
    midnight = datetime(start.year, start.month, start.day, tzinfo=start.tzinfo) + timedelta(days=1)
    cuts = [0.0]
    while (midnight - start).total_seconds() < window_s:
        cuts.append((midnight - start).total_seconds())
        midnight += timedelta(days=1)
    cuts.append(max(end_s, window_s))
    return [
        ((start + timedelta(seconds=lo)).date().isoformat(), lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)
    ]


def per_day(run: RunResult, window_s: float) -> list[dict[str, Any]]:
    """One row per day: day, sla_met (count), cost_usd and cost_usd_owned ($), gp_per_dollar(_owned)."""
    o = request_outcomes(run)
    arrival = run.runtime.req.arrival
    rows = []
    for day, lo, hi in day_bounds(run.workload.window.start, window_s, run.end_s):
        met = int(o["sla_met"][(arrival >= lo) & (arrival < hi)].sum())
        c = cost_between(run, lo, hi)
        rows.append(
            {
                "day": day,
                "sla_met": met,
                "cost_usd": c["cost_usd"],
                "cost_usd_owned": c["cost_usd_owned"],
                "gp_per_dollar": met / c["cost_usd"],
                "gp_per_dollar_owned": met / c["cost_usd_owned"],
            }
        )
    return rows


def daily_gains(by_seed: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, list[dict[str, Any]]]:
    """Per arm and day: gp/$ on both bases (mean over seeds) and the gain over `baseline`'s that day.

    by_seed : arm -> its per-seed summaries (each with `per_day`)."""
    mean = {
        arm: {
            d["day"]: {
                k: float(np.mean([s["per_day"][i][k] for s in seeds])) for k in ("gp_per_dollar", "gp_per_dollar_owned")
            }
            for i, d in enumerate(seeds[0]["per_day"])
        }
        for arm, seeds in by_seed.items()
    }
    base = mean[baseline]
    return {
        arm: [
            {
                "day": day,
                **v,
                "gain_vs_as_deployed": {
                    "rented": v["gp_per_dollar"] / base[day]["gp_per_dollar"] - 1.0,
                    "owned": v["gp_per_dollar_owned"] / base[day]["gp_per_dollar_owned"] - 1.0,
                },
            }
            for day, v in days.items()
        ]
        for arm, days in mean.items()
    }
