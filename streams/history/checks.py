"""Bad or incomplete history: each check drops, adjusts or assumes, and says so in the `HistoryReport`.

Checks, in order: records missing a value their schema requires (dropped), duplicate records (the first
kept), unknown request classes and models, clock skew between topics (completions aligned to arrivals by
request id; telemetry and fleet events by their producer-to-bus lag against the arrivals'), unknown GPU
types, completions without arrivals, and gaps (no arrivals, or no telemetry, for longer than the configured
span). Arrivals without a completion are handled where their output size is needed
(`streams.history.workload`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta
from types import NoneType, UnionType
from typing import get_args, get_type_hints

import numpy as np
import polars as pl

from schemas.fleet import GpuType
from schemas.protocol import CLASSES, ModelName
from schemas.records import RECORD_TYPES
from streams.history.config import HistoryConfig
from streams.history.reader import RawHistory
from streams.history.report import HistoryReport

#: Record identity per kind: two records with the same key are one record delivered twice.
DEDUPE_KEYS: dict[str, tuple[str, ...]] = {
    "request_arrival": ("request_id",),
    "request_completion": ("request_id",),
    "gpu_telemetry": ("hostname", "gpu", "replica_id", "event_at"),
    "fleet_event": ("replica_id", "kind", "event_at"),
    "price": ("market", "location", "market_run", "interval_start"),
}
_UTC = pl.Datetime("us", "UTC")


@dataclass(frozen=True)
class Records:
    """Checked records, event times on the arrivals' clock; telemetry and fleet events carry `gpu_type` as a
    schemas.fleet.GpuType name (telemetry: from modelName, else the replica's fleet events)."""

    arrivals: pl.DataFrame
    completions: pl.DataFrame
    telemetry: pl.DataFrame
    fleet_events: pl.DataFrame
    prices: pl.DataFrame


def gpu_type_of(name: pl.Expr) -> pl.Expr:
    """The GpuType a DCGM modelName or fleet-event gpu_type names ("NVIDIA H100 80GB HBM3" -> "H100"), else
    null."""
    out = pl.lit(None, dtype=pl.String)
    for g in GpuType:
        out = pl.when(name.str.to_uppercase().str.contains(g.value)).then(pl.lit(g.value)).otherwise(out)
    return out


#: Required arrival fields the workload fills when a producer leaves them out (`streams.history.workload`).
DEFAULTED = {"request_arrival": ("tenant", "allowed_regions", "prefix_block_ids", "site")}


def non_null_fields(kind: str) -> list[str]:
    """The fields of `kind` that its typed record does not allow to be null.

    >>> non_null_fields("gpu_telemetry")
    ['event_at', 'arrived_at', 'site', 'hostname']
    """
    cls = RECORD_TYPES[kind]
    hints = get_type_hints(cls)
    return [f.name for f in fields(cls) if not (isinstance(h := hints[f.name], UnionType) and NoneType in get_args(h))]


def _complete(kind: str, df: pl.DataFrame, report: HistoryReport) -> pl.DataFrame:
    defaulted = DEFAULTED.get(kind, ())
    nulls = {c: n for c in non_null_fields(kind) if (n := df[c].null_count())}
    filled = {c: n for c, n in nulls.items() if c in defaulted}
    if filled:
        report.add(
            "incomplete_records",
            "assumed",
            kind,
            max(filled.values()),
            f"records without {sorted(filled)}: tenant-<class>, every region, no prefix blocks, the fleet's site "
            f"(nulls per field: {filled})",
            nulls=filled,
        )
    nulls = {c: n for c, n in nulls.items() if c not in defaulted}
    if not nulls:
        return df
    out = df.drop_nulls(subset=list(nulls))
    report.add(
        "incomplete_records",
        "dropped",
        kind,
        df.height - out.height,
        f"records without a value their schema requires (nulls per field: {nulls})",
        nulls=nulls,
    )
    return out


def _dedupe(kind: str, df: pl.DataFrame, report: HistoryReport) -> pl.DataFrame:
    out = df.unique(subset=list(DEDUPE_KEYS[kind]), keep="first", maintain_order=True)
    n = df.height - out.height
    report.add(
        "duplicates",
        "dropped" if n else "checked",
        kind,
        n,
        f"records with the same {', '.join(DEDUPE_KEYS[kind])} as an earlier one (the first kept)",
    )
    return out


def _known(arrivals: pl.DataFrame, report: HistoryReport) -> pl.DataFrame:
    models = [m.value for m in ModelName]
    ok = pl.col("request_class").is_in(list(CLASSES)) & pl.col("model").is_in(models)
    bad = arrivals.filter(~ok)
    if bad.height:
        report.add(
            "unknown_class_or_model",
            "dropped",
            "request_arrival",
            bad.height,
            f"request class not in {list(CLASSES)} or model not in {models}; no serving physics for them",
            examples=bad.select("request_class", "model").unique().head(5).rows(),
        )
    return arrivals.filter(ok)


def _median_s(x: pl.Series) -> float:
    v = x.drop_nulls()
    return float(v.dt.total_microseconds().median()) / 1e6 if v.len() else 0.0  # type: ignore[arg-type]


def _shift(df: pl.DataFrame, cols: tuple[str, ...], by_s: float) -> pl.DataFrame:
    d = timedelta(seconds=by_s)
    return df.with_columns(pl.col(c) + d for c in cols)


def _skew(
    arr: pl.DataFrame, comp: pl.DataFrame, tel: pl.DataFrame, ev: pl.DataFrame, tol_s: float, report: HistoryReport
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Align completions (by request id), telemetry and fleet events (by bus lag) to the arrivals' clock."""
    joined = comp.select("request_id", "queued_at").join(arr.select("request_id", "event_at"), on="request_id")
    offset = _median_s(joined["queued_at"] - joined["event_at"]) if joined.height else 0.0
    if abs(offset) > tol_s:
        comp = _shift(comp, ("event_at", "queued_at", "first_token_at"), -offset)
        report.add(
            "clock_skew",
            "adjusted",
            "request_completion",
            comp.height,
            f"completions' clock is {offset:+.3f} s off the arrivals' (median queued_at - arrival event_at "
            f"over {joined.height} requests); their instants shifted by {-offset:+.3f} s",
            offset_s=offset,
        )
    else:
        report.add(
            "clock_skew",
            "checked",
            "request_completion",
            0,
            f"median offset to arrivals {offset:+.3f} s, within {tol_s} s",
            offset_s=offset,
        )
    ref = _median_s(arr["arrived_at"] - arr["event_at"]) if arr.height else 0.0
    out = []
    for kind, df in (("gpu_telemetry", tel), ("fleet_event", ev)):
        lag = _median_s(df["arrived_at"] - df["event_at"]) if df.height else ref
        if abs(lag - ref) > tol_s:
            df = _shift(df, ("event_at",), lag - ref)
            report.add(
                "clock_skew",
                "adjusted",
                kind,
                df.height,
                f"producer-to-bus lag {lag:.3f} s against the arrivals' {ref:.3f} s: the producer's clock is "
                f"off by {ref - lag:+.3f} s; event_at shifted by {lag - ref:+.3f} s",
                offset_s=ref - lag,
            )
        else:
            report.add(
                "clock_skew",
                "checked",
                kind,
                0,
                f"producer-to-bus lag {lag:.3f} s, arrivals' {ref:.3f} s: within {tol_s} s",
                offset_s=ref - lag,
            )
        out.append(df)
    return comp, out[0], out[1]


def _gpu_types(tel: pl.DataFrame, ev: pl.DataFrame, report: HistoryReport) -> tuple[pl.DataFrame, pl.DataFrame]:
    ev = ev.with_columns(gpu_type_of(pl.col("gpu_type")).alias("_gpu"))
    bad = ev.filter(pl.col("_gpu").is_null())
    if bad.height:
        report.add(
            "unknown_gpu_type",
            "dropped",
            "fleet_event",
            bad.height,
            f"GPU types with no serving physics ({sorted(set(bad['gpu_type'].to_list()))}); their replicas are "
            "left out of the fleet",
            names=sorted(set(bad["gpu_type"].to_list())),
        )
    ev = ev.filter(pl.col("_gpu").is_not_null()).with_columns(pl.col("_gpu").alias("gpu_type")).drop("_gpu")
    by_replica = ev.group_by("replica_id").agg(pl.col("gpu_type").last().alias("_ev_gpu"))
    tel = tel.join(by_replica, on="replica_id", how="left").with_columns(
        pl.coalesce(gpu_type_of(pl.col("modelName")), pl.col("_ev_gpu")).alias("gpu_type")
    )
    bad = tel.filter(pl.col("gpu_type").is_null())
    if bad.height:
        names = sorted({str(n) for n in bad["modelName"].to_list()})
        report.add(
            "unknown_gpu_type",
            "dropped",
            "gpu_telemetry",
            bad.height,
            f"samples of GPU types with no serving physics ({names}); their energy and replicas are left out "
            "of the recorded figures",
            names=names,
        )
    else:
        report.add("unknown_gpu_type", "checked", "gpu_telemetry", 0, "every sample's GPU type is known")
    return tel.filter(pl.col("gpu_type").is_not_null()).drop("_ev_gpu"), ev


def _orphans(arr: pl.DataFrame, comp: pl.DataFrame, report: HistoryReport) -> pl.DataFrame:
    orphans = comp.join(arr.select("request_id"), on="request_id", how="anti")
    report.add(
        "completion_without_arrival",
        "dropped" if orphans.height else "checked",
        "request_completion",
        orphans.height,
        "completions whose request never arrived in the records: no arrival time or prompt to replay",
    )
    return comp.join(arr.select("request_id"), on="request_id", how="semi")


def _gaps(kind: str, times: pl.Series, gap_s: float, report: HistoryReport, assumption: str) -> None:
    t = times.drop_nulls().unique().sort().dt.epoch("us").to_numpy() / 1e6
    d = np.diff(t)
    big = d > gap_s
    if big.any():
        first = times.drop_nulls().unique().sort()[int(np.argmax(big))]
        report.add(
            "gaps",
            "assumed",
            kind,
            int(big.sum()),
            f"intervals longer than {gap_s:.0f} s without a record ({d[big].sum():.0f} s in all, the first "
            f"after {first}); {assumption}",
            total_s=float(d[big].sum()),
        )
    else:
        report.add("gaps", "checked", kind, 0, f"no interval longer than {gap_s:.0f} s without a record")


def check(raw: RawHistory, config: HistoryConfig, report: HistoryReport) -> Records:
    """Run every check on the records as read; return the records the replay uses."""
    f = {k: _dedupe(k, _complete(k, df, report), report) for k, df in raw.frames.items()}
    arr = _known(f["request_arrival"], report).sort("event_at", maintain_order=True)
    comp, tel, ev = _skew(
        arr, f["request_completion"], f["gpu_telemetry"], f["fleet_event"], config.skew_tolerance_s, report
    )
    tel, ev = _gpu_types(tel, ev, report)
    comp = _orphans(arr, comp, report)
    _gaps(
        "request_arrival",
        arr["event_at"],
        config.gap_s,
        report,
        "taken as no requests arriving (a recording gap would understate the load)",
    )
    if tel.height:
        interval = _median_s(tel["event_at"].unique().sort().diff()) or 10.0
        _gaps(
            "gpu_telemetry",
            tel["event_at"],
            3.0 * interval,
            report,
            "replica counts from fleet events where present; energy over a gap is missing from the recorded figure",
        )
    return Records(arr, comp, tel.sort("event_at"), ev.sort("event_at", maintain_order=True), f["price"])
