"""Rolling-origin backtest of one series: forecast at each origin from what had arrived, then score.

Definitions (docs/forecasting.md holds the same as formulas):
- scale at origin o: mean |y_t - y_{t-s}| over every observed t < o (in-sample seasonal naive MAE, s = season);
- mase = mean over origins and steps h = 1..H of |y - point| / scale;
- mase_snaive_day / mase_snaive_week: the same for seasonal naive lag s and lag one week (also only from data
  known at o); mase_seasonal_naive = the better of the two (the week naive only where it exists for 90% of
  the scored pairs: a 7-day history leaves it undefined for most arrival origins, and it is then NaN);
- coverage_80/95: share of (origin, h) whose realized value lies in the interval; width_80/95: mean width
  (series unit).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from forecasting.base import Forecaster
from forecasting.models.naive import seasonal_naive
from forecasting.store import fill_gaps, from_us


@dataclass
class Scores:
    """Per (origin, step) arrays collected by `backtest`; group labels per origin (e.g. the year)."""

    err: np.ndarray
    err_day: np.ndarray
    err_week: np.ndarray
    scale: np.ndarray
    in80: np.ndarray
    in95: np.ndarray
    w80: np.ndarray
    w95: np.ndarray
    models: list[str]
    groups: list[str]

    def summary(self, mask: np.ndarray | None = None, buckets: tuple[tuple[int, int], ...] = ()) -> dict:
        """Metrics over the origins in `mask` (all when None), with per-horizon buckets (1-based, inclusive)."""
        m = np.ones(len(self.err), dtype=bool) if mask is None else mask
        sc = self.scale[m][:, None]

        def part(cols: slice) -> dict[str, float]:
            e, d, w = (a[m][:, cols] / sc for a in (self.err, self.err_day, self.err_week))
            ok = np.isfinite(e)
            day = float(np.mean(d[ok & np.isfinite(d)]))
            # the week naive counts only where it exists for (nearly) every scored pair
            wk_ok = ok & np.isfinite(w)
            week = float(np.mean(w[wk_ok])) if wk_ok.sum() >= 0.9 * ok.sum() else float("nan")
            mase = float(np.mean(e[ok]))
            best = min(day, week) if np.isfinite(week) else day
            return {
                "mase": mase, "mase_snaive_day": day, "mase_snaive_week": week,
                "mase_seasonal_naive": best, "mase_ratio": mase / best,
                "coverage_80": float(np.mean(self.in80[m][:, cols][ok])),
                "coverage_95": float(np.mean(self.in95[m][:, cols][ok])),
                "width_80": float(np.mean(self.w80[m][:, cols][ok])),
                "width_95": float(np.mean(self.w95[m][:, cols][ok])),
            }

        out: dict = part(slice(None))
        week_better = out["mase_snaive_week"] < out["mase_snaive_day"]  # False when the week naive is NaN
        out["best_seasonal_naive"] = "lag_week" if week_better else "lag_day"
        out["origins"] = int(m.sum())
        chosen = Counter(x for x, keep in zip(self.models, m, strict=True) if keep)
        out["model_chosen"] = chosen.most_common(1)[0][0] if chosen else None
        out["models_chosen"] = dict(chosen.most_common())
        out["per_horizon"] = {f"h{a}-{b}": part(slice(a - 1, b)) for a, b in buckets}
        return out


def backtest(forecaster: Forecaster, y: np.ndarray, event_us: np.ndarray, arrived_us: np.ndarray,
             origins_us: np.ndarray, horizon: int, groups: list[str] | None = None) -> Scores:
    """Feed every observation, then forecast at each origin (increasing) and score against the realized series.

    Parameters
    ----------
    forecaster : an unfitted forecaster; its configuration gives step, season and week.
    y : realized values (series unit) on the forecaster's grid; event_us, arrived_us : their event and
        arrival times (microseconds since the epoch).
    origins_us : forecast instants (microseconds), increasing; each is scored on `horizon` steps.
    groups : a label per origin (e.g. the year) for later summaries.
    """
    step_us = int(round(forecaster.step_s * 1e6))
    idx = event_us // step_us
    start = int(idx.min())
    truth = np.full(int(idx.max()) - start + 1, np.nan)
    truth[idx - start] = y
    known_at = np.full(len(truth), np.iinfo(np.int64).max)
    known_at[idx - start] = arrived_us
    forecaster.update_many(y, event_us, arrived_us)
    s, wk = forecaster.season, forecaster.week
    dif = np.abs(truth[s:] - truth[:-s])
    cum = np.concatenate([[0.0], np.cumsum(np.nan_to_num(dif))])
    cnt = np.concatenate([[0], np.cumsum(np.isfinite(dif))])
    rows: dict[str, list] = {k: [] for k in ("err", "err_day", "err_week", "scale", "in80", "in95", "w80", "w95")}
    models = []
    for o_us in origins_us:
        fc = forecaster.forecast(horizon, from_us(int(o_us)))
        pos = (fc.step_at_us // step_us - start).astype(int)
        ok = (pos >= 0) & (pos < len(truth))
        real = np.full(horizon, np.nan)
        real[ok] = truth[pos[ok]]
        real[fc.known] = np.nan  # published steps are not forecasts: not scored
        seen = np.flatnonzero(known_at <= o_us)
        n_known = int(seen[-1]) + 1 if len(seen) else 0
        fill = fill_gaps(np.where(known_at[:n_known] <= o_us, truth[:n_known], np.nan), s)
        o_pos = n_known - s  # seasonal differences with both ends before the origin
        rows["scale"].append(cum[o_pos] / max(cnt[o_pos], 1) if o_pos > 0 else np.nan)
        lead = int(pos[0]) - n_known
        day = seasonal_naive(fill, lead + horizon, s)
        week = seasonal_naive(fill, lead + horizon, wk)
        rows["err"].append(np.abs(real - fc.point))
        rows["err_day"].append(np.abs(real - day[lead:]) if day is not None else np.full(horizon, np.nan))
        rows["err_week"].append(np.abs(real - week[lead:]) if week is not None else np.full(horizon, np.nan))
        rows["in80"].append((real >= fc.lo80) & (real <= fc.hi80))
        rows["in95"].append((real >= fc.lo95) & (real <= fc.hi95))
        rows["w80"].append(fc.hi80 - fc.lo80)
        rows["w95"].append(fc.hi95 - fc.lo95)
        models.append(fc.model)
    arr = {k: np.array(v) for k, v in rows.items()}
    return Scores(**arr, models=models, groups=groups or [""] * len(origins_us))
