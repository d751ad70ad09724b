"""Residuals of the planner's serving model against the stored observations, and calibration records.

Reads the state (observations that arrived by a period's end) and writes the self-calibration's output
back (scored residuals, per-key tracks, the risk band); the statistics live in worldmodel/selfcal.py.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import polars as pl

from schemas.fleet import GpuType, KvCacheDtype, default_max_num_batched_tokens
from schemas.protocol import PROTOCOL_V1
from worldmodel.selfcal import ANY, TAIL_LEVELS, Quantity, SelfCalibrator, model_key
from worldmodel.servingmodel import PoolConfig, ServingModel, clock_or_max, size_cv_from_p90
from worldmodel.state.store import FLOAT_DIGITS, REPLICA_STATE_SQL, WorldState
from worldmodel.tails import chunk_mix, tpot_quantile

#: Prefill busy share (0-1) at which a replica stops giving step-time residuals. Measured (PJM, 8B on H100):
#: at 0.4 the 10th-percentile TTFT is 0.8x the prior, as on idle replicas; at 0.8 (the imposed half-capacity
#: plan) 2.2-4.7x, and the median TPOT 3.5x the decode roofline: as corrections these cut the predicted
#: throughput to a third and counted chunk stalls twice (once in the factor, once in the forward model).
PREFILL_BUSY_MAX = 0.6
#: Single-chunk prompts each half of a replica's prompt sizes needs before it gives a prefill residual (count).
PREFILL_MIN_PROMPTS = 20

_PERIOD_SQL = f"""
WITH r AS ({REPLICA_STATE_SQL}),
tel AS (SELECT replica_id, round(avg(num_requests_running), {FLOAT_DIGITS}) AS running FROM gpu_telemetry
        WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of AND replica_id IS NOT NULL
        GROUP BY 1),
c AS (SELECT replica_id, median(tpot_s) AS tpot_s,
             round(avg(input_tokens + output_tokens / 2.0), {FLOAT_DIGITS}) AS ctx,
             avg(output_tokens) AS out_mean, quantile_cont(output_tokens, 0.9) AS out90
      FROM request_completion WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
        AND output_tokens > 1 GROUP BY 1),
-- single-chunk prompts split at their median uncached size; per half the 10th percentiles of TTFT (the
-- least-queued requests) and of the uncached size (TTFT grows with it, so its 10th percentile is the small ones')
p0 AS (SELECT replica_id, ttft_s, input_tokens - coalesce(cached_input_tokens, 0) AS new
       FROM request_completion WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
         AND ttft_s IS NOT NULL AND input_tokens - coalesce(cached_input_tokens, 0) <= $chunk),
pm AS (SELECT replica_id, median(new) AS mid FROM p0 GROUP BY 1),
pf AS (SELECT replica_id,
              quantile_cont(ttft_s, 0.1) FILTER (WHERE new <= mid) AS ttft_lo,
              quantile_cont(new, 0.1) FILTER (WHERE new <= mid) AS new_lo, count(*) FILTER (WHERE new <= mid) AS n_lo,
              quantile_cont(ttft_s, 0.1) FILTER (WHERE new > mid) AS ttft_hi,
              quantile_cont(new, 0.1) FILTER (WHERE new > mid) AS new_hi, count(*) FILTER (WHERE new > mid) AS n_hi
       FROM p0 JOIN pm USING (replica_id) GROUP BY 1),
-- the prompts that loaded the replica: every completion, deferrable ones included (main.request_completion
-- is the stored table itself, which InteractiveCompletions leaves unfiltered)
prompts AS (SELECT replica_id, count(*) AS n, avg(input_tokens - coalesce(cached_input_tokens, 0)) AS new_mean
            FROM main.request_completion WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
            GROUP BY 1)
SELECT c.*, pf.ttft_lo, pf.new_lo, pf.n_lo, pf.ttft_hi, pf.new_hi, pf.n_hi, prompts.n, prompts.new_mean,
       r.gpu_type, r.model, r.tp, r.precision, r.kv_cache_dtype, r.sm_clock_mhz,
       coalesce(r.hostnames[1], c.replica_id) AS node,
       coalesce(tel.running, 1.0) AS running
FROM c JOIN r USING (replica_id) JOIN prompts USING (replica_id) LEFT JOIN tel USING (replica_id)
  LEFT JOIN pf USING (replica_id)
"""
_POWER_SQL = f"""
SELECT modelName AS gpu_type, hostname AS node, round(avg(DCGM_FI_DEV_POWER_USAGE), {FLOAT_DIGITS}) AS power_w,
       round(avg(DCGM_FI_DEV_GPU_UTIL), {FLOAT_DIGITS}) AS util,
       round(avg(DCGM_FI_DEV_SM_CLOCK), {FLOAT_DIGITS}) AS clock
FROM gpu_telemetry WHERE event_at >= $s AND event_at < $as_of AND arrived_at <= $as_of
  AND DCGM_FI_DEV_POWER_USAGE IS NOT NULL GROUP BY ALL
"""


def period_residuals(state: WorldState, model: ServingModel, start: datetime, end: datetime) -> pl.DataFrame:
    """Residual rows of one period from the stored observations that arrived by its end.

    A replica's prefill busy share (its completions, deferrable ones included, x the prefill time of their
    mean uncached prompt / the period, by `model` with its current corrections) is the share of its time spent
    on prompt chunks, which ride iterations that also decode every running sequence
    (:func:`worldmodel.tails.chunk_mix`). Replicas at
    or above `PREFILL_BUSY_MAX` give no step-time residual: there even the least-queued requests share the
    prefill budget with others (the engine admits them all into its batch, so no waiting queue shows it) and
    the residuals would read contention as slowness.

    Decode: the decode step implied by the replica's median TPOT under the forward model's chunk-interference
    tail (:func:`implied_decode_step`: the step at which the predicted median per-request TPOT, at the
    replica's prompt rate, prompt size and output lengths, equals the observed one) vs the roofline at its
    mean running batch and context; before, the raw median TPOT was compared, so the factor absorbed the chunk
    stalls the forward model adds again (3.5x on a saturated 8B replica). Prefill: the replica's single-chunk
    prompts split at their median uncached size; the difference of the halves' 10th-percentile TTFTs (the
    least-queued requests) vs the difference of the prior's prefill times at the halves' 10th-percentile sizes
    (TTFT rises with size, so a half's fastest requests are its small prompts), so the
    fixed part of a TTFT (the decode step a chunk rides with, the step in flight on arrival) stays out of the
    compute factor. Before, the 10th-percentile TTFT was compared with the prefill of the 10th-percentile
    prompt plus one prior decode step: on PJM's 8B H100 replicas, whose TTFT rises 16 us per uncached token
    against the prior's 28, that gave 0.79 (a decode step 2.4x faster than the prior's absorbed), and
    subtracting the implied decode step instead gave 1.52 (the fixed part read as compute of a ~100-token
    prompt). Power: mean DCGM power above idle per node vs the dynamic
    power model at its mean utilization and clock. Predictions use the priors (no corrections; the busy share
    and the chunks' compute excepted), so residuals carry all error.

    Parameters
    ----------
    state : the world-model state (read only).
    model : serving model whose priors are compared; its corrections only give the prompt chunks' compute.
    start, end : the period (UTC).

    Returns
    -------
    Frame with quantity, gpu_type, node, model, predicted, observed (s or W).
    """
    prior = ServingModel(model.priors)
    params = {"s": start, "as_of": end}
    period_s = max((end - start).total_seconds(), 1.0)
    rows: list[tuple[str, str, str, str, float, float]] = []
    # single-chunk prompts: within the smallest default budget unless the priors fix one (tokens)
    single = model.priors.chunk_tokens or min(default_max_num_batched_tokens(g) for g in GpuType)
    for r in state.frame(_PERIOD_SQL, {**params, "chunk": single}).iter_rows(named=True):
        cfg = PoolConfig(
            r["gpu_type"],
            r["model"],
            int(r["tp"] or 1),
            r["precision"] or "bf16",
            clock_or_max(r["gpu_type"], r["sm_clock_mhz"]),
            r["kv_cache_dtype"] or KvCacheDtype.AUTO,  # the replica state's last reported one, else the default
        )
        rate = float(r["n"]) / period_s
        new_mean = float(r["new_mean"] or 0.0)
        t_pf = model.prefill_s(cfg, new_mean)
        if rate * t_pf >= PREFILL_BUSY_MAX:
            continue
        step = prior.decode_step_s(cfg, float(r["running"]), float(r["ctx"]))
        key = model_key(cfg.model, cfg.precision)
        out_mean = float(r["out_mean"])
        out_cv = size_cv_from_p90(out_mean, float(r["out90"]))
        chunks = new_mean / (prior.priors.chunk_tokens or default_max_num_batched_tokens(cfg.gpu))
        implied = implied_decode_step(float(r["tpot_s"]), step, rate, t_pf, chunks, out_mean, out_cv)
        rows.append((Quantity.DECODE, cfg.gpu, r["node"], key, step, implied))
        if min(r["n_lo"] or 0, r["n_hi"] or 0) >= PREFILL_MIN_PROMPTS:
            # a single-chunk prompt's least-queued TTFT is its compute plus a fixed part (the decode step its
            # chunk rides with, the step in flight when it arrived): the difference between the larger and
            # the smaller half is compute alone
            predicted = prior.prefill_s(cfg, float(r["new_hi"])) - prior.prefill_s(cfg, float(r["new_lo"]))
            observed = float(r["ttft_hi"]) - float(r["ttft_lo"])
            if predicted > 1e-4 and observed > 0.0:
                rows.append((Quantity.PREFILL, cfg.gpu, r["node"], key, predicted, observed))
    for r in state.frame(_POWER_SQL, params).iter_rows(named=True):
        gpu = r["gpu_type"]
        # the correction scales the dynamic part (power above idle); idle is the datasheet figure
        pred = prior.dynamic_power_w(gpu, clock_or_max(gpu, r["clock"]), prior.activity_from_util(r["util"] or 0.0))
        rows.append((Quantity.POWER, gpu, r["node"], ANY, pred, float(r["power_w"]) - prior.idle_power_w(gpu)))
    return pl.DataFrame(rows, schema=["quantity", "gpu_type", "node", "model", "predicted", "observed"], orient="row")


def implied_decode_step(
    median_tpot_s: float, prior_step_s: float, rate_per_s: float, t_prefill_s: float, chunks: float,
    out_mean: float, out_cv: float, cv: float = 0.10,
) -> float:
    """The decode step (s) at which the chunk-interference model's median per-request TPOT equals the observed
    median (s), by bisection on a log scale within 1/10-10x the prior step; the replica serves `rate_per_s`
    prompts of `chunks` chunks taking `t_prefill_s` in all, with outputs of mean `out_mean` tokens and CV
    `out_cv`; `cv` is the step-time spread."""

    def median(step: float) -> float:
        return tpot_quantile(chunk_mix(rate_per_s, t_prefill_s, chunks, step), cv, out_mean, out_cv, 0.5)

    lo, hi = math.log(prior_step_s / 10.0), math.log(prior_step_s * 10.0)
    for _ in range(20):
        mid = 0.5 * (lo + hi)
        if median(math.exp(mid)) < median_tpot_s:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


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
        cal.update_tail(c, TAIL_LEVELS, ratios, n)


def record(state: WorldState, cal: SelfCalibrator, residuals: pl.DataFrame, at: datetime) -> None:
    """Write scored residuals (from :meth:`SelfCalibrator.update_frame`), the tracks and the risk band."""
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
    current = prior.with_corrections(cal.corrections())
    scored, _ = cal.update_frame(period_residuals(interactive, current, start, end), end)
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
