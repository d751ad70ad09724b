"""Calibrated intervals from rolling residuals, adaptive conformal correction, and the confidence score.

Intervals (split-conformal on signed residuals, per step ahead): at an origin o, the residuals
r = y - issued point of the forecasts issued at earlier origins whose targets are known by o form, for each
step ahead h, a sample (pooled with the neighbouring steps h-2..h+2). The 80% interval is
point + [Q(a/2), Q(1 - a/2)] with a = 0.2 - adj80, likewise 95%. adj is adaptive conformal inference
(Gibbs & Candes 2021): after each origin adj += gamma * (miss rate of newly scored pairs - nominal miss).

Confidence (0-1), documented in docs/forecasting.md:
    sharpness = 1 / (1 + mean 80% width / mean |level of the last season|)
    reliability = min(1, recent 80% coverage / 0.8)     (targets within the last `recent` steps)
    confidence = sharpness * reliability
"""

from __future__ import annotations

import numpy as np

LEVELS = (80, 95)
NOMINAL_MISS = {80: 0.2, 95: 0.05}


def interval_offsets(residuals: np.ndarray, horizon: int, adj: dict[int, float], pool: int = 2,
                     min_n: int = 20, rows: dict[int, int] | None = None) -> np.ndarray | None:
    """Offsets (4, horizon) to add to the point: rows lo80, hi80, lo95, hi95; None when too few residuals.

    Parameters
    ----------
    residuals : (origins, steps) signed residuals y - point (series unit), NaN where unknown.
    horizon : steps wanted; steps beyond the residuals' width reuse the last column.
    adj : adaptive correction of the miss rate per level (0-1 probability units).
    pool : neighbouring steps pooled on each side.
    min_n : fewest finite residuals a step needs.
    rows : per level, the most recent origins (last rows) its quantiles use; default all.
    """
    if residuals.size == 0:
        return None
    width = residuals.shape[1]
    cols = np.minimum(np.arange(horizon), width - 1)
    q = np.empty((2 * len(LEVELS), width))
    for i, lvl in enumerate(LEVELS):
        a = float(np.clip(NOMINAL_MISS[lvl] - adj[lvl], NOMINAL_MISS[lvl] / 5, 2 * NOMINAL_MISS[lvl]))
        recent = residuals[-(rows or {}).get(lvl, len(residuals)):]
        pad = np.pad(recent, ((0, 0), (pool, pool)), constant_values=np.nan)
        pooled = np.stack([pad[:, c: c + 2 * pool + 1].ravel() for c in range(width)])
        n = np.sum(np.isfinite(pooled), axis=1)
        if np.min(n) < min_n:
            return None
        srt = np.sort(pooled, axis=1)  # NaN sort last
        at = np.arange(width)
        for j, level in enumerate((a / 2, 1 - a / 2)):  # linear interpolation between order statistics
            pos = level * (n - 1)
            lo = np.floor(pos).astype(int)
            hi = np.minimum(lo + 1, n - 1)
            q[2 * i + j] = srt[at, lo] + (pos - lo) * (srt[at, hi] - srt[at, lo])
    return q[:, cols]


def fallback_offsets(filled: np.ndarray, season: int, horizon: int) -> np.ndarray:
    """Offsets (4, horizon) from in-sample seasonal-naive errors (first differences on short series)."""
    lag = season if len(filled) > 2 * season else 1
    d = filled[lag:] - filled[:-lag] if len(filled) > lag else np.zeros(1)
    q = np.quantile(d, [0.1, 0.9, 0.025, 0.975])
    return np.repeat(q[:, None], horizon, axis=1)


def aci_step(adj: dict[int, float], misses: dict[int, np.ndarray], gamma: float) -> dict[int, float]:
    """One adaptive-conformal update from the miss indicators (0/1) newly scored at an origin."""
    out = dict(adj)
    for lvl in LEVELS:
        m = misses[lvl]
        if len(m):
            out[lvl] = float(np.clip(adj[lvl] + gamma * float(np.sum(m - NOMINAL_MISS[lvl])),
                                     -NOMINAL_MISS[lvl], 0.8 * NOMINAL_MISS[lvl]))
    return out


def confidence(width80: np.ndarray, level: float, recent_coverage80: float | None) -> float:
    """Confidence in [0, 1] from relative 80% width and recent realized 80% coverage (None: not yet known)."""
    rel = float(np.mean(width80)) / max(abs(level), 1e-9)
    sharp = 1.0 / (1.0 + rel)
    reliability = 1.0 if recent_coverage80 is None else min(1.0, recent_coverage80 / 0.8)
    return float(np.clip(sharp * reliability, 0.0, 1.0))
