"""The as-of store: the only way any forecaster reads its history.

Every observation is kept with its event time (the grid interval it describes) and its arrival time (when it
reached us: publication for prices, completion for output lengths). `AsOfStore.view(as_of)` returns a
read-only `SeriesView` built from the observations with ``arrived_at <= as_of`` and nothing else, so a
forecast as of t cannot see a later observation even when it has already been stored.

Times are int64 microseconds since the Unix epoch (UTC) inside the package; `to_us` converts.

Examples
--------
>>> from datetime import datetime, timezone
>>> s = AsOfStore(step_s=3600.0)
>>> t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
>>> _ = s.update(10.0, to_us(t0), to_us(t0) + 3_600_000_000)
>>> _ = s.update(11.0, to_us(t0) + 3_600_000_000, to_us(t0) + 7_200_000_000)
>>> s.view(to_us(t0) + 3_600_000_000).values.tolist()
[10.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np

from schemas.timestamps import from_us, to_us


def as_us_array(ts: object) -> np.ndarray:
    """int64 microseconds of a sequence of datetimes, a datetime64 array or a polars Datetime series."""
    arr = ts.to_numpy() if hasattr(ts, "to_numpy") else ts
    arr = np.asarray(arr)
    if np.issubdtype(arr.dtype, np.datetime64):
        return arr.astype("datetime64[us]").astype(np.int64)
    if arr.dtype == object:
        return np.fromiter((to_us(t) for t in arr), dtype=np.int64, count=len(arr))
    return arr.astype(np.int64)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class SeriesView:
    """What had arrived by `as_of_us`, on a regular grid.

    Parameters
    ----------
    start_index : grid index of ``values[0]`` (event time // step, both in microseconds).
    step_us : grid step (microseconds).
    values : observed values (the series' unit), NaN where nothing had arrived; read-only.
    filled : ``values`` with gaps filled from one season earlier, else the previous value; read-only.
    as_of_us : the instant the view was taken (microseconds since the epoch).
    """

    start_index: int
    step_us: int
    values: np.ndarray
    filled: np.ndarray
    as_of_us: int

    def __len__(self) -> int:
        return len(self.values)

    @property
    def end_index(self) -> int:
        """Grid index one past the last observed interval."""
        return self.start_index + len(self.values)

    def until(self, end_index: int) -> SeriesView:
        """The prefix of this view with grid index < `end_index` (a forecast origin)."""
        n = max(0, min(len(self.values), end_index - self.start_index))
        return SeriesView(self.start_index, self.step_us, self.values[:n], self.filled[:n], self.as_of_us)

    def time_of(self, index: int) -> datetime:
        """Start of the grid interval `index` (UTC)."""
        return from_us(index * self.step_us)


class AsOfStore:
    """Append-only observations (y, event time, arrival time); reads only through `view`.

    Parameters
    ----------
    step_s : grid step of the series (s); an event time is snapped down to its grid interval.
    season : steps per season, used only to fill gaps in `SeriesView.filled`.
    """

    def __init__(self, step_s: float, season: int = 24) -> None:
        self.step_us = int(round(step_s * 1e6))
        self.season = season
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._cat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return sum(len(c[0]) for c in self._chunks)

    def update(self, y: float, event_us: int, arrived_us: int) -> AsOfStore:
        """Store one observation (value, event and arrival time in microseconds)."""
        return self.update_many(np.array([y], float), np.array([event_us]), np.array([arrived_us]))

    def update_many(self, y: np.ndarray, event_us: np.ndarray, arrived_us: np.ndarray) -> AsOfStore:
        """Store a micro-batch; the inputs are copied, never modified."""
        y = np.array(y, dtype=float, copy=True)
        idx = np.asarray(event_us, dtype=np.int64) // self.step_us
        arr = np.array(arrived_us, dtype=np.int64, copy=True)
        if not (len(y) == len(idx) == len(arr)):
            raise ValueError("y, event times and arrival times differ in length")
        if np.any(~np.isfinite(y)):
            raise ValueError("observations must be finite")
        self._chunks.append((y, idx, arr))
        self._cat = None
        return self

    def _all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._cat is None:
            if not self._chunks:
                empty = np.empty(0)
                self._cat = (empty, empty.astype(np.int64), empty.astype(np.int64))
            else:
                self._cat = tuple(np.concatenate([c[i] for c in self._chunks]) for i in range(3))  # type: ignore[assignment]
                self._chunks = [self._cat]  # type: ignore[list-item]
        return self._cat  # type: ignore[return-value]

    def view(self, as_of_us: int) -> SeriesView | None:
        """The series as known at `as_of_us`: only observations with arrival time <= as_of_us.

        When one interval was observed more than once, the latest arrival (<= as_of) wins.
        Returns None when nothing had arrived.
        """
        y, idx, arr = self._all()
        keep = arr <= as_of_us
        if not keep.any():
            return None
        y, idx, arr = y[keep], idx[keep], arr[keep]
        if len(arr) > 1 and np.any(np.diff(arr) < 0):
            order = np.argsort(arr, kind="stable")
            y, idx = y[order], idx[order]
        start = int(idx.min())
        values = np.full(int(idx.max()) - start + 1, np.nan)
        values[idx - start] = y  # later arrivals overwrite earlier ones
        filled = fill_gaps(values, self.season)
        return SeriesView(start, self.step_us, _readonly(values), _readonly(filled), as_of_us)


def fill_gaps(values: np.ndarray, season: int) -> np.ndarray:
    """Copy of `values` with NaN replaced by the value one season earlier, else the last finite value."""
    out = values.copy()
    bad = np.flatnonzero(np.isnan(out))
    for i in bad:
        j = i - season
        out[i] = out[j] if j >= 0 and not np.isnan(out[j]) else (out[i - 1] if i > 0 else np.nan)
    if np.isnan(out).any():  # leading gaps cannot occur (a view starts at an observation); keep it safe
        out[np.isnan(out)] = np.nanmean(out) if np.isfinite(out).any() else 0.0
    return out


def first_mismatch(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two arrays, NaN equal to NaN."""
    n = min(len(a), len(b))
    same = (a[:n] == b[:n]) | (np.isnan(a[:n]) & np.isnan(b[:n]))
    bad = np.flatnonzero(~same)
    return int(bad[0]) if len(bad) else n
