"""ServeGen language m-large arrival-rate shape and its alignment to a market's local clock.

The bundled archive holds per-client 10-minute windows (data/servegen/SOURCE.md). The shape is the sum of
``rate`` over all 162 clients per window: a 14-day series (2016 windows) in requests/s.

Clock assumption (unverified by the source, documented in docs/workload.md): t = 0 is local midnight
(UTC+8) on a Monday. A market instant is mapped onto the shape by its *market-local* wall clock, so the
shape's hour of day and weekday match the market's: shape time = (local wall time - Monday 2018-01-01
00:00) mod 14 days. The rate is piecewise linear between window centres (t + 300 s), periodic over the 14
days.
"""

from __future__ import annotations

import io
import tarfile
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path

import numpy as np
import polars as pl

from streams.datasets.paths import data_dir

ARCHIVE = "language_m-large_trace_csvs.tar.gz"
SLOT_S = 600
#: A Monday at local midnight: the shape's t = 0 is mapped onto Mondays of even weeks since this date.
ANCHOR_MONDAY = datetime(2018, 1, 1)
_COLUMNS = {"timestamp": pl.Int64, "rate": pl.Float64, "cv": pl.Float64, "pat_name": pl.Utf8,
            "pat_arg1": pl.Float64, "pat_arg2": pl.Float64}


def _read(tf: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tf.extractfile(member)
    if f is None:
        raise ValueError(f"{member.name} is not a regular file")
    return f.read()


@lru_cache(maxsize=2)
def _shape(root: Path) -> tuple[np.ndarray, int]:
    with tarfile.open(root / "servegen" / ARCHIVE) as tf:  # sequential read: gzip cannot seek back
        blobs = {m.name: _read(tf, m) for m in tf if m.isfile() and m.name.endswith("-trace.csv")}
    total: np.ndarray | None = None
    for name in sorted(blobs):  # a fixed summation order keeps the float sum reproducible
        df = pl.read_csv(io.BytesIO(blobs[name]), has_header=False, new_columns=list(_COLUMNS),
                         schema_overrides=_COLUMNS)
        ts = df["timestamp"].to_numpy()
        if not np.array_equal(ts, np.arange(ts.size) * SLOT_S):
            raise ValueError(f"{name}: windows are not contiguous {SLOT_S}-s slots from 0")
        rate = df["rate"].to_numpy()
        total = rate.copy() if total is None else total + rate
    if total is None:
        raise FileNotFoundError(f"no client traces in {ARCHIVE}")
    total.setflags(write=False)
    return total, len(blobs)


def load_rate_shape() -> pl.DataFrame:
    """The m-large aggregate rate shape.

    Returns
    -------
    pl.DataFrame
        offset_s (i64, window start from the trace origin, s), rate_rps (f64, requests/s summed over
        all clients), 2016 rows = 14 days.
    """
    total, _ = _shape(data_dir())
    return pl.DataFrame({"offset_s": np.arange(total.size, dtype=np.int64) * SLOT_S, "rate_rps": total})


def shape_clients() -> int:
    """Number of client series summed into the shape."""
    return _shape(data_dir())[1]


def aligned_rate(tz: str, start: datetime, offsets_s: np.ndarray) -> np.ndarray:
    """Unscaled shape rate at ``start + offsets_s``, aligned to the ``tz`` wall clock.

    Parameters
    ----------
    tz : IANA zone of the market (its local hour of day and weekday index the shape).
    start : reference instant (tz-aware).
    offsets_s : offsets from ``start`` (s), any shape; resolved to the microsecond.

    Returns
    -------
    np.ndarray
        Shape rate (requests/s, before scaling) at each instant, float64, same shape as ``offsets_s``.
    """
    total, _ = _shape(data_dir())
    period_s = total.size * SLOT_S
    offsets = np.asarray(offsets_s, dtype=np.float64)
    start_us = pl.Series([start]).dt.convert_time_zone("UTC").dt.epoch("us")[0]
    instants_us = start_us + np.round(offsets.ravel() * 1e6).astype(np.int64)
    instants = pl.Series(instants_us).cast(pl.Datetime("us", "UTC"))
    wall_us = instants.dt.convert_time_zone(tz).dt.replace_time_zone(None).dt.epoch("us").to_numpy()
    anchor_us = (ANCHOR_MONDAY - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    since_anchor_s = (wall_us - anchor_us) / 1e6
    centres = np.arange(total.size) * SLOT_S + SLOT_S / 2
    rate = np.interp(np.mod(since_anchor_s, period_s), centres, total, period=period_s)
    return rate.reshape(offsets.shape)
