"""Self-calibration of the planner's serving model against what the fleet reports.

Residuals are log(observed / predicted) of decode step time (TPOT), prefill time (low-queue TTFT) and GPU
power, per (quantity, GPU type, node, model), with the prediction taken from the *uncorrected* roofline so
the residual measures the whole model error. Each key keeps (estimators in worldmodel/estimators.py, the
detector in worldmodel/drift.py):

- a fast exponentially weighted mean (the online correction: factor = exp(mean)), mergeable across nodes
  like river's statistics, so node tracks combine into the (gpu, model) factor the forward model uses;
- a slow in-control baseline (mean, variance) that standardizes residuals: z = (r - base_mean) / base_sd;
- a two-sided CUSUM on z (Page 1954; k = 0.5, h = 10: in-control ARL about 1.4 x 10^5 samples per side
  by Siegmund's approximation; a 2.7-sigma shift is flagged after about 5 samples), which on a
  persistent shift (e.g. thermal throttling, +8 % step time) raises
  an alarm, re-baselines at the new level and widens the risk band the optimizer uses.

SLA outcomes are tracked additively (observed - predicted violation rate per class) with the same machinery.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

import polars as pl

from worldmodel.drift import Alarm, Cusum
from worldmodel.estimators import EwmaStat, TailShape
from worldmodel.servingmodel import Corrections

ANY = "*"
#: Share (log terms) of the roofline's precision gain credited to a precision never observed on its
#: (gpu, model) (0-1). 1.0 keeps the roofline until the precision's own factor is fitted; the forward model can
#: put the uncertainty in its upper scenarios instead (`ForwardModel(unobserved_precision_risk=True)`).
#: Measured on PJM (6 periods): 0.5 tempted the planner into a mid-window precision switch whose reloads
#: cost more than the gain.
PRECISION_CREDIT = 0.0
#: Completions of a class a period needs before its TPOT quantiles update the learned tail (count).
TAIL_MIN_REQUESTS = 200
#: Quantile levels of the learned per-request TPOT tail (0-1).
TAIL_LEVELS: tuple[float, ...] = (0.5, 0.75, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
#: The order residual rows are learned in (`SelfCalibrator.update_frame`): every column of a residual row.
RESIDUAL_ORDER = ("quantity", "gpu_type", "node", "model", "predicted", "observed")
#: Separator of the precision in a decode/prefill track's model field ("llama-3.1-8b@fp8").
PRECISION_SEP = "@"


def model_key(model: str, precision: str | None) -> str:
    """The model field of a decode/prefill track: the model and its precision."""
    return f"{model}{PRECISION_SEP}{precision}" if precision else model


def split_model_key(key: str) -> tuple[str, ...]:
    """(model, precision) of a track's model field, or (model,) for a key without a precision."""
    return tuple(key.split(PRECISION_SEP, 1)) if PRECISION_SEP in key else (key,)


class Quantity(StrEnum):
    DECODE = "decode"
    PREFILL = "prefill"
    POWER = "power"
    SLA = "sla"
    TPOT_TAIL = "tpot_tail"  # learned tail shape rows of calibration_state (not a residual)


@dataclass
class Track:
    """Calibration state of one (quantity, gpu, node, model) key."""

    fast: EwmaStat
    base: EwmaStat
    cusum: Cusum
    samples: int = 0
    band: float = 0.0
    band_left: int = 0
    last_alarm_at: datetime | None = None


@dataclass
class SelfCalibrator:
    """Online correction factors, drift detection and the risk band, per residual key.

    Parameters
    ----------
    fast_alpha : EWMA weight of the correction (0-1).
    base_alpha : EWMA weight of the in-control baseline (0-1).
    warmup : samples per key before the CUSUM runs (count).
    sd_floor : lower bound of the baseline standard deviation (log units; absolute for SLA).
    k, h : CUSUM reference value and decision interval (standard deviations).
    band_memory : samples an alarm keeps the risk band widened (count).
    band_gain : band widening per unit of standardized shift (capped at 1, so the band stays in [1, 2]).
    precision_credit : share of the roofline's precision gain credited to a precision not yet observed on its
        (gpu, model) (0-1, log terms; see `Corrections`).
    tail_alpha : weight of the newest period in the learned TPOT tail shape (0-1).
    """

    fast_alpha: float = 0.1
    base_alpha: float = 0.01
    warmup: int = 20
    sd_floor: float = 0.01
    k: float = 0.5
    h: float = 10.0
    band_memory: int = 200
    band_gain: float = 0.25
    precision_credit: float = PRECISION_CREDIT
    tail_alpha: float = 0.3
    tracks: dict[tuple[str, str, str, str], Track] = field(default_factory=dict)
    tails: dict[str, TailShape] = field(default_factory=dict)

    def _track(self, key: tuple[str, str, str, str]) -> Track:
        t = self.tracks.get(key)
        if t is None:
            t = Track(EwmaStat(self.fast_alpha), EwmaStat(self.base_alpha), Cusum(self.k, self.h))
            self.tracks[key] = t
        return t

    def update(
        self,
        quantity: Quantity | str,
        gpu: str,
        node: str,
        model: str,
        predicted: float,
        observed: float,
        at: datetime,
    ) -> tuple[float, Alarm | None]:
        """Learn from one residual; return its standardized value z and an alarm if the CUSUM fired.

        Parameters
        ----------
        quantity : what was compared (decode/prefill step time, power, SLA violation rate).
        gpu, node, model : key of the residual (``"*"`` where not applicable).
        predicted, observed : the uncorrected prediction and the observation (s, W, or rate 0-1 for SLA).
        at : observation time (UTC).
        """
        q = Quantity(quantity)
        if q is Quantity.SLA:
            r = observed - predicted
        elif predicted > 0.0 and observed > 0.0:
            r = math.log(observed / predicted)
        else:
            return 0.0, None
        key = (str(q), gpu, node, model)
        t = self._track(key)
        t.samples += 1
        t.fast.update(r)
        t.band_left = max(t.band_left - 1, 0)
        if t.band_left == 0:
            t.band = 0.0
        if t.samples <= self.warmup:
            t.base.update(r)
            return 0.0, None
        z = (r - t.base.mean) / max(math.sqrt(t.base.var), self.sd_floor)
        fired = t.cusum.update(z)
        if not fired:
            t.base.update(r)
            return z, None
        shift = t.fast.mean - t.base.mean
        alarm = Alarm(key, fired, shift, at, t.samples)
        t.band = min(1.0, self.band_gain * abs(shift) / max(math.sqrt(t.base.var), self.sd_floor))
        t.band_left = self.band_memory
        t.last_alarm_at = at
        t.base = replace(t.base, mean=t.fast.mean)  # re-baseline at the new level, keep the noise estimate
        return z, alarm

    def update_frame(self, residuals: pl.DataFrame, at: datetime) -> tuple[pl.DataFrame, list[Alarm]]:
        """Learn from a residual frame (quantity, gpu_type, node, model, predicted, observed), its rows taken in
        one canonical order: a node hosting several replicas gives its track several residuals a period, and the
        moving averages depend on their order, which the state's query leaves to DuckDB's threads (the same
        replay once made PJM seed 1's default arm 1166.1 or 1171.4 gp/$ from run to run).

        Returns
        -------
        The frame, in that order, with its standardized residual ``z`` appended, and the alarms raised.
        """
        residuals = residuals.sort(RESIDUAL_ORDER, nulls_last=True)
        alarms, zs = [], []
        for row in residuals.iter_rows(named=True):
            z, alarm = self.update(
                row["quantity"],
                row["gpu_type"],
                row["node"],
                row["model"],
                float(row["predicted"]),
                float(row["observed"]),
                at,
            )
            zs.append(z)
            if alarm is not None:
                alarms.append(alarm)
        return residuals.with_columns(pl.Series("z", zs, dtype=pl.Float64)), alarms

    def factor(self, quantity: Quantity | str, gpu: str, model: str) -> float:
        """Correction factor observed/predicted for (quantity, gpu, model), merged over nodes (1 = none)."""
        merged = EwmaStat(self.fast_alpha)
        for (q, g, _, m), t in self.tracks.items():
            if q == str(quantity) and g == gpu and m == model:
                merged += t.fast
        return math.exp(merged.mean) if merged.n > 0 else 1.0

    def risk_band(self) -> float:
        """Multiplier (1-2) on the forward model's uncertainty while a drift alarm is recent."""
        return 1.0 + max((t.band for t in self.tracks.values()), default=0.0)

    def corrections(self, step_cv_prior: float = 0.10) -> Corrections:
        """The serving model's correction factors and step-time spread from the tracks."""
        decode: dict[tuple[str, str], float] = {}
        prefill: dict[tuple[str, str], float] = {}
        power: dict[str, float] = {}
        spread = [
            math.sqrt(t.base.var)
            for (q, *_), t in self.tracks.items()
            if q == Quantity.DECODE and t.samples > self.warmup
        ]
        for q, g, _, m in self.tracks:
            if q in (Quantity.DECODE, Quantity.PREFILL):
                (decode if q == Quantity.DECODE else prefill)[(g, *split_model_key(m))] = self.factor(q, g, m)
            elif q == Quantity.POWER:
                power[g] = self.factor(q, g, ANY)
        cv = max(step_cv_prior, max(spread, default=0.0))
        tails = {c: t.table() for c, t in self.tails.items() if t.n > 0}
        return Corrections(
            decode=decode,
            prefill=prefill,
            power=power,
            step_cv=cv,
            precision_credit=self.precision_credit,
            tpot_tail=tails,
        )

    def update_tail(
        self, request_class: str, levels: tuple[float, ...], ratios: tuple[float, ...], count: int
    ) -> None:
        """Learn one period's per-request TPOT / replica-median TPOT quantiles of a class (ratios at `levels`,
        from `count` requests); periods with fewer than `TAIL_MIN_REQUESTS` requests are skipped."""
        if count < TAIL_MIN_REQUESTS or len(levels) != len(ratios):
            return
        t = self.tails.setdefault(request_class, TailShape(levels, self.tail_alpha))
        t.update(ratios)

    def state_frame(self, at: datetime) -> pl.DataFrame:
        """The tracks as rows of the ``calibration_state`` table."""
        rows = [
            {
                "quantity": k[0],
                "gpu_type": k[1],
                "node": k[2],
                "model": k[3],
                "factor": math.exp(t.fast.mean),
                "n": float(t.samples),
                "resid_mean": t.fast.mean,
                "resid_var": t.fast.var,
                "base_mean": t.base.mean,
                "base_var": t.base.var,
                "base_n": t.base.n,
                "cusum_pos": t.cusum.pos,
                "cusum_neg": t.cusum.neg,
                "alarms": t.cusum.alarms,
                "last_alarm_at": t.last_alarm_at,
                "updated_at": at,
            }
            for k, t in self.tracks.items()
        ]
        rows += [  # the learned TPOT tails: one row per (class, quantile level); factor = the ratio
            {
                "quantity": str(Quantity.TPOT_TAIL),
                "gpu_type": ANY,
                "node": f"{lvl:.4f}",
                "model": c,
                "factor": r,
                "n": float(t.n),
                "resid_mean": t.alpha,
                "resid_var": 0.0,
                "base_mean": 0.0,
                "base_var": 0.0,
                "base_n": 0.0,
                "cusum_pos": 0.0,
                "cusum_neg": 0.0,
                "alarms": 0,
                "last_alarm_at": None,
                "updated_at": at,
            }
            for c, t in self.tails.items()
            for lvl, r in t.table()
        ]
        return pl.DataFrame(rows, schema=_STATE_SCHEMA)

    @classmethod
    def from_state_frame(cls, frame: pl.DataFrame, **config: float) -> SelfCalibrator:
        """Rebuild a calibrator from ``calibration_state`` rows (the inverse of :meth:`state_frame`)."""
        cal = cls(**config)  # type: ignore[arg-type]
        for r in frame.iter_rows(named=True):
            if r["quantity"] == Quantity.TPOT_TAIL:
                tail = cal.tails.setdefault(r["model"], TailShape((), cal.tail_alpha))
                tail.levels = (*tail.levels, float(r["node"]))
                tail.ratios.append(float(r["factor"]))
                tail.n = int(r["n"])
                continue
            t = cal._track((r["quantity"], r["gpu_type"], r["node"], r["model"]))
            t.samples = int(r["n"])
            t.fast.n, t.fast.mean, t.fast.var = (
                min(r["n"], 1.0 / cal.fast_alpha),
                r["resid_mean"],
                r["resid_var"],
            )
            t.base.n, t.base.mean, t.base.var = r["base_n"], r["base_mean"], r["base_var"]
            t.cusum.pos, t.cusum.neg, t.cusum.alarms = r["cusum_pos"], r["cusum_neg"], int(r["alarms"])
            t.last_alarm_at = r["last_alarm_at"]
        for tail in cal.tails.values():  # rows come in any order: sort each tail by its levels
            pairs = sorted(zip(tail.levels, tail.ratios, strict=True))
            tail.levels, tail.ratios = tuple(p[0] for p in pairs), [p[1] for p in pairs]
        return cal


_STATE_SCHEMA = {
    "quantity": pl.String,
    "gpu_type": pl.String,
    "node": pl.String,
    "model": pl.String,
    "factor": pl.Float64,
    "n": pl.Float64,
    "resid_mean": pl.Float64,
    "resid_var": pl.Float64,
    "base_mean": pl.Float64,
    "base_var": pl.Float64,
    "base_n": pl.Float64,
    "cusum_pos": pl.Float64,
    "cusum_neg": pl.Float64,
    "alarms": pl.Int32,
    "last_alarm_at": pl.Datetime("us", "UTC"),
    "updated_at": pl.Datetime("us", "UTC"),
}
