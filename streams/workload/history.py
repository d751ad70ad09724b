"""The 7 days before the window, as aggregates only (DESIGN.md "History").

Protocol mode continues the window's own process backward in time: per-minute, per-class counts are
Poisson draws of the same scaled, clock-aligned rate (with the history's own random stream), and sizes
continue each class's trace backward from the window's offset (the request just before the window takes
the trace row before the offset). Pure-trace mode repeats the replayed trace backward, one copy per
``ceil(trace span / period)`` periods. Size quantiles are numpy "linear" quantiles per control period of
``protocol.period_s``; a period without requests has nulls.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl

from schemas.availability import visible
from schemas.policy import History
from schemas.protocol import Protocol, RequestClass
from streams.workload.rate import RateProfile

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
MINUTE_S = 60
SIZE_COLUMNS = ("input_tokens", "output_tokens")


def _minutes(protocol: Protocol) -> tuple[int, int]:
    """(history minutes, minutes per control period)."""
    if protocol.period_s % MINUTE_S:
        raise ValueError(f"history aggregates need whole-minute periods, got {protocol.period_s} s")
    return protocol.history_days * 1440, int(protocol.period_s // MINUTE_S)


def _per_minute(start: datetime, counts: dict[RequestClass, np.ndarray]) -> pl.DataFrame:
    n = len(next(iter(counts.values())))
    minute_at = pl.datetime_range(start, start + timedelta(minutes=n - 1), "1m", time_unit="us", eager=True)
    frames = [
        pl.DataFrame({"minute_at": minute_at, "request_class": c.value, "requests": k.astype(np.int64)})
        for c, k in counts.items()
    ]
    return pl.concat(frames).sort("minute_at", maintain_order=True)


def _block_quantiles(values: np.ndarray, first: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Quantiles (rows: blocks, cols: QUANTILES) of cyclic blocks ``values[first : first + size]``.

    Same result as ``np.quantile(block, q)`` (method "linear"), without its per-call overhead.
    """
    out = np.full((sizes.size, len(QUANTILES)), np.nan)
    if not sizes.any():
        return out
    n = values.size
    reps = int(np.ceil(sizes.max() / n)) + 1
    ext = np.tile(values, reps)  # any cyclic block is one slice of this; integer partition is fastest
    start = np.mod(first, n)
    qs = np.array([q for _, q in QUANTILES])
    for i in np.flatnonzero(sizes):
        pos = qs * (sizes[i] - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, sizes[i] - 1)
        part = np.partition(ext[start[i] : start[i] + sizes[i]], sorted({*lo.tolist(), *hi.tolist()}))
        a, b = part[lo].astype(np.float64), part[hi].astype(np.float64)
        out[i] = a + (pos - lo) * (b - a)
    return out


def _quantile_frame(
    start: datetime, period_s: float, per_class: dict[RequestClass, tuple[np.ndarray, np.ndarray]]
) -> pl.DataFrame:
    """Size quantile frame from per-class (input, output) quantile arrays of shape (periods, 3)."""
    frames = []
    for c, (inp, out) in per_class.items():
        n = inp.shape[0]
        period_at = pl.datetime_range(
            start, start + timedelta(seconds=period_s * (n - 1)), timedelta(seconds=period_s),
            time_unit="us", eager=True,
        )
        cols: dict[str, object] = {"period_at": period_at, "request_class": c.value}
        for j, (name, _) in enumerate(QUANTILES):
            cols[f"input_tokens_{name}"] = inp[:, j]
        for j, (name, _) in enumerate(QUANTILES):
            cols[f"output_tokens_{name}"] = out[:, j]
        frames.append(pl.DataFrame(cols).fill_nan(None))
    return pl.concat(frames).sort("period_at", maintain_order=True)


def history_prices(prices: pl.DataFrame, start: datetime, as_of: datetime) -> pl.DataFrame:
    """Price rows from ``start`` on that were published by ``as_of`` (day-ahead rows may lie past it)."""
    return visible(prices.filter(pl.col("interval_start") >= start), as_of)


def protocol_history(
    profile: RateProfile,
    traces: dict[RequestClass, pl.DataFrame],
    offsets: dict[RequestClass, int],
    gen: np.random.Generator,
    prices: pl.DataFrame,
    protocol: Protocol,
) -> History:
    """History of the protocol process ending at ``profile.start`` (the window start).

    Parameters
    ----------
    profile : the window's scaled rate (t = 0 at the window start).
    traces : per-class size traces (time order).
    offsets : per-class trace row of the window's first request.
    gen : the history's random stream.
    prices : the market's price rows (with published_at).
    protocol : shares, history length and period.
    """
    minutes, per_period = _minutes(protocol)
    start = profile.start - timedelta(minutes=minutes)
    _, _, cum = profile.grid(-minutes * 60.0, 0.0)
    expected = np.diff(cum)
    counts = {c.name: gen.poisson(c.share * expected) for c in protocol.classes}
    quantiles = {}
    for c, k in counts.items():
        trace = traces[c]
        per = k.reshape(-1, per_period).sum(axis=1)
        first = offsets[c] - int(per.sum()) + np.concatenate([[0], np.cumsum(per)[:-1]])
        quantiles[c] = tuple(_block_quantiles(trace[col].to_numpy(), first, per) for col in SIZE_COLUMNS)
    return History(
        arrivals_per_minute=_per_minute(start, counts),
        size_quantiles=_quantile_frame(start, protocol.period_s, quantiles),
        prices=history_prices(prices, start, profile.start),
    )


def trace_history(
    requests: pl.DataFrame, window_start: datetime, prices: pl.DataFrame, protocol: Protocol
) -> History:
    """History of a replayed trace: the trace repeated backward from the window start.

    Parameters
    ----------
    requests : the replayed requests (arrival_s from the window start, request_class, input_tokens,
        output_tokens).
    window_start : UTC window start.
    prices : the market's price rows (with published_at).
    protocol : history length, period and the classes reported.
    """
    minutes, per_period = _minutes(protocol)
    start = window_start - timedelta(minutes=minutes)
    copy_periods = max(1, int(np.ceil((requests["arrival_s"].max() or 0.0) / protocol.period_s + 1e-9)))
    copy_minutes = copy_periods * per_period
    # history minute i sits at -minutes + i, which is ((-minutes + i) mod copy) minutes into the copy
    minute_pos = np.mod(np.arange(minutes) - minutes, copy_minutes)
    period_pos = minute_pos[::per_period] // per_period
    counts, quantiles = {}, {}
    for spec in protocol.classes:
        rows = requests.filter(pl.col("request_class") == spec.name.value)
        minute = np.floor(rows["arrival_s"].to_numpy() / MINUTE_S).astype(np.int64)
        counts[spec.name] = np.bincount(minute, minlength=copy_minutes)[minute_pos]
        per = np.bincount(minute // per_period, minlength=copy_periods)
        first = np.concatenate([[0], np.cumsum(per)[:-1]])
        quantiles[spec.name] = tuple(
            _block_quantiles(rows[col].to_numpy(), first, per)[period_pos] for col in SIZE_COLUMNS
        )
    return History(
        arrivals_per_minute=_per_minute(start, counts),
        size_quantiles=_quantile_frame(start, protocol.period_s, quantiles),
        prices=history_prices(prices, start, window_start),
    )
