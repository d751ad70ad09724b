"""Synthetic observation frames in the wire schema (schemas/README.md), for tests, benchmarks and docs.

Not a workload model: fixed shapes with a seeded generator, so tests can state exact expectations.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl

_UTC = pl.Datetime("us", "UTC")


def telemetry(
    start: datetime,
    rows: int,
    hosts: int = 16,
    gpu_type: str = "H100",
    site: str = "PJM-1",
    seed: int = 0,
    interval_s: float = 1.0,
) -> pl.DataFrame:
    """DCGM-style telemetry rows: `hosts` nodes x 8 GPUs sampled every `interval_s` seconds from `start`."""
    rng = np.random.default_rng(seed)
    idx = np.arange(rows)
    gpus = hosts * 8
    at = pl.Series([start + timedelta(seconds=float(t)) for t in (idx // gpus) * interval_s], dtype=_UTC)
    return pl.DataFrame(
        {
            "event_at": at,
            "arrived_at": at,
            "site": site,
            "hostname": [f"node-{h:03d}" for h in (idx % gpus) // 8],
            "gpu": (idx % 8).astype(np.int32),
            "uuid": [f"GPU-{i % gpus:05d}" for i in idx],
            "modelName": gpu_type,
            "replica_id": [f"r-{(i % gpus) // 8:03d}" for i in idx],
            "model_name": "llama-3.1-8b",
            "DCGM_FI_DEV_POWER_USAGE": rng.normal(350.0, 30.0, rows),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": idx * 1.0e3,
            "DCGM_FI_DEV_SM_CLOCK": np.full(rows, 1980.0),
            "DCGM_FI_DEV_GPU_UTIL": rng.uniform(40, 100, rows),
            "DCGM_FI_DEV_FB_USED": np.full(rows, 70_000.0),
            "DCGM_FI_DEV_GPU_TEMP": rng.normal(65, 3, rows),
            "num_requests_running": rng.integers(0, 64, rows, dtype=np.int32),
            "num_requests_waiting": rng.integers(0, 4, rows, dtype=np.int32),
            "kv_cache_usage_perc": rng.uniform(0, 1, rows),
        }
    )


def arrivals(
    start: datetime,
    n: int,
    request_class: str = "chat",
    model: str = "llama-3.1-70b",
    rate_per_s: float = 10.0,
    seed: int = 0,
    deadline_s: float | None = None,
) -> pl.DataFrame:
    """Poisson request arrivals of one class from `start` (ids ``<class>-<i>``)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    at = pl.Series([start + timedelta(seconds=float(x)) for x in t], dtype=_UTC)
    deadline = at.dt.offset_by(f"{int(deadline_s)}s") if deadline_s else pl.Series([None] * n, dtype=_UTC)
    return pl.DataFrame(
        {
            "request_id": [f"{request_class}-{i}" for i in range(n)],
            "event_at": at,
            "arrived_at": at,
            "request_class": request_class,
            "model": model,
            "input_tokens": rng.integers(100, 3000, n, dtype=np.int32),
            "prefix_block_ids": [[1, 2]] * n,
            "site": "PJM-1",
            "tenant": "t0",
            "allowed_regions": [["us-east"]] * n,
            "sla_ttft_ms": None if deadline_s else 2000.0,
            "sla_tpot_ms": None if deadline_s else 100.0,
            "deadline_at": deadline,
        }
    )


def completions(
    arr: pl.DataFrame,
    ttft_s: float = 0.3,
    tpot_s: float = 0.04,
    seed: int = 0,
    replica_id: str = "r-000",
    gpu_type: str = "H100",
    prefill_s_per_token: float = 0.0,
) -> pl.DataFrame:
    """Completions of `arr` on one replica: TTFT `ttft_s` plus `prefill_s_per_token` per uncached prompt token (a
    quarter of each prompt is cached), TPOT with 3 % noise, 50-500 output tokens."""
    rng = np.random.default_rng(seed)
    n = arr.height
    out = rng.integers(50, 500, n, dtype=np.int32)
    tpot = tpot_s * rng.lognormal(0.0, 0.03, n)
    cached = (arr["input_tokens"] // 4).cast(pl.Int32)
    ttft = ttft_s + prefill_s_per_token * (arr["input_tokens"] - cached).cast(pl.Float64)
    first = pl.Series([a + timedelta(seconds=float(x)) for a, x in zip(arr["event_at"], ttft, strict=True)], dtype=_UTC)
    done = pl.Series(
        [f + timedelta(seconds=float(x * (o - 1))) for f, x, o in zip(first, tpot, out, strict=True)],
        dtype=_UTC,
    )
    return pl.DataFrame(
        {
            "request_id": arr["request_id"],
            "event_at": done,
            "arrived_at": done,
            "request_class": arr["request_class"],
            "model": arr["model"],
            "site": arr["site"],
            "replica_id": replica_id,
            "gpu_type": gpu_type,
            "input_tokens": arr["input_tokens"],
            "output_tokens": out,
            "cached_input_tokens": cached,
            "queued_at": arr["event_at"],
            "first_token_at": first,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": ttft + tpot * (out - 1),
            "sla_met": True,
            "finish_reason": "stop",
        }
    )


def fleet_events(
    at: datetime,
    replicas: int,
    model: str = "llama-3.1-70b",
    gpu_type: str = "H100",
    tp: int = 4,
    precision: str = "bf16",
    kind: str = "replica_ready",
    site: str = "PJM-1",
    sm_clock_mhz: float = 1980.0,
    max_batch: int = 256,
    kv_cache_dtype: str = "auto",
) -> pl.DataFrame:
    """One fleet event per replica ``r-000``..; hostnames ``node-NNN`` (one node per replica)."""
    ts = pl.Series([at] * replicas, dtype=_UTC)
    return pl.DataFrame(
        {
            "event_at": ts,
            "arrived_at": ts,
            "site": site,
            "replica_id": [f"r-{i:03d}" for i in range(replicas)],
            "model": model,
            "gpu_type": gpu_type,
            "kind": kind,
            "tp": tp,
            "precision": precision,
            "kv_cache_dtype": kv_cache_dtype,
            "sm_clock_mhz": sm_clock_mhz,
            "max_batch": max_batch,
            "hostnames": [[f"node-{i:03d}"] for i in range(replicas)],
        }
    )


def prices(start: datetime, hours: int, market: str = "PJM", price_usd_mwh: float = 40.0) -> pl.DataFrame:
    """Hourly real-time prices published when their hour ends."""
    s = pl.Series([start + timedelta(hours=h) for h in range(hours)], dtype=_UTC)
    e = s.dt.offset_by("1h")
    return pl.DataFrame(
        {
            "market": market,
            "location": "PJM-RTO",
            "market_run": "REAL_TIME_HOURLY",
            "interval_start": s,
            "interval_end": e,
            "lmp_usd_mwh": [price_usd_mwh + h for h in range(hours)],
            "published_at": e,
            "event_at": s,
            "arrived_at": e,
        }
    )
