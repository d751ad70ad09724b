"""Residuals of the planner's serving model against the stored observations, and calibration records.

Reads the state (observations that arrived by a period's end) and writes the self-calibration's output
back (scored residuals, per-key tracks, the risk band); the statistics live in worldmodel/selfcal.py.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import polars as pl

from streams.workload.protocol import PROTOCOL_V1
from worldmodel.selfcal import ANY, TAIL_LEVELS, Quantity, SelfCalibrator, model_key
from worldmodel.servingmodel import PoolConfig, ServingModel, clock_or_max
from worldmodel.state.store import REPLICA_STATE_SQL, WorldState

_PERIOD_SQL = f"""
WITH r AS ({REPLICA_STATE_SQL}),
tel AS (SELECT replica_id, avg(num_requests_running) AS running FROM gpu_telemetry
        WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of AND replica_id IS NOT NULL
        GROUP BY 1),
c AS (SELECT replica_id, median(tpot_s) AS tpot_s, avg(input_tokens + output_tokens / 2.0) AS ctx,
             quantile_cont(ttft_s, 0.1) AS ttft10_s,
             quantile_cont(input_tokens - coalesce(cached_input_tokens, 0), 0.1) AS new10
      FROM request_completion WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
        AND output_tokens > 1 GROUP BY 1)
SELECT c.*, r.gpu_type, r.model, r.tp, r.precision, r.sm_clock_mhz,
       coalesce(r.hostnames[1], c.replica_id) AS node,
       coalesce(tel.running, 1.0) AS running
FROM c JOIN r USING (replica_id) LEFT JOIN tel USING (replica_id)
"""
_POWER_SQL = """
SELECT modelName AS gpu_type, hostname AS node, avg(DCGM_FI_DEV_POWER_USAGE) AS power_w,
       avg(DCGM_FI_DEV_GPU_UTIL) AS util, avg(DCGM_FI_DEV_SM_CLOCK) AS clock
FROM gpu_telemetry WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
  AND DCGM_FI_DEV_POWER_USAGE IS NOT NULL GROUP BY ALL
"""


def period_residuals(state: WorldState, model: ServingModel, start: datetime, end: datetime) -> pl.DataFrame:
    """Residual rows of one period from the stored observations that arrived by its end.

    Decode: median TPOT per replica vs the roofline at the replica's mean running batch and context.
    Prefill: the 10th-percentile TTFT per replica (the least-queued requests) vs the prefill time of the
    10th-percentile uncached prompt plus one decode step per chunked-prefill iteration. Power: mean DCGM power
    above idle per node vs the dynamic power model at its mean utilization and clock. Predictions use the
    priors only (no corrections), so residuals carry all error.

    Parameters
    ----------
    state : the world-model state (read only).
    model : serving model whose priors are compared (its corrections are ignored).
    start, end : the period (UTC).

    Returns
    -------
    Frame with quantity, gpu_type, node, model, predicted, observed (s or W).
    """
    prior = ServingModel(model.priors)
    params = {"s": start, "as_of": end}
    rows: list[tuple[str, str, str, str, float, float]] = []
    for r in state.frame(_PERIOD_SQL, params).iter_rows(named=True):
        cfg = PoolConfig(
            r["gpu_type"],
            r["model"],
            int(r["tp"] or 1),
            r["precision"] or "bf16",
            clock_or_max(r["gpu_type"], r["sm_clock_mhz"]),
        )
        rows.append(
            (
                Quantity.DECODE,
                cfg.gpu,
                r["node"],
                model_key(cfg.model, cfg.precision),
                prior.decode_step_s(cfg, float(r["running"]), float(r["ctx"])),
                float(r["tpot_s"]),
            )
        )
        if r["ttft10_s"] is not None:
            # chunked prefill: each chunk of the prompt rides one iteration that also decodes the running batch,
            # so the least-queued TTFT is the prompt's compute plus one decode step per chunk
            new10 = float(r["new10"])
            chunks = max(math.ceil(new10 / prior.priors.chunk_tokens), 1)
            step = prior.decode_step_s(cfg, float(r["running"]), float(r["ctx"]))
            rows.append(
                (
                    Quantity.PREFILL,
                    cfg.gpu,
                    r["node"],
                    model_key(cfg.model, cfg.precision),
                    prior.prefill_s(cfg, new10) + chunks * step,
                    float(r["ttft10_s"]),
                )
            )
    for r in state.frame(_POWER_SQL, params).iter_rows(named=True):
        gpu = r["gpu_type"]
        # the correction scales the dynamic part (power above idle); idle is the datasheet figure
        pred = prior.dynamic_power_w(gpu, clock_or_max(gpu, r["clock"]), prior.activity_from_util(r["util"] or 0.0))
        rows.append((Quantity.POWER, gpu, r["node"], ANY, pred, float(r["power_w"]) - prior.idle_power_w(gpu)))
    return pl.DataFrame(rows, schema=["quantity", "gpu_type", "node", "model", "predicted", "observed"], orient="row")


_TAIL_SQL = """
WITH c AS (SELECT request_class, tpot_s / nullif(median(tpot_s) OVER (PARTITION BY replica_id), 0) AS ratio
           FROM request_completion WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
             AND output_tokens > 1 AND tpot_s IS NOT NULL)
SELECT request_class, count(*) AS n, quantile_cont(ratio, $levels) AS q FROM c WHERE ratio IS NOT NULL GROUP BY 1
"""


def tpot_tail_quantiles(
    state: WorldState, start: datetime, end: datetime, levels: tuple[float, ...] = TAIL_LEVELS
) -> dict[str, tuple[tuple[float, ...], int]]:
    """Per class, quantiles of per-request TPOT / its replica's median TPOT over one period, and the count.

    The replica's median TPOT is what the decode correction fits (see :func:`period_residuals`), so the ratio
    is the tail shape around the calibrated step time: chunked-prefill stalls of short outputs, node spread.

    Parameters
    ----------
    state : the world-model state (read only).
    start, end : the period (UTC); completions that arrived by `end`.
    levels : quantile levels (0-1).

    Returns
    -------
    class -> (ratios at `levels` (ratio), completions counted (count)).
    """
    frame = state.frame(_TAIL_SQL, {"s": start, "as_of": end, "levels": list(levels)})
    return {r["request_class"]: (tuple(float(x) for x in r["q"]), int(r["n"])) for r in frame.iter_rows(named=True)}


def learn_tails(state: WorldState, cal: SelfCalibrator, start: datetime, end: datetime) -> None:
    """Feed one period's TPOT tail quantiles per class into the calibrator (see :func:`tpot_tail_quantiles`)."""
    for c, (ratios, n) in tpot_tail_quantiles(state, start, end).items():
        cal.observe_tail(c, TAIL_LEVELS, ratios, n)


def record(state: WorldState, cal: SelfCalibrator, residuals: pl.DataFrame, at: datetime) -> None:
    """Write scored residuals (from :meth:`SelfCalibrator.observe_frame`), the tracks and the risk band."""
    if residuals.height:
        keyed = residuals.with_columns(pl.lit(at).cast(pl.Datetime("us", "UTC")).alias("recorded_at"))
        state.replace_rows(
            "calibration_residuals",
            keyed.unique(subset=["quantity", "gpu_type", "node", "model"], keep="last"),
        )
    state.replace_rows("calibration_state", cal.state_frame(at))
    band = pl.DataFrame(
        {
            "recorded_at": [at],
            "band": [cal.risk_band()],
            "reason": [",".join(sorted({k[0] for k, t in cal.tracks.items() if t.band > 0})) or "in control"],
        },
        schema={"recorded_at": pl.Datetime("us", "UTC"), "band": pl.Float64, "reason": pl.String},
    )
    state.replace_rows("risk_band", band)


def calibrate_period(state: WorldState, cal: SelfCalibrator, prior: ServingModel, start: datetime,
                     end: datetime) -> None:
    """Self-calibrate from one ingested period: step-time and power residuals and TPOT tails of the interactive
    completions (`InteractiveCompletions`), then the records (the one update the policy and
    `aurelius worldmodel-validate` both run)."""
    interactive = InteractiveCompletions(state)
    scored, _ = cal.observe_frame(period_residuals(interactive, prior, start, end), end)
    learn_tails(interactive, cal, start, end)
    record(state, cal, scored, end)


class InteractiveCompletions:
    """The state as the residual queries read it, with deferrable completions left out.

    A deferrable request's TTFT includes the time it was deliberately held (minutes to hours), so its
    least-queued TTFT is no measure of prefill speed; fed to the prefill residual it drives the correction
    factor up tenfold after a few held periods. The residual queries see `request_completion` restricted to
    the interactive classes.
    """

    _DEFERRABLE = ", ".join(f"'{c.name}'" for c in PROTOCOL_V1.classes if c.deferrable)

    def __init__(self, state: WorldState) -> None:
        self.state = state

    def frame(self, sql: str, params: Any = None) -> pl.DataFrame:
        sub = f"(SELECT * FROM request_completion WHERE request_class NOT IN ({self._DEFERRABLE})) AS rc"
        return self.state.frame(sql.replace("FROM request_completion", f"FROM {sub}"), params)
