"""What telemetry actually delivers, per control period, in the schemas' field names (schemas/README.md).

The simulator's internals stay here; a policy receives only these frames.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import polars as pl

from schemas.fleet import GPUS_PER_NODE, PRECISION_INDEX
from schemas.protocol import CLASSES

_UTC = pl.Datetime("us", "UTC")
_EVENT_KINDS = ("replica_started", "replica_ready", "replica_stopped", "replica_reconfigured")
_PRECISIONS = {v: str(k) for k, v in PRECISION_INDEX.items()}
_CLASSES = np.array(CLASSES)


def _ts(start: datetime, seconds: np.ndarray) -> pl.Series:
    micros = np.round(np.asarray(seconds, dtype=np.float64) * 1e6).astype(np.int64)
    base = int(start.timestamp() * 1_000_000)
    return pl.Series(micros + base).cast(pl.Datetime("us")).dt.replace_time_zone("UTC")


class ObservationStream:
    """Slices the run's logs into per-period observation frames; keeps the read cursors and energy counters."""

    def __init__(self, runtime, start: datetime, site_name: str, prices: pl.DataFrame) -> None:  # noqa: ANN001
        self.rt = runtime
        self.start = start
        self.site = site_name
        self.rep_site = np.array([k[0] for k in runtime.pool_keys])[runtime.rep.pool]
        self.gpu_site = np.array([site.name for site in runtime.sites])[runtime.hw.g_site]
        self.prices = prices.sort("published_at")
        req = runtime.requests
        self._arrival_s = req["arrival_s"].to_numpy()
        self.arrivals_all = req.select(
            pl.lit("1").alias("schema_version"),
            "request_id",
            _ts(start, self._arrival_s).alias("event_at"),
            _ts(start, self._arrival_s).alias("arrived_at"),
            "request_class",
            "model",
            "input_tokens",
            "prefix_block_ids",
            pl.lit(site_name).alias("site"),
            "tenant",
            "allowed_regions",
            "sla_ttft_ms",
            "sla_tpot_ms",
            pl.when(pl.col("deadline_s").is_not_null())
            .then(pl.lit(start) + pl.duration(microseconds=(pl.col("deadline_s") * 1e6).cast(pl.Int64)))
            .alias("deadline_at")
            .cast(_UTC),
        )
        self._arr_cursor = 0
        self._comp_cursor = 0
        self._tel_cursor = 0
        self._ev_cursor = 0
        self._price_cursor: datetime | None = None
        self.energy_mj = np.zeros(runtime.hw.g_type.shape[0])

    def prices_published(self, after: datetime | None, upto: datetime) -> pl.DataFrame:
        f = pl.col("published_at") <= upto
        if after is not None:
            f = f & (pl.col("published_at") > after)
        return self.prices.filter(f)

    def arrivals(self, t_end: float) -> pl.DataFrame:
        hi = int(np.searchsorted(self._arrival_s, t_end, side="right"))
        out = self.arrivals_all.slice(self._arr_cursor, hi - self._arr_cursor)
        self._arr_cursor = hi
        return out

    def completions(self) -> pl.DataFrame:
        rt = self.rt
        n = int(rt.logs.n_completed[0])
        idx = rt.logs.completed[self._comp_cursor : n]
        self._comp_cursor = n
        req = rt.req
        first, done, arr = req.first[idx], req.done[idx], req.arrival[idx]
        out_tok = req.out[idx]
        tpot = np.where(out_tok > 1, (done - first) / np.maximum(out_tok - 1, 1), 0.0)
        ttft = first - arr
        rep = req.rep[idx]
        pool = rt.rep.pool[np.maximum(rep, 0)]
        gpu = np.array([g for _, _, g in rt.pool_keys])[pool]
        cls = req.cls[idx]
        sla = met(cls, ttft, tpot, done, req.deadline[idx], rt.slo_ttft_s[idx], rt.slo_tpot_s[idx])
        return pl.DataFrame(
            {
                "schema_version": ["1"] * len(idx),
                "request_id": rt.requests["request_id"].gather(idx)
                if len(idx)
                else pl.Series([], dtype=pl.Utf8),
                "event_at": _ts(self.start, done),
                "arrived_at": _ts(self.start, done),
                "request_class": _CLASSES[cls],
                "model": rt.requests["model"].gather(idx) if len(idx) else [],
                "site": self.rep_site[np.maximum(rep, 0)],
                "replica_id": [f"{self.rep_site[r]}-r{r}" for r in rep],
                "gpu_type": gpu,
                "input_tokens": req.inp[idx],
                "output_tokens": out_tok,
                "cached_input_tokens": req.cached[idx],
                "queued_at": _ts(self.start, arr),
                "first_token_at": _ts(self.start, first),
                "ttft_s": ttft,
                "tpot_s": tpot,
                "e2e_s": done - arr,
                "sla_met": sla,
                "finish_reason": ["stop"] * len(idx),
            }
        )

    def telemetry(self) -> pl.DataFrame:
        """Per-GPU DCGM-style rows for every live replica's GPUs since the last call."""
        rt, logs = self.rt, self.rt.logs
        n = int(logs.n_tel[0])
        lo = self._tel_cursor
        self._tel_cursor = n
        rep = logs.tel_rep[lo:n]
        tp = rt.pools.tp[rt.rep.pool[rep]]
        rows = np.repeat(np.arange(lo, n), tp)
        offs = np.concatenate([np.arange(k) for k in tp]) if len(tp) else np.zeros(0, np.int64)
        g = logs.tel_gpu0[rows] + offs  # the GPUs the replica held when sampled
        power = logs.tel_power_w[rows]
        e = power * 10.0 * 1000.0  # mJ over the 10 s sample
        cum = self._energy_counter(g, e)
        node = rt.hw.g_node[g]
        gtype = np.array(["H100", "A100"])[rt.hw.g_type[g]]
        model = np.array([m for _, m, _ in rt.pool_keys])[rt.rep.pool[logs.tel_rep[rows]]]
        kvcap = 80 * 1024  # MiB per GPU
        return pl.DataFrame(
            {
                "schema_version": ["1"] * len(rows),
                "event_at": _ts(self.start, logs.tel_t[rows]),
                "arrived_at": _ts(self.start, logs.tel_t[rows]),
                "site": self.gpu_site[g],
                "hostname": [
                    f"{s}-{t.lower()}-n{nd:02d}" for s, t, nd in zip(self.gpu_site[g], gtype, node, strict=True)
                ],
                "gpu": g % GPUS_PER_NODE,
                "uuid": [f"GPU-{self.gpu_site[x]}-{x:04d}" for x in g],
                "modelName": gtype,
                "replica_id": [f"{self.rep_site[r]}-r{r}" for r in logs.tel_rep[rows]],
                "model_name": model,
                "DCGM_FI_DEV_POWER_USAGE": power,
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": cum,
                "DCGM_FI_DEV_SM_CLOCK": logs.tel_clock[rows],
                "DCGM_FI_DEV_GPU_UTIL": logs.tel_util[rows] * 100.0,
                "DCGM_FI_DEV_FB_USED": np.round(kvcap * (0.5 + 0.4 * logs.tel_kv[rows])),
                "DCGM_FI_DEV_GPU_TEMP": logs.tel_temp[rows],
                "num_requests_running": logs.tel_running[rows],
                "num_requests_waiting": logs.tel_waiting[rows],
                "kv_cache_usage_perc": logs.tel_kv[rows],
            }
        )

    def _energy_counter(self, g: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Cumulative energy (mJ) per GPU after each of these samples (rows in time order), vectorized."""
        order = np.argsort(g, kind="stable")  # per GPU, time order kept
        gs, es = g[order], e[order]
        first = np.r_[True, gs[1:] != gs[:-1]] if gs.size else np.zeros(0, bool)
        cs = np.cumsum(es)
        group_start = np.maximum.accumulate(np.where(first, np.arange(gs.size), 0)) if gs.size else gs
        within = cs - (cs[group_start] - es[group_start])
        cum = np.empty_like(e)
        cum[order] = self.energy_mj[gs] + within
        np.add.at(self.energy_mj, g, e)
        return cum

    def fleet_events(self) -> pl.DataFrame:
        rt, logs = self.rt, self.rt.logs
        n = int(logs.n_ev[0])
        lo = self._ev_cursor
        self._ev_cursor = n
        rep = logs.ev_rep[lo:n]
        pool = rt.rep.pool[rep]
        return pl.DataFrame(
            {
                "schema_version": ["1"] * len(rep),
                "event_at": _ts(self.start, logs.ev_t[lo:n]),
                "arrived_at": _ts(self.start, logs.ev_t[lo:n]),
                "site": self.rep_site[rep],
                "replica_id": [f"{self.rep_site[r]}-r{r}" for r in rep],
                "model": [rt.pool_keys[p][1] for p in pool],
                "gpu_type": [rt.pool_keys[p][2] for p in pool],
                "kind": [_EVENT_KINDS[k] for k in logs.ev_kind[lo:n]],
                "tp": rt.pools.tp[pool],
                # the weights' part of the precision code (groundtruth.state.precision_code)
                "precision": [_PRECISIONS[int(rt.pools.prec[p]) % len(_PRECISIONS)] for p in pool],
                "sm_clock_mhz": rt.pools.clock[pool],
                "max_batch": rt.pools.max_batch[pool],
                "hostnames": [
                    [f"{rt.pool_keys[p][0]}-{rt.pool_keys[p][2].lower()}-n{int(rt.hw.g_node[max(g0, 0)]):02d}"]
                    for p, g0 in zip(pool, logs.ev_gpu0[lo:n], strict=True)
                ],
            }
        )


def met(
    cls: np.ndarray,
    ttft: np.ndarray,
    tpot: np.ndarray,
    done: np.ndarray,
    deadline: np.ndarray,
    ttft_slo_s: np.ndarray,
    tpot_slo_s: np.ndarray,
) -> np.ndarray:
    """SLA met per request: interactive TTFT and mean TPOT within SLO (s); deferrable done by its deadline."""
    finished = ~np.isnan(done)
    interactive = (ttft <= ttft_slo_s) & (tpot <= tpot_slo_s)
    deferrable = done <= deadline
    return finished & np.where(cls == 2, deferrable, interactive)
