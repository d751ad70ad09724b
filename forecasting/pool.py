"""The pool forecaster: per series, choose among point models by rolling out-of-sample error, and
calibrate intervals on the residuals of what was actually issued.

Every `shadow_every` grid steps the forecaster replays a forecast origin over its own view (targets not yet
seen at that origin): each member forecasts from the prefix before the origin, per bucket of steps ahead
(`HORIZON_BUCKETS`) the member with the lowest mean absolute error over those steps of the last
`select_window` origins (targets known at that origin) is chosen, and the calibrated interval and confidence
of the issued forecast are recorded. Origins are recomputed from the view, never from state the
view does not justify: a later call whose view is not an extension of the last one drops the origins that
view no longer supports. Seasonal naive lag one day and lag one week are always in the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forecasting.base import Forecaster, register
from forecasting.calibration import LEVELS, aci_step, confidence, fallback_offsets, interval_offsets
from forecasting.forecast import Forecast
from forecasting.models import make_model
from forecasting.store import SeriesView, first_mismatch, from_us

HOURLY_POOL = ("snaive_day", "snaive_week", "seasonal_mean", "seasonal_median", "median_day_week", "recent_mean",
               "lag_regression", "river_holtwinters", "sf_mstl", "sf_autoets", "sf_holtwinters")
PERIOD_POOL = ("snaive_day", "snaive_week", "seasonal_mean", "recent_mean", "last_value", "lag_regression",
               "river_holtwinters", "sf_mstl")
#: Steps-ahead buckets (start indices, 0 = one step ahead) within which one member is chosen: persistence
#: tends to win the first steps, seasonal members the later ones. Finer buckets (1, 2-6, 7-12, 13-24, 25+)
#: were tried: 30 origins x 6 steps chose worse members at 7-12 (PJM 2023 price MASE 0.414 vs 0.366 there).
#: The medians (`seasonal_median`, `median_day_week`) join the hourly pool: a price spike moves a mean for days and a
#: median not. With them and 60 scored origins for hourly series (30 chose members by noise: ERCOT 2022 price MASE
#: ratio 1.001 vs 0.884, all origins) every market-year 2021-2024 but CAISO 2021 was below 1.0 x the better
#: seasonal naive; with the regression's day-before-last feature all are (`aurelius forecast-eval`,
#: docs/forecasting.md).
#: `last_value` joins the period pool only: in the hourly price pool it carried spikes forward for hours
#: (PJM 2021 price MASE ratio 1.295 against 0.842 without it; `aurelius forecast-eval --origins 60`).
HORIZON_BUCKETS = (0, 1, 6)
ALWAYS = ("snaive_day", "snaive_week")
COMBO = "combo_top3"


@dataclass(frozen=True, eq=False)
class _Origin:
    """What was issued at one origin (grid index): points per member, chosen point, intervals, adj."""

    origin: int
    members: dict[str, np.ndarray]
    chosen: str
    point: np.ndarray
    bands: np.ndarray  # (4, H): lo80, hi80, lo95, hi95
    adj: dict[int, float]
    confidence: float


class PoolForecaster(Forecaster):
    """Rolling-error model selection with conformal intervals (see module docstring).

    Parameters
    ----------
    pool : point-model names (see `forecasting.models.model_names()`); lag-day and lag-week naive are added.
    shadow_every : grid steps between replayed origins; 0 (auto): 23 for hourly series (origins rotate over
        the hours of the day), season/48 (30 min) for 5-minute series.
    select_window : replayed origins scored for model choice; 0 (auto): 60 for hourly series (about 8 weeks at
        one origin per 23 h), 30 for 5-minute series (15 h).
    calib_window : replayed origins whose residuals calibrate the 80% interval.
    tail_window : replayed origins whose residuals calibrate the 95% interval; 0: `calib_window`. A 2.5% tail
        quantile needs more origins than a 10% one.
    recent_steps : steps whose realized coverage enters the confidence (default season/4).
    gamma : adaptive conformal step (probability per scored pair).
    step_s, season, week, max_horizon, source, seed : see `Forecaster`.
    """

    name = "pool"

    def __init__(self, pool: tuple[str, ...] = HOURLY_POOL, shadow_every: int = 0,
                 select_window: int = 0, calib_window: int = 90, tail_window: int = 0,
                 recent_steps: int | None = None, gamma: float = 0.001, step_s: float = 3600.0,
                 season: int = 24, week: int = 168, max_horizon: int = 48, source: str = "measured",
                 seed: int = 0) -> None:
        super().__init__(step_s, season, week, max_horizon, source, seed)
        self.pool = tuple(pool)
        self.shadow_every = shadow_every
        self._every = shadow_every or (season - 1 if season <= 24 else max(1, season // 48))
        self.select_window = select_window or (60 if season <= 24 else 30)
        self.calib_window, self.gamma = calib_window, gamma
        self.tail_window = max(tail_window, calib_window)
        self.recent_steps = recent_steps or max(3, season // 4)
        names = tuple(dict.fromkeys((*ALWAYS, *self.pool))) if len(self.pool) > 1 else self.pool
        self._members = {n: make_model(n, season, week, seed) for n in names}
        self._origins: list[_Origin] = []
        self._ref: SeriesView | None = None
        self._warmup = 2 * season

    # -- keeping replayed origins consistent with the view -------------------------------------------
    def _sync(self, view: SeriesView) -> None:
        ref = self._ref
        if ref is None or ref.start_index != view.start_index:
            self._origins = []
        else:
            keep_until = view.start_index + first_mismatch(view.values, ref.values)
            self._origins = [o for o in self._origins if o.origin <= keep_until]
        self._ref = view

    def _scored(self, sub: SeriesView, records: list[_Origin]) -> tuple[np.ndarray, np.ndarray]:
        """Targets (R, max_horizon) of `records` as known in `sub` (NaN otherwise), and their grid indices."""
        t = np.array([r.origin for r in records])[:, None] + np.arange(self.max_horizon)[None, :]
        pos = t - sub.start_index
        ok = (pos >= 0) & (pos < len(sub))
        y = np.full(t.shape, np.nan)
        y[ok] = sub.values[pos[ok]]
        return y, t

    def _record(self, sub: SeriesView, horizon: int) -> _Origin:
        """Issue the forecast at origin sub.end_index from `sub` alone (horizon >= max_horizon)."""
        o, big_h = sub.end_index, self.max_horizon
        points = {}
        for name, m in self._members.items():
            p = m.predict(sub, horizon)
            if p is not None and np.all(np.isfinite(p)):
                points[name] = p
        if not points:
            points["recent_mean"] = make_model("recent_mean", self.season, self.week).predict(sub, horizon)
        hist = self._origins
        errors = self._errors(sub, hist[-self.select_window:], points)
        overall = {n: float(np.nanmean(e)) for n, e in errors.items()}
        ranked = sorted((e, n) for n, e in overall.items() if n != COMBO)
        if len(ranked) >= 3:  # the mean of the three best members competes as one more member
            points[COMBO] = np.mean([points[n] for _, n in ranked[:3]], axis=0)
        fallback = [n for n in ("snaive_day", "seasonal_mean", "recent_mean") if n in points]
        default = fallback[0] if fallback else next(iter(points))  # nothing scored yet: the day-ago naive
        point = np.array(points[default], dtype=float)
        picks: list[str] = []
        for b, (lo, hi) in enumerate(self._buckets(len(point))):
            scored = {n: e[b] for n, e in errors.items() if n in points and np.isfinite(e[b])}
            name = min(scored, key=lambda n: (scored[n], n)) if scored else default
            point[lo:hi] = points[name][lo:hi]
            picks.append(name)
        chosen = picks[0] if len(set(picks)) == 1 else "/".join(picks)
        adj = hist[-1].adj if hist else {lvl: 0.0 for lvl in LEVELS}
        bands, recent = None, None
        calib = hist[-self.tail_window:]
        if calib:
            issued = np.stack([r.point[:big_h] for r in calib])
            y, t = self._scored(sub, calib)
            lim = np.stack([r.bands[:, :big_h] for r in calib]) + issued[:, None, :]  # (R, 4, H)
            inside = {lvl: (y >= lim[:, 2 * i]) & (y <= lim[:, 2 * i + 1]) for i, lvl in enumerate(LEVELS)}
            fresh = np.isfinite(y) & (t >= calib[-1].origin) & (t < o)  # pairs first scored at this origin
            adj = aci_step(adj, {lvl: 1.0 - inside[lvl][fresh] for lvl in LEVELS}, self.gamma)
            bands = interval_offsets(y - issued, horizon, adj, rows={80: self.calib_window})
            rec = np.isfinite(y) & (t >= o - self.recent_steps) & (t < o)
            recent = float(np.mean(inside[80][rec])) if rec.any() else None
        if bands is None:
            bands = fallback_offsets(sub.filled, self.season, horizon)
        lo80, hi80 = np.minimum(bands[0], 0), np.maximum(bands[1], 0)
        bands = np.stack([lo80, hi80, np.minimum(bands[2], lo80), np.maximum(bands[3], hi80)])
        level = float(np.mean(np.abs(sub.filled[-self.season:])))
        conf = confidence(bands[1, : self.season] - bands[0, : self.season], level, recent)
        return _Origin(o, points, chosen, point, bands, adj, conf)

    def _buckets(self, n: int) -> list[tuple[int, int]]:
        """[lo, hi) step ranges of `HORIZON_BUCKETS` within n steps (the last runs to n)."""
        starts = [b for b in HORIZON_BUCKETS if b < n]
        return list(zip(starts, [*starts[1:], n], strict=True))

    def _errors(self, sub: SeriesView, hist: list[_Origin], points: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Mean absolute error per horizon bucket over `hist` (targets known in `sub`) of every member that can
        forecast now (NaN for a bucket with too few scored pairs: fewer than its steps or half its targets)."""
        out: dict[str, np.ndarray] = {}
        if not hist:
            return out
        y, _ = self._scored(sub, hist)
        nan = np.full(self.max_horizon, np.nan)
        buckets = self._buckets(self.max_horizon)
        for name in (*points, COMBO):
            pred = np.stack([r.members.get(name, nan)[: self.max_horizon] for r in hist])
            err = np.full(len(buckets), np.nan)
            for b, (lo, hi) in enumerate(buckets):
                yb, pb = y[:, lo:hi], pred[:, lo:hi]
                ok = np.isfinite(yb) & np.isfinite(pb)
                if ok.sum() >= max(hi - lo, np.isfinite(yb).sum() // 2) and ok.any():
                    err[b] = float(np.mean(np.abs(yb[ok] - pb[ok])))
            if np.isfinite(err).any():
                out[name] = err
        return out

    # -- the protocol ---------------------------------------------------------------------------------
    def _forecast(self, view: SeriesView, horizon: int, as_of_us: int) -> Forecast:
        self._sync(view)
        keep = max(self.tail_window, self.select_window) + self.max_horizon // self._every + 2
        if self._origins:
            last = self._origins[-1].origin
        else:  # older origins would fall out of every window: start the replay where the windows begin
            last = max(view.start_index + self._warmup, view.end_index - keep * self._every) - 1
        first = (last // self._every + 1) * self._every
        for o in range(first, view.end_index + 1, self._every):
            self._origins.append(self._record(view.until(o), self.max_horizon))
        del self._origins[:-keep]
        steps = self._steps(as_of_us, horizon)
        ahead = steps - view.end_index
        need = max(self.max_horizon, int(ahead.max()) + 1)
        rec = self._origins[-1] if self._origins else None
        if rec is None or rec.origin != view.end_index or len(rec.point) < need:
            rec = self._record(view, need)
        return self._assemble(view, rec, steps, as_of_us)

    def _assemble(self, view: SeriesView, rec: _Origin, steps: np.ndarray, as_of_us: int) -> Forecast:
        h = len(steps)
        ahead = steps - view.end_index
        k = np.clip(ahead, 0, None)
        point = rec.point[k].copy()
        bands = rec.bands[:, k].copy()
        known = np.zeros(h, dtype=bool)
        past = ahead < 0
        if past.any():
            pos = steps[past] - view.start_index
            vals = view.values[pos] if (pos >= 0).all() else np.full(past.sum(), np.nan)
            seen = np.isfinite(vals)
            idx = np.flatnonzero(past)
            known[idx[seen]] = True
            point[idx[seen]] = vals[seen]
            bands[:, idx[seen]] = 0.0
            gap = idx[~seen]
            point[gap] = view.filled[np.clip(steps[gap] - view.start_index, 0, len(view) - 1)]
            bands[:, gap] = rec.bands[:, [0]]
        conf = 1.0 if known.all() else rec.confidence
        return Forecast(
            step_at_us=steps * view.step_us, step_s=self.step_s, point=point, lo80=point + bands[0],
            hi80=point + bands[1], lo95=point + bands[2], hi95=point + bands[3], known=known,
            confidence=conf, model=rec.chosen, as_of=from_us(as_of_us),
            provenance=self._provenance(view, rec.chosen),
        )


def _single(model: str) -> type[PoolForecaster]:
    """A forecaster whose pool is one model: what the shared checks run per registered model."""

    class Single(PoolForecaster):
        name = model

        def __init__(self, shadow_every: int = 0, select_window: int = 0, calib_window: int = 90,
                     tail_window: int = 0, recent_steps: int | None = None, gamma: float = 0.001,
                     step_s: float = 3600.0, season: int = 24, week: int = 168, max_horizon: int = 48,
                     source: str = "measured", seed: int = 0) -> None:
            super().__init__((model,), shadow_every, select_window, calib_window, tail_window, recent_steps, gamma,
                             step_s, season, week, max_horizon, source, seed)

    Single.__name__ = Single.__qualname__ = f"Single_{model}"
    return Single


register("pool")(PoolForecaster)
for _m in dict.fromkeys((*HOURLY_POOL, *PERIOD_POOL)):
    register(_m)(_single(_m))
