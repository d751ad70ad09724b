"""What telemetry actually delivers, per control period, in the schemas' field names (schemas/README.md).

The simulator's internals stay here; a policy receives only these frames.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from schemas.fleet import GPUS_PER_NODE
from schemas.policy import Observations
from schemas.protocol import CLASSES
from worldmodel.groundtruth.state import decode_precision

_UTC = pl.Datetime("us", "UTC")
_EVENT_KINDS = ("replica_started", "replica_ready", "replica_stopped", "replica_reconfigured")
_CLASSES = np.array(CLASSES)
_GPU_NAMES = np.array(["H100", "A100"])
_FRAMES = ("arrivals", "completions", "telemetry", "fleet_events", "prices")


def _once(build: Callable[[], pl.DataFrame]) -> Callable[[], pl.DataFrame]:
    """`build`, called at most once (later calls return the first result)."""
    memo: list[pl.DataFrame] = []

    def get() -> pl.DataFrame:
        if not memo:
            memo.append(build())
        return memo[0]

    return get


class LazyObservations(Observations):
    """`Observations` whose frames are built when first read, identical to eager ones.

    The stream takes every number at the period close (so later simulation cannot change a frame); only the
    polars frames (timestamps, ids, strings) wait until a policy reads them. A reference policy that reads
    no frame, or only the prices, pays for nothing else. Each field is a frame or a zero-argument builder.
    Pickling, `dataclasses.replace` and equality see plain frames.
    """

    def __init__(self, as_of: datetime, period_index: int, **frames: Any) -> None:  # noqa: ANN401
        object.__setattr__(self, "as_of", as_of)
        object.__setattr__(self, "period_index", period_index)
        object.__setattr__(self, "_lazy", {k: frames[k] for k in _FRAMES})

    def __getattr__(self, name: str) -> pl.DataFrame:  # only reached for the frames (not set as attributes)
        lazy = self.__dict__.get("_lazy")
        if lazy is None or name not in lazy:
            raise AttributeError(name)
        v = lazy[name]
        frame = v() if callable(v) else v
        object.__setattr__(self, name, frame)  # later reads find the attribute itself
        return frame

    def __reduce__(self) -> tuple[Any, ...]:
        return (Observations, (self.as_of, self.period_index, *(getattr(self, k) for k in _FRAMES)))


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
        self.pool_gpu = np.array([g for _, _, g in runtime.pool_keys])
        self.pool_model = np.array([m for _, m, _ in runtime.pool_keys])
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
        return self.completions_lazy()()

    def completions_lazy(self) -> Callable[[], pl.DataFrame]:
        """The completions since the last call: the numbers gathered now, the frame built when called."""
        rt = self.rt
        n = int(rt.logs.n_completed[0])
        idx = rt.logs.completed[self._comp_cursor : n].copy()
        self._comp_cursor = n
        req = rt.req
        first, done, arr = req.first[idx], req.done[idx], req.arrival[idx]
        out_tok = req.out[idx]
        tpot = np.where(out_tok > 1, (done - first) / np.maximum(out_tok - 1, 1), 0.0)
        ttft = first - arr
        rep = req.rep[idx]
        pool = rt.rep.pool[np.maximum(rep, 0)]
        gpu = self.pool_gpu[pool]
        cls = req.cls[idx]
        sla = met(cls, ttft, tpot, done, req.deadline[idx], rt.slo_ttft_s[idx], rt.slo_tpot_s[idx])
        inp, cached = req.inp[idx], req.cached[idx]
        requests, start, rep_site = rt.requests, self.start, self.rep_site

        def build() -> pl.DataFrame:
            return pl.DataFrame(
                {
                    "schema_version": ["1"] * len(idx),
                    "request_id": requests["request_id"].gather(idx) if len(idx) else pl.Series([], dtype=pl.Utf8),
                    "event_at": _ts(start, done),
                    "arrived_at": _ts(start, done),
                    "request_class": _CLASSES[cls],
                    "model": requests["model"].gather(idx) if len(idx) else [],
                    "site": rep_site[np.maximum(rep, 0)],
                    "replica_id": [f"{rep_site[r]}-r{r}" for r in rep],
                    "gpu_type": gpu,
                    "input_tokens": inp,
                    "output_tokens": out_tok,
                    "cached_input_tokens": cached,
                    "queued_at": _ts(start, arr),
                    "first_token_at": _ts(start, first),
                    "ttft_s": ttft,
                    "tpot_s": tpot,
                    "e2e_s": done - arr,
                    "sla_met": sla,
                    "finish_reason": ["stop"] * len(idx),
                }
            )

        return _once(build)

    def telemetry(self) -> pl.DataFrame:
        """Per-GPU DCGM-style rows for every live replica's GPUs since the last call."""
        return self.telemetry_lazy()()

    def telemetry_lazy(self) -> Callable[[], pl.DataFrame]:
        """`telemetry`, its numbers and energy counters taken now, the frame built when called."""
        rt, logs = self.rt, self.rt.logs
        n = int(logs.n_tel[0])
        lo = self._tel_cursor
        self._tel_cursor = n
        rep = logs.tel_rep[lo:n]
        tp = rt.pools.tp[rt.rep.pool[rep]]
        rows = np.repeat(np.arange(lo, n), tp)
        # 0..tp-1 within each sampled replica
        offs = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(tp) - tp, tp)
        g = logs.tel_gpu0[rows] + offs  # the GPUs the replica held when sampled
        power = logs.tel_power_w[rows]
        e = power * 10.0 * 1000.0  # mJ over the 10 s sample
        cum = self._energy_counter(g, e)
        node = rt.hw.g_node[g]
        gtype = _GPU_NAMES[rt.hw.g_type[g]]
        tel_rep = logs.tel_rep[rows]
        model = self.pool_model[rt.rep.pool[tel_rep]]
        cols = {
            "t": logs.tel_t[rows],
            "clock": logs.tel_clock[rows],
            "util": logs.tel_util[rows],
            "kv": logs.tel_kv[rows],
            "temp": logs.tel_temp[rows],
            "running": logs.tel_running[rows],
            "waiting": logs.tel_waiting[rows],
        }
        start, gpu_site, rep_site = self.start, self.gpu_site, self.rep_site
        kvcap = 80 * 1024  # MiB per GPU

        def build() -> pl.DataFrame:
            site = gpu_site[g]
            return pl.DataFrame(
                {
                    "schema_version": ["1"] * len(rows),
                    "event_at": _ts(start, cols["t"]),
                    "arrived_at": _ts(start, cols["t"]),
                    "site": site,
                    "hostname": [f"{s}-{t.lower()}-n{nd:02d}" for s, t, nd in zip(site, gtype, node, strict=True)],
                    "gpu": g % GPUS_PER_NODE,
                    "uuid": [f"GPU-{gpu_site[x]}-{x:04d}" for x in g],
                    "modelName": gtype,
                    "replica_id": [f"{rep_site[r]}-r{r}" for r in tel_rep],
                    "model_name": model,
                    "DCGM_FI_DEV_POWER_USAGE": power,
                    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": cum,
                    "DCGM_FI_DEV_SM_CLOCK": cols["clock"],
                    "DCGM_FI_DEV_GPU_UTIL": cols["util"] * 100.0,
                    "DCGM_FI_DEV_FB_USED": np.round(kvcap * (0.5 + 0.4 * cols["kv"])),
                    "DCGM_FI_DEV_GPU_TEMP": cols["temp"],
                    "num_requests_running": cols["running"],
                    "num_requests_waiting": cols["waiting"],
                    "kv_cache_usage_perc": cols["kv"],
                }
            )

        return _once(build)

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
        return self.fleet_events_lazy()()

    def fleet_events_lazy(self) -> Callable[[], pl.DataFrame]:
        """`fleet_events`, the pools' settings taken now, the frame built when called."""
        rt, logs = self.rt, self.rt.logs
        n = int(logs.n_ev[0])
        lo = self._ev_cursor
        self._ev_cursor = n
        rep = logs.ev_rep[lo:n].copy()
        pool = rt.rep.pool[rep]
        t = logs.ev_t[lo:n].copy()
        kind = logs.ev_kind[lo:n].copy()
        gpu0 = logs.ev_gpu0[lo:n].copy()
        tp, prec = rt.pools.tp[pool], rt.pools.prec[pool]
        clock, max_batch = rt.pools.clock[pool], rt.pools.max_batch[pool]
        node = rt.hw.g_node[np.maximum(gpu0, 0)]
        start, rep_site, keys = self.start, self.rep_site, rt.pool_keys

        def build() -> pl.DataFrame:
            engine = [decode_precision(code) for code in prec.tolist()]  # (weights, KV dtype) per event
            return pl.DataFrame(
                {
                    "schema_version": ["1"] * len(rep),
                    "event_at": _ts(start, t),
                    "arrived_at": _ts(start, t),
                    "site": rep_site[rep],
                    "replica_id": [f"{rep_site[r]}-r{r}" for r in rep],
                    "model": [keys[p][1] for p in pool],
                    "gpu_type": [keys[p][2] for p in pool],
                    "kind": [_EVENT_KINDS[k] for k in kind],
                    "tp": tp,
                    "precision": [w for w, _ in engine],
                    "kv_cache_dtype": [kv for _, kv in engine],
                    "sm_clock_mhz": clock,
                    "max_batch": max_batch,
                    "hostnames": [
                        [f"{keys[p][0]}-{keys[p][2].lower()}-n{int(nd):02d}"] for p, nd in zip(pool, node, strict=True)
                    ],
                }
            )

        return _once(build)

    def observe(self, as_of: datetime, period_index: int, t_end: float, prices_after: datetime | None) -> Observations:
        """The period's observations up to t_end (s since start): numbers taken now, each frame built when a
        policy first reads it (a policy that reads none pays nothing)."""
        arrivals = self.arrivals(t_end)
        return LazyObservations(
            as_of,
            period_index,
            arrivals=arrivals,
            completions=self.completions_lazy(),
            telemetry=self.telemetry_lazy(),
            fleet_events=self.fleet_events_lazy(),
            prices=_once(lambda: self.prices_published(prices_after, as_of)),
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
