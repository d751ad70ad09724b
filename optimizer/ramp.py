"""The ramp inside the period just observed: a least-squares line through each class's per-minute arrival
counts, for the scale-up guard (optimizer/scale_guard.py).

The forecasts persist the last period's mean rate, and the guard's trend term carries on the rise between two
periods' means; both trail a ramp that is still climbing when the period closes (CAISO's 2023 default window,
seed 2: chat rose from 1,024 to 1,814 requests a minute inside period 17; its mean, 23.5 req/s, carried on by its
rise since period 16 asked for about 31.6, and period 18 brought 39.6). A line through the minute counts sees the
climb at the decision. It is used only where its slope is positive beyond the minute counts' own scatter (a one-sided
test at `RAMP_CONFIDENCE`), so a flat period's noise or a single busy minute does not read as a ramp.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import polars as pl
from scipy import stats

from schemas.provenance import Provenance, Tagged

_CONVENTION = "a convention (the minute: the history's arrival grain; 95% one-sided), not fitted to any window"
#: Width of a count bin (s).
RAMP_BIN_S = Tagged(60.0, "s", Provenance.MODELED, _CONVENTION)
#: One-sided confidence that the slope is positive before a line counts as a ramp (probability).
RAMP_CONFIDENCE = Tagged(0.95, "probability", Provenance.MODELED, _CONVENTION)


@dataclass(frozen=True)
class RampLine:
    """A class's arrival rate as a line in time: `level` (req/s) at `as_of`, `slope` (req/s per s)."""

    as_of: datetime
    level: float
    slope: float

    def at(self, t: datetime) -> float:
        """The line's rate at instant `t` (req/s, never below 0).

        >>> from datetime import timezone
        >>> t0 = datetime(2023, 8, 17, 1, 30, tzinfo=timezone.utc)
        >>> RampLine(t0, 30.0, 0.05).at(t0 + timedelta(minutes=3))
        39.0
        """
        return max(0.0, self.level + self.slope * (t - self.as_of).total_seconds())


def ramp_lines(
    arrivals: pl.DataFrame,
    as_of: datetime,
    period_s: float,
    bin_s: float = RAMP_BIN_S.value,
    since: datetime | None = None,
) -> dict[tuple[str, str], RampLine]:
    """Per (class, model) whose rate rose inside (as_of - period_s, as_of] beyond the scatter of its per-bin
    counts, the least-squares line through those counts (req/s); nothing for the other classes, or for a period
    of fewer than 3 bins observed. `since`: the first instant the arrivals cover (a worker started without history
    sees only the end of its first period): bins ending by then are left out and the bin it falls in is a rate over
    its observed seconds; None: the whole period observed.

    >>> from datetime import timezone
    >>> t0 = datetime(2023, 8, 17, 1, 30, tzinfo=timezone.utc)
    >>> def minutes(counts):  # arrivals spread evenly over each of the last len(counts) minutes before t0
    ...     at = [t0 - timedelta(seconds=60 * (len(counts) - m) - (i + 0.5) * 60 / n)
    ...           for m, n in enumerate(counts) for i in range(n)]
    ...     return pl.DataFrame({"event_at": at, "request_class": "chat", "model": "llama-3.1-70b"})
    >>> ramp = minutes([1024, 1194, 1396, 1617, 1814])  # chat a minute, CAISO 2023-08-17 seed 2, period 17
    >>> line = ramp_lines(ramp, t0, 300.0)[("chat", "llama-3.1-70b")]
    >>> round(line.at(t0 + timedelta(minutes=2, seconds=30)), 1)  # the next period's middle (realized: 39.6)
    40.2
    >>> dipped = minutes([1000, 1100, 1200, 1300, 1000])
    >>> ramp_lines(dipped, t0, 300.0)
    {}
    >>> after = dipped.head(400).with_columns(pl.lit(t0 + timedelta(seconds=1)).alias("event_at"))
    >>> ramp_lines(pl.concat([dipped, after]), t0, 300.0)  # arrivals after as_of are never read
    {}
    >>> ramp_lines(minutes([1636, 1625, 1552, 1581, 1594]), t0, 300.0)  # ERCOT 2023-08-25 seed 0, period 2
    {}
    >>> ramp_lines(minutes([1600, 1610, 1590, 1605, 2400]), t0, 300.0)  # one busy minute is no ramp
    {}
    >>> late = minutes([0, 0, 800, 1600, 1600])  # a worker that started 2.5 minutes in: flat, not a climb
    >>> sorted(ramp_lines(late, t0, 300.0)), ramp_lines(late, t0, 300.0, since=t0 - timedelta(seconds=150))
    ([('chat', 'llama-3.1-70b')], {})
    """
    n_bins = int(period_s // bin_s)
    if n_bins < 3 or arrivals.height == 0:
        return {}
    start = as_of - timedelta(seconds=n_bins * bin_s)
    recent = arrivals.filter((pl.col("event_at") > start) & (pl.col("event_at") <= as_of))
    if recent.height == 0:
        return {}
    offset = (pl.col("event_at") - start).dt.total_microseconds() / 1e6
    binned = recent.with_columns((offset // bin_s).clip(0, n_bins - 1).cast(pl.Int64).alias("_bin"))
    # observed seconds per bin (s): the whole bin, less what came before `since`
    lead = (since - start).total_seconds() if since is not None and since > start else 0.0
    seen = np.clip((np.arange(n_bins) + 1) * bin_s - lead, 0.0, bin_s)
    keep = seen > 0
    n_seen = int(keep.sum())
    if n_seen < 3:
        return {}
    # bin centres relative to as_of (s): -(n - 0.5) bin .. -0.5 bin
    x = ((np.arange(n_bins) + 0.5) * bin_s - n_bins * bin_s)[keep]
    critical = float(stats.t.ppf(RAMP_CONFIDENCE.value, n_seen - 2))
    out: dict[tuple[str, str], RampLine] = {}
    for (cls, model), part in binned.group_by("request_class", "model"):
        y = np.bincount(part["_bin"].to_numpy(), minlength=n_bins)[keep] / seen[keep]
        slope, intercept = np.polyfit(x, y, 1)
        resid = y - (intercept + slope * x)
        se = float(np.sqrt(resid @ resid / (n_seen - 2) / ((x - x.mean()) @ (x - x.mean()))))
        if slope > 0 and (se == 0.0 or slope / se > critical):
            out[(str(cls), str(model))] = RampLine(as_of, float(intercept), float(slope))
    return out
