"""What the records show about the fleet: inventory (a `FleetSpec`), replica spans and pool settings, the
replicas per pool over time, and the recorded outcomes the fidelity table compares with (GPU-hours,
GPU energy, per-class latency percentiles and violation rates).

GPU-hours and energy are read from telemetry exactly as the simulator's figures are made (every reporting
GPU of a warm or loading replica, sample power x sample interval), so both sides measure the same thing;
site overhead and idle nodes that report nothing are in neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import polars as pl

from schemas.fleet import (
    DEFAULT_TP,
    MARKET_REGION,
    NODE_PEAK_W,
    POWER_CAP_SHARE,
    SM_CLOCK_RANGE_MHZ,
    FleetSpec,
    GpuType,
    NodeGroup,
    Site,
    default_max_num_seqs,
)
from schemas.plan import PoolPlan
from schemas.protocol import CLASSES, ModelName
from schemas.records import reported_kv_cache_dtype
from streams.history.checks import Records
from streams.history.config import HistoryConfig
from streams.history.report import HistoryReport

#: Autoscaler sync interval (s): replica counts are sampled on this grid.
SYNC_S = 15.0


@dataclass(frozen=True)
class Spans:
    """Replica lifetimes: one row per span (site, model, gpu_type, replica_id, tp, start_s, end_s; s after
    the window start), and each pool's last recorded settings (site, model, gpu) -> PoolPlan template
    (floor and ceiling 0)."""

    spans: pl.DataFrame
    pools: dict[tuple[str, str, str], PoolPlan]

    def counts(self, times_s: np.ndarray) -> dict[tuple[str, str, str], np.ndarray]:
        """Replicas alive (warm or loading) per pool at each instant (s after the window start)."""
        out = {}
        for key in self.pools:
            sub = self.spans.filter(
                (pl.col("site") == key[0]) & (pl.col("model") == key[1]) & (pl.col("gpu_type") == key[2])
            )
            s, e = sub["start_s"].to_numpy(), sub["end_s"].to_numpy()
            out[key] = ((s[None, :] <= times_s[:, None]) & (times_s[:, None] < e[None, :])).sum(axis=1)
        return out

    def initial(self) -> dict[tuple[str, str, str], int]:
        """Replicas alive at the window start per pool."""
        return {k: int(v[0]) for k, v in self.counts(np.zeros(1)).items()}

    def per_period(self, period_s: float, periods: int) -> dict[tuple[str, str, str], list[tuple[int, int]]]:
        """(fewest, most) replicas per pool in each period, sampled every `SYNC_S` seconds."""
        t = np.arange(0.0, periods * period_s, SYNC_S)
        k = (t // period_s).astype(np.int64)
        out = {}
        for key, n in self.counts(t).items():
            out[key] = [(int(n[k == i].min()), int(n[k == i].max())) for i in range(periods)]
        return out


@dataclass(frozen=True)
class ClassOutcome:
    """One class's recorded or simulated outcome: offered (count), violation rate (0-1, unfinished counted
    as violations) and TTFT/TPOT percentiles (ms; None without completions)."""

    offered: int
    violation_rate: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None


@dataclass(frozen=True)
class Outcomes:
    """Fleet-level and per-class outcomes on one side of the fidelity table (GPU-hours in h, energy in MWh of
    GPU power as telemetry reports it)."""

    gpu_hours: float
    gpu_energy_mwh: float
    classes: dict[str, ClassOutcome] = field(default_factory=dict)


def _ms(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q) * 1000.0) if x.size else None


def class_outcome(n: int, met: int, ttft_s: np.ndarray, tpot_s: np.ndarray) -> ClassOutcome:
    """A `ClassOutcome` from the offered and SLA-met counts and the completed requests' TTFT and TPOT (s)."""
    return ClassOutcome(
        n, (n - met) / n if n else 0.0, _ms(ttft_s, 50), _ms(ttft_s, 99), _ms(tpot_s, 50), _ms(tpot_s, 99)
    )


def recorded_outcomes(records: Records, start: datetime, end: datetime | None = None) -> Outcomes:
    """The outcomes the records show from `start` on: GPU-hours and energy of the per-GPU telemetry samples
    (replica-level samples, gpu null, hold no GPU's figures), per-class latencies of the requests that
    arrived in [start, end) (records' own sla_met; no completion: a violation)."""
    tel = records.telemetry.filter((pl.col("event_at") > start) & pl.col("gpu").is_not_null())
    dt = _sample_interval_s(records.telemetry)
    power = tel["DCGM_FI_DEV_POWER_USAGE"].fill_null(0.0).to_numpy()
    arr = records.arrivals.filter(pl.col("event_at") >= start)
    if end is not None:
        arr = arr.filter(pl.col("event_at") < end)
    joined = arr.select("request_id", "request_class").join(
        records.completions.select("request_id", "ttft_s", "tpot_s", "sla_met", "output_tokens"),
        on="request_id",
        how="left",
    )
    classes = {}
    for c in CLASSES:
        sub = joined.filter(pl.col("request_class") == c)
        if sub.height:
            tpot = sub.filter(pl.col("output_tokens") > 1)["tpot_s"].to_numpy().astype(np.float64)
            classes[c] = class_outcome(
                sub.height,
                int(sub["sla_met"].fill_null(False).sum()),
                sub["ttft_s"].to_numpy().astype(np.float64),
                tpot,
            )
    return Outcomes(tel.height * dt / 3600.0, float(power.sum() * dt / 3.6e9), classes)


def _sample_interval_s(tel: pl.DataFrame) -> float:
    """Telemetry sample interval (s): the median step between a GPU's samples (10 s if unknown)."""
    if tel.height < 2:
        return 10.0
    d = tel.sort("event_at").group_by("hostname", "gpu").agg(pl.col("event_at").diff().dt.total_microseconds())
    steps = d.explode("event_at")["event_at"].drop_nulls()
    return float(steps.median()) / 1e6 if steps.len() else 10.0  # type: ignore[arg-type]


def spans(records: Records, start: datetime, end_s: float, report: HistoryReport) -> Spans:
    """Replica spans from fleet events (each started/ready opens a span, stopped closes it), else from
    telemetry (first to last sample plus one interval, reported as assumed); `end_s` closes open spans."""
    ev = reported_kv_cache_dtype(records.fleet_events)
    rows = []
    pools: dict[tuple[str, str, str], PoolPlan] = {}
    if ev.height:
        ev = ev.with_columns(((pl.col("event_at") - start).dt.total_microseconds() / 1e6).alias("t"))
        open_: dict[str, dict] = {}
        for r in ev.iter_rows(named=True):
            key = (r["site"], r["model"], r["gpu_type"])
            pools[key] = PoolPlan(
                *key, 0, 0, int(r["tp"]), str(r["precision"]), int(r["max_batch"]), int(r["sm_clock_mhz"]),
                kv_dtype=r["kv_cache_dtype"],
            )
            if r["kind"] == "replica_stopped":
                span = open_.pop(r["replica_id"], None)
                if span is None:
                    span = {**_span_of(r), "start_s": min(0.0, r["t"])}
                    report.add(
                        "replica_stop_without_start",
                        "assumed",
                        "fleet_event",
                        1,
                        f"replica {r['replica_id']} stopped without a recorded start: taken as running "
                        "from the window start",
                    )
                rows.append({**span, "end_s": r["t"]})
            elif r["replica_id"] not in open_:
                open_[r["replica_id"]] = {**_span_of(r), "start_s": r["t"]}
        rows += [{**s, "end_s": end_s} for s in open_.values()]
    else:
        tel = records.telemetry.filter(pl.col("replica_id").is_not_null() & pl.col("model_name").is_not_null())
        dt = _sample_interval_s(records.telemetry)
        by = tel.group_by("site", "model_name", "gpu_type", "replica_id").agg(
            pl.col("event_at").min().alias("first"),
            pl.col("event_at").max().alias("last"),
            pl.struct("hostname", "gpu").n_unique().alias("tp"),
            pl.col("DCGM_FI_DEV_SM_CLOCK").median().alias("clock"),
        )
        for r in by.iter_rows(named=True):
            key = (r["site"], r["model_name"], r["gpu_type"])
            clock = r["clock"] or SM_CLOCK_RANGE_MHZ[GpuType(r["gpu_type"])][1]
            pools[key] = PoolPlan(*key, 0, 0, int(r["tp"]), "bf16", default_max_num_seqs(r["gpu_type"]), int(clock))
            rows.append(
                {
                    "site": r["site"],
                    "model": r["model_name"],
                    "gpu_type": r["gpu_type"],
                    "replica_id": r["replica_id"],
                    "tp": int(r["tp"]),
                    "start_s": (r["first"] - start).total_seconds() - dt,
                    "end_s": (r["last"] - start).total_seconds(),
                }
            )
        report.add(
            "replicas_from_telemetry",
            "assumed",
            "gpu_telemetry",
            len(rows),
            "no fleet events: replica lifetimes from each replica's first to last telemetry sample, tp from "
            "its GPUs, bf16 and the engine's default batch assumed",
        )
    schema = {
        "site": pl.String,
        "model": pl.String,
        "gpu_type": pl.String,
        "replica_id": pl.String,
        "tp": pl.Int64,
        "start_s": pl.Float64,
        "end_s": pl.Float64,
    }
    return Spans(pl.DataFrame(rows, schema=schema), pools)


def _span_of(r: dict) -> dict:
    return {
        "site": r["site"],
        "model": r["model"],
        "gpu_type": r["gpu_type"],
        "replica_id": r["replica_id"],
        "tp": int(r["tp"]),
    }


def fleet(records: Records, config: HistoryConfig, market: str, report: HistoryReport) -> FleetSpec:
    """The fleet inventory: the config's nodes per GPU type where given, else the distinct hosts that appear
    in telemetry and fleet events (nodes that never served are invisible to the records: reported)."""
    tel = records.telemetry.select("site", "gpu_type", "hostname")
    ev = records.fleet_events.select("site", "gpu_type", pl.col("hostnames").alias("hostname")).explode("hostname")
    hosts = pl.concat([tel, ev]).drop_nulls().unique()
    names = sorted(set(hosts["site"].to_list()) | set(config.fleet))
    if not names:
        raise ValueError("no site in the records (telemetry, fleet events) nor in the config's [fleet]")
    if len(names) > 1:
        raise ValueError(f"the history holds several sites {names}; replay one site's history at a time")
    name = names[0]
    inv = config.fleet.get(name)
    if inv is not None:
        nodes = dict(inv.nodes)
        report.add(
            "inventory",
            "checked",
            "replay",
            sum(nodes.values()),
            f"site {name}: nodes per GPU type from the config { ({str(k): v for k, v in nodes.items()}) }",
        )
    else:
        seen = hosts.filter(pl.col("site") == name).group_by("gpu_type").agg(pl.len().alias("n"))
        nodes = {GpuType(g): int(n) for g, n in seen.iter_rows()}
        report.add(
            "inventory",
            "assumed",
            "replay",
            sum(nodes.values()),
            f"site {name}: nodes = distinct hosts seen per GPU type { ({str(k): v for k, v in nodes.items()}) }; "
            "nodes that never served are not in the records (set [fleet] in the config)",
        )
    groups = tuple(
        NodeGroup(g, nodes[g], max(1, nodes[g] // 4)) for g in GpuType if nodes.get(g, 0) > 0
    )  # default_site's order
    cap = inv.power_cap_w if inv is not None and inv.power_cap_w is not None else None
    if cap is None:
        cap = POWER_CAP_SHARE * sum(NODE_PEAK_W[g.gpu] * g.nodes for g in groups)
        report.add(
            "power_cap",
            "assumed",
            "replay",
            0,
            f"site power cap {cap / 1000:.0f} kW: the default share "
            f"{POWER_CAP_SHARE} of the fleet's peak (set power_cap_w in [fleet.{name}])",
        )
    return FleetSpec((Site(name, market, groups, cap, MARKET_REGION[market]),))


def pool_templates(fleet_spec: FleetSpec, recorded: Spans) -> dict[tuple[str, str, str], PoolPlan]:
    """A PoolPlan (floor and ceiling 0) for every model on every GPU type of the fleet: the recorded settings
    where the pool served, else bf16, the default tp and batch, the maximum clock."""
    out = {}
    for site in fleet_spec.sites:
        for g in site.groups:
            for m in ModelName:
                key = (site.name, m.value, g.gpu.value)
                out[key] = recorded.pools.get(key) or PoolPlan(
                    *key,
                    0,
                    0,
                    DEFAULT_TP[(m.value, g.gpu)],
                    "bf16",
                    default_max_num_seqs(g.gpu.value),
                    SM_CLOCK_RANGE_MHZ[g.gpu][1],
                )
    return out
