"""From observation records to the per-period series the forecasters learn.

Every value gets an event time (the period it describes) and an arrival time (when it became known):
- arrivals per class: requests whose event_at falls in the period; known at the period's close;
- input tokens p50/p90 per class: from arrival records (prompt sizes are known at arrival);
- output tokens p50/p90 per class: from completion records, by completion period: an output length exists
  only once its request completed, so it enters at its completion time (known at that period's close);
- prefix reuse per class: share of an arrival's prefix blocks already seen in the previous `reuse_periods`
  periods (policy-independent; 0-1);
- history (DESIGN.md "History"): per-minute arrivals and per-period size quantiles, all known at their
  period's end.

Nothing here is sized by the time range its records span (a record stamped in year 1 or 9999 beside 2023
data costs one entry, not billions): `period_counts` fills empty periods with zeros only across gaps of at
most `max_gap_periods`, and `PeriodAggregator` emits (and zero-fills) only the periods that ended within
`max_age_s` of the close instant, dropping (and counting) records of older periods.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import numpy as np
import polars as pl

from forecasting.store import as_us_array, to_us
from schemas.protocol import CLASSES

#: Default of `period_counts`' max_gap_periods and `PeriodAggregator`'s max_age_s: 8 days (the 7-day history
#: and a day), in periods of 300 s and in seconds.
MAX_GAP_PERIODS = 2304
MAX_AGE_S = 8 * 86_400.0


def period_grid(periods: np.ndarray, max_gap_periods: int = MAX_GAP_PERIODS) -> np.ndarray:
    """The sorted distinct `periods` with every gap of at most `max_gap_periods` empty periods filled in.

    Its size is bounded by the data (distinct periods times the gap cap), never by the span: two periods
    years apart give two entries.

    >>> period_grid(np.array([7, 3, 5, 1000]), max_gap_periods=2).tolist()
    [3, 4, 5, 6, 7, 1000]
    """
    uniq = np.unique(np.asarray(periods, dtype=np.int64))
    if len(uniq) < 2:
        return uniq
    step = np.diff(uniq)
    length = np.where(step <= max_gap_periods + 1, step, 1)  # entries each present period stands for
    first = np.repeat(uniq[:-1], length)
    offset = np.arange(len(first)) - np.repeat(np.cumsum(length) - length, length)
    return np.concatenate([first + offset, uniq[-1:]])


def period_counts(per_minute: pl.DataFrame, requests: pl.DataFrame | None, window_start: datetime,
                  period_s: float = 300.0, max_gap_periods: int = MAX_GAP_PERIODS,
                  ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per-class request counts per period from history (minute_at, request_class, requests) and, optionally,
    a replay's requests (arrival_s since `window_start`, request_class).

    Returns class -> (counts, event_us, arrived_us) with arrived = period end, over `period_grid`: empty
    periods count 0 across gaps of at most `max_gap_periods`; a longer gap is left out (the event times jump).
    """
    p_us = int(round(period_s * 1e6))
    w0 = to_us(window_start)
    parts = [(as_us_array(per_minute["minute_at"]), per_minute["request_class"].to_numpy(),
              per_minute["requests"].to_numpy().astype(float))]
    if requests is not None and len(requests):
        at = w0 + (requests["arrival_s"].to_numpy() * 1e6).astype(np.int64)
        parts.append((at, requests["request_class"].to_numpy(), np.ones(len(requests))))
    t = np.concatenate([p[0] for p in parts]) // p_us
    cls = np.concatenate([p[1] for p in parts]).astype(str)
    n = np.concatenate([p[2] for p in parts])
    grid = period_grid(t, max_gap_periods)
    pos = np.searchsorted(grid, t)
    out = {}
    for c in CLASSES:
        m = cls == c
        counts = np.bincount(pos[m], weights=n[m], minlength=len(grid))
        out[c] = (counts, grid * p_us, (grid + 1) * p_us)
    return out


class PeriodAggregator:
    """Buckets arrival and completion records by period and emits each period's values once it has closed.

    Parameters
    ----------
    period_s : control period (s).
    reuse_periods : how far back (periods) a prefix block counts as seen for the reuse rate.
    max_age_s : `close` emits only periods that ended within this of its instant (s): older ones, and their
        records, are dropped (`dropped_records`); the zero-fill of empty periods never reaches further back.
        What the aggregator holds is bounded by its records, whatever span their event times cover.
    """

    def __init__(self, period_s: float = 300.0, reuse_periods: int = 12, max_age_s: float = MAX_AGE_S) -> None:
        self.period_us = int(round(period_s * 1e6))
        self.reuse_periods = reuse_periods
        self.max_age_periods = max(1, int(max_age_s // period_s))
        self.dropped_records = 0
        self._counts: dict[tuple[int, str], int] = defaultdict(int)
        self._inputs: dict[tuple[int, str], list[np.ndarray]] = defaultdict(list)
        self._outputs: dict[tuple[int, str], list[np.ndarray]] = defaultdict(list)
        self._reuse: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self._seen: dict[int, int] = {}
        self._open: set[int] = set()
        self._closed_until: int | None = None

    def _by_period(self, df: pl.DataFrame, col: str) -> pl.DataFrame:
        per = (pl.col("event_at").dt.epoch("us") // self.period_us).alias("period")
        return df.with_columns(per).group_by(["period", "request_class"]).agg(pl.len().alias("n"), pl.col(col))

    def update_arrivals(self, df: pl.DataFrame) -> None:
        """Arrival records (event_at, request_class, input_tokens, prefix_block_ids)."""
        if not len(df):
            return
        for period, c, n, tok in self._by_period(df, "input_tokens").iter_rows():
            self._counts[(period, c)] += n
            self._inputs[(period, c)].append(np.asarray(tok, dtype=float))
            self._open.add(period)
        if "prefix_block_ids" not in df.columns:
            return
        ex = (df.with_row_index("row")
              .select("row", (pl.col("event_at").dt.epoch("us") // self.period_us).alias("period"),
                      "request_class", pl.col("prefix_block_ids").alias("block"))
              .explode("block").drop_nulls("block").sort(["block", "period", "row"]))
        if not len(ex):
            return
        b, per = ex["block"].to_numpy(), ex["period"].to_numpy()
        first = np.concatenate([[True], b[1:] != b[:-1]])  # first sighting of a block in this batch
        prev = np.concatenate([[0], per[:-1]])
        uniq = b[first]
        seen = np.array([self._seen.get(int(x), -(10**12)) for x in uniq], dtype=np.int64)
        prev[first] = seen
        hit = per - prev <= self.reuse_periods
        last = np.concatenate([first[1:], [True]])
        self._seen.update(zip(b[last].tolist(), per[last].tolist(), strict=True))
        counts = (ex.with_columns(hit=pl.Series(hit)).group_by(["period", "request_class"])
                  .agg(pl.col("hit").sum(), pl.len().alias("n")))
        for period, c, h, n in counts.iter_rows():
            self._reuse[(period, c)][0] += h
            self._reuse[(period, c)][1] += n

    def update_completions(self, df: pl.DataFrame) -> None:
        """Completion records (event_at = completion, request_class, output_tokens)."""
        if not len(df):
            return
        for period, c, _, tok in self._by_period(df, "output_tokens").iter_rows():
            self._outputs[(period, c)].append(np.asarray(tok, dtype=float))
            self._open.add(period)

    def held(self) -> int:
        """Entries the aggregator holds (open periods and per-period buckets): bounded by its records."""
        return len(self._open) + len(self._counts) + len(self._inputs) + len(self._outputs) + len(self._reuse)

    def _drop_before(self, floor: int) -> None:
        """Forget every period before `floor` (records stamped too long before the close instant)."""
        for period in [p for p in self._open if p < floor]:
            self._open.discard(period)
            for c in CLASSES:
                self.dropped_records += self._counts.get((period, c), 0)
                self.dropped_records += sum(len(a) for a in self._outputs.get((period, c), ()))
        for d in (self._counts, self._inputs, self._outputs, self._reuse):
            for key in [k for k in d if k[0] < floor]:
                del d[key]

    def close(self, as_of_us: int) -> list[tuple[str, float, int, int]]:
        """Values of every period that ended by `as_of_us` and got records: (series, y, event_us, arrived_us).

        Arrival counts are emitted for every ended period (0 when none arrived) back to the first period with
        records, within `max_age_s`; a period that gets late records after it was emitted is emitted again
        (the later arrival wins). Periods that ended more than `max_age_s` before `as_of_us` are dropped.
        """
        out = []
        ended = as_of_us // self.period_us
        floor = ended - self.max_age_periods
        self._drop_before(floor)
        start = self._closed_until if self._closed_until is not None else min(self._open, default=ended)
        if self._closed_until is None and start > ended:  # only future periods so far: zero-fill from the first
            return []
        todo = {x for x in self._open if x < ended} | set(range(max(start, floor), ended))
        self._closed_until = max(ended, start)
        for period in sorted(todo):
            ev = period * self.period_us
            for c in CLASSES:
                key = (period, c)
                out.append((f"arrivals/{c}", float(self._counts.get(key, 0)), ev, as_of_us))
                if key in self._inputs:
                    tok = np.concatenate(self._inputs[key])
                    out.append((f"input_p50/{c}", float(np.quantile(tok, 0.5)), ev, as_of_us))
                    out.append((f"input_p90/{c}", float(np.quantile(tok, 0.9)), ev, as_of_us))
                    hit, tot = self._reuse[key]
                    if tot:
                        out.append((f"prefix_reuse/{c}", hit / tot, ev, as_of_us))
                if key in self._outputs:
                    tok = np.concatenate(self._outputs[key])
                    out.append((f"output_p50/{c}", float(np.quantile(tok, 0.5)), ev, as_of_us))
                    out.append((f"output_p90/{c}", float(np.quantile(tok, 0.9)), ev, as_of_us))
            self._open.discard(period)
        return out
