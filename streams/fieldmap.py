"""Field maps: foreign names and units onto the wire schemas, configured in TOML (streams/fieldmaps/).

Operators keep their producers: DCGM exporter and vLLM samples forwarded from Prometheus, OpenTelemetry GenAI
request spans and gridstatus LMP frames are mapped record by record onto gpu_telemetry, request_completion and
price. Every mapped record is validated; anything that cannot be mapped raises :class:`FieldMapError` (a
:class:`schemas.SchemaError`) whose reason names the source and the field, ready for the dead-letter topic.

Prometheus samples carry one metric each, so a DCGM sample becomes a partial gpu_telemetry record (that
metric set, every other metric null); :func:`fold_telemetry` merges the partial records of one
(event_at, hostname, gpu). vLLM gauges are per replica: their records have ``gpu`` null and hold for every
GPU of ``replica_id``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from schemas import SchemaError, availability, load, validate
from schemas.protocol import PROTOCOL_V1
from schemas.timestamps import from_us, ts_from_wire, ts_to_wire
from streams.units import FIELD_UNITS, convert

_TELEMETRY_METRICS = [f for f in FIELD_UNITS if f in load("gpu_telemetry")["properties"]]
_COMPLETION_PICKED = (
    "request_id",
    "model",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "replica_id",
)
SHAPES = ("prometheus", "otel_span", "gridstatus_lmp")


class FieldMapError(SchemaError):
    """A foreign record that cannot be mapped; ``kind`` is the target kind, ``source`` the map's source."""

    def __init__(self, kind: str, source: str, reason: str, field: str | None = None) -> None:
        super().__init__(kind, f"{source}: {reason}", field)
        self.source = source




@dataclass(frozen=True)
class FieldSpec:
    """Where one target field comes from: names tried in order, the source unit, a default if absent."""

    names: tuple[str, ...]
    unit: str | None = None
    default: Any = None


@dataclass(frozen=True)
class Source:
    """One configured source: its shape, target kind and the per-field, per-metric and value maps."""

    name: str
    kind: str
    shape: str
    fields: dict[str, FieldSpec]
    metrics: dict[str, tuple[str, str]] = field(default_factory=dict)
    values: dict[str, dict[str, str]] = field(default_factory=dict)
    market: str | None = None

    def error(self, reason: str, field: str | None = None) -> FieldMapError:
        return FieldMapError(self.kind, self.name, reason, field)

    def pick(self, data: Mapping[str, Any], target: str, *, required: bool = True) -> Any:
        """The first present, non-null value of ``target``'s names, converted; default or error if none."""
        spec = self.fields.get(target)
        for name in spec.names if spec else ():
            if data.get(name) is not None:
                return self.number(target, data[name], spec.unit) if spec.unit else data[name]
        if spec is not None and spec.default is not None:
            return spec.default
        if required:
            tried = ", ".join(repr(n) for n in spec.names) if spec else "none configured"
            raise self.error(f"field {target!r}: no value (tried {tried})", target)
        return None

    def number(self, target: str, value: Any, unit: str) -> float | int:
        """``value`` (number or numeric string) in ``unit`` as ``target``'s schema unit; ints stay exact."""
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise self.error(f"field {target!r}: {value!r} is not a number", target) from None
        if not math.isfinite(x):
            raise self.error(f"field {target!r}: {value!r} is not finite (stale Prometheus sample?)", target)
        x = convert(x, unit, FIELD_UNITS[target])
        if FIELD_UNITS[target] == "count":
            if x != round(x):
                raise self.error(f"field {target!r}: {value!r} is not a whole count", target)
            return round(x)
        return x


def _spec(raw: Any) -> FieldSpec:
    if isinstance(raw, list):
        return FieldSpec(tuple(raw))
    return FieldSpec(tuple(raw["from"]), raw.get("unit"), raw.get("default"))


def _source(name: str, cfg: Mapping[str, Any]) -> Source:
    src = Source(
        name=name,
        kind=cfg["kind"],
        shape=cfg["shape"],
        fields={k: _spec(v) for k, v in cfg.get("fields", {}).items()},
        metrics={m: (v["field"], v["unit"]) for m, v in cfg.get("metrics", {}).items()},
        values={k: dict(v) for k, v in cfg.get("values", {}).items()},
        market=cfg.get("market"),
    )
    if src.shape not in SHAPES:
        raise ValueError(f"field map source {name!r}: unknown shape {src.shape!r}; one of {SHAPES}")
    units = [(t, s.unit) for t, s in src.fields.items() if s.unit] + list(src.metrics.values())
    for target, unit in units:
        if target not in FIELD_UNITS:
            raise ValueError(f"field map source {name!r}: {target!r} takes no unit conversion")
        try:
            convert(1.0, unit, FIELD_UNITS[target])
        except ValueError as exc:
            raise ValueError(f"field map source {name!r}, field {target!r}: {exc}") from None
    if src.shape == "gridstatus_lmp" and src.market not in availability.MARKET_TZ:
        raise ValueError(f"field map source {name!r}: market must be one of {sorted(availability.MARKET_TZ)}")
    return src


def _time(src: Source, target: str, value: Any) -> datetime:
    """A tz-aware instant from a datetime (pandas Timestamp included) or an RFC 3339 string, as UTC."""
    if hasattr(value, "to_pydatetime"):
        value = value.to_pydatetime()
    try:
        at = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise src.error(f"field {target!r}: {value!r} is not an RFC 3339 date-time", target) from None
    if at.tzinfo is None:
        raise src.error(f"field {target!r}: {value!r} has no UTC offset; times must be tz-aware", target)
    return at.astimezone(UTC)


@dataclass(frozen=True)
class FieldMap:
    """The configured sources (see streams/fieldmaps/default.toml for the format)."""

    sources: dict[str, Source]
    site: str = "default"

    @classmethod
    def load(cls, path: str | Path | None = None) -> FieldMap:
        """Load a field map TOML; None loads the bundled streams/fieldmaps/default.toml."""
        if path is None:
            text = files("streams").joinpath("fieldmaps", "default.toml").read_text(encoding="utf-8")
        else:
            text = Path(path).read_text(encoding="utf-8")
        cfg = tomllib.loads(text)
        sources = {name: _source(name, c) for name, c in cfg.get("sources", {}).items()}
        return cls(sources=sources, site=cfg.get("defaults", {}).get("site", "default"))

    def apply(
        self, source: str, raw: Mapping[str, Any], *, arrived_at: datetime | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Map one foreign record onto its kind and validate it.

        Parameters
        ----------
        source : a configured source name, e.g. "dcgm", "vllm", "otel_genai", "gridstatus_pjm".
        raw : the foreign record (decoded JSON, or a frame row as a dict).
        arrived_at : when it reached the consumer (tz-aware); defaults to now (UTC).

        Returns
        -------
        (kind, record) : the target record kind and a schema-valid wire record.
        """
        try:
            src = self.sources[source]
        except KeyError:
            raise FieldMapError("unknown", source, f"unknown source; one of {sorted(self.sources)}") from None
        if not isinstance(raw, Mapping):
            raise src.error(f"record must be an object, got {type(raw).__name__}")
        arrived = ts_to_wire(arrived_at or datetime.now(UTC))
        mapped = getattr(self, f"_{src.shape}")(src, raw)
        record = {"schema_version": "1", **mapped, "arrived_at": arrived}
        try:
            return src.kind, validate(src.kind, record)
        except FieldMapError:
            raise
        except SchemaError as exc:
            raise src.error(exc.reason, exc.field) from None

    def _prometheus(self, src: Source, raw: Mapping[str, Any]) -> dict[str, Any]:
        name, labels = raw.get("name"), raw.get("labels") or {}
        if name not in src.metrics:
            raise src.error(f"unknown metric {name!r} (field 'name'); mapped: {sorted(src.metrics)}", "name")
        if not isinstance(labels, Mapping):
            raise src.error("field 'labels' must be an object of strings", "labels")
        target, unit = src.metrics[name]
        gpu = src.pick(labels, "gpu", required=False)
        record: dict[str, Any] = {
            "event_at": ts_to_wire(_time(src, "timestamp", raw.get("timestamp"))),
            "site": src.pick(labels, "site", required=False) or self.site,
            "hostname": _host(src.pick(labels, "hostname")),
            "gpu": None if gpu is None else _index(src, gpu),
        }
        for ident in ("uuid", "modelName", "replica_id", "model_name"):
            record[ident] = src.pick(labels, ident, required=False)
        record |= dict.fromkeys(_TELEMETRY_METRICS)
        record[target] = src.number(target, raw.get("value"), unit)
        return record

    def _otel_span(self, src: Source, raw: Mapping[str, Any]) -> dict[str, Any]:
        attrs = _otlp_attributes((raw.get("resource") or {}).get("attributes")) | _otlp_attributes(
            raw.get("attributes")
        )
        start, end = (_unix_nano(src, raw, k) for k in ("startTimeUnixNano", "endTimeUnixNano"))
        out = {k: src.pick(attrs, k) for k in (*_COMPLETION_PICKED, "gpu_type", "request_class")}
        out["site"] = src.pick(attrs, "site", required=False) or self.site
        reasons = src.pick(attrs, "finish_reason")
        reason = reasons[0] if isinstance(reasons, list | tuple) and reasons else reasons
        if reason not in src.values.get("finish_reason", {}):
            raise src.error(f"field 'finish_reason': unmapped value {reason!r}", "finish_reason")
        out["finish_reason"] = src.values["finish_reason"][reason]
        ttft = src.pick(attrs, "ttft_s", required=False)
        e2e = src.pick(attrs, "e2e_s", required=False)
        e2e = (end - start).total_seconds() if e2e is None else e2e
        first = None if ttft is None else start + timedelta(seconds=ttft)
        n_out = out["output_tokens"]
        tpot = (end - first).total_seconds() / (n_out - 1) if first is not None and n_out > 1 else 0.0
        sla_met = src.pick(attrs, "sla_met", required=False)
        if sla_met is None:
            sla_met = self._sla_met(src, attrs, out, ttft, tpot, end)
        out |= {
            "event_at": ts_to_wire(end),
            "queued_at": ts_to_wire(start),
            "first_token_at": None if first is None else ts_to_wire(first),
            "ttft_s": ttft,
            "tpot_s": max(tpot, 0.0),
            "e2e_s": e2e,
            "sla_met": bool(sla_met),
        }
        return out

    @staticmethod
    def _sla_met(
        src: Source, attrs: Mapping[str, Any], out: dict, ttft: float | None, tpot: float, end: datetime
    ) -> bool:
        """SLA of protocol v1: interactive TTFT and mean TPOT within the class SLA; batch by its deadline."""
        try:
            spec = PROTOCOL_V1.spec(out["request_class"])
        except KeyError:
            raise src.error(
                f"field 'request_class': unknown class {out['request_class']!r}", "request_class"
            ) from None
        if out["finish_reason"] in ("abort", "error"):
            return False
        if spec.deferrable:
            deadline = src.pick(attrs, "deadline_at", required=False)
            if deadline is None:
                raise src.error("field 'sla_met': batch request without sla_met or deadline_at", "sla_met")
            return end <= _time(src, "deadline_at", deadline)
        assert spec.ttft_slo_ms is not None and spec.tpot_slo_ms is not None
        return ttft is not None and ttft * 1e3 <= spec.ttft_slo_ms and tpot * 1e3 <= spec.tpot_slo_ms

    def _gridstatus_lmp(self, src: Source, raw: Mapping[str, Any]) -> dict[str, Any]:
        assert src.market is not None
        run = str(src.pick(raw, "market_run"))
        run = src.values.get("market_run", {}).get(run, run)
        if run not in (availability.REAL_TIME_HOURLY, availability.DAY_AHEAD_HOURLY):
            raise src.error(
                f"field 'market_run': {run!r} is not an hourly market run "
                "(REAL_TIME_HOURLY, DAY_AHEAD_HOURLY); resample or filter first",
                "market_run",
            )
        start = _time(src, "interval_start", src.pick(raw, "interval_start"))
        end = _time(src, "interval_end", src.pick(raw, "interval_end"))
        return {
            "market": src.market,
            "location": str(src.pick(raw, "location")),
            "market_run": run,
            "interval_start": ts_to_wire(start),
            "interval_end": ts_to_wire(end),
            "lmp_usd_mwh": src.pick(raw, "lmp_usd_mwh"),
            "published_at": ts_to_wire(price_published_at(src.market, run, start, end)),
            "event_at": ts_to_wire(start),
        }


def price_published_at(
    market: str, market_run: str, interval_start: datetime, interval_end: datetime
) -> datetime:
    """When a price became known (UTC): real-time at interval end; day-ahead 13:00 market-local the day
    before the operating day. The bundled market runs defer to ``schemas.availability``."""
    if market_run == availability.MARKET_RUN[market]:
        return availability.published_at(market, interval_start)
    if market_run == availability.REAL_TIME_HOURLY:
        return interval_end.astimezone(UTC)
    tz = ZoneInfo(availability.MARKET_TZ[market])
    day = interval_start.astimezone(tz).date() - timedelta(days=1)
    return datetime.combine(day, availability.DAY_AHEAD_PUBLISH_LOCAL, tzinfo=tz).astimezone(UTC)


def _host(value: str) -> str:
    """A hostname from a label; a Prometheus ``instance`` label (host:port) loses its port."""
    host, sep, port = value.rpartition(":")
    return host if sep and port.isdigit() and "]" not in port else value


def _index(src: Source, value: Any) -> int:
    """A GPU index from its label (a decimal string)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise src.error(f"field 'gpu': label {value!r} is not a GPU index", "gpu") from None


def _unix_nano(src: Source, raw: Mapping[str, Any], key: str) -> datetime:
    try:
        nanos = int(raw[key])
    except (KeyError, TypeError, ValueError):
        raise src.error(f"field {key!r}: missing or not an integer (ns since epoch)", key) from None
    return from_us(nanos // 1000)


def _otlp_value(value: Mapping[str, Any]) -> Any:
    if "arrayValue" in value:
        return [_otlp_value(v) for v in value["arrayValue"].get("values", [])]
    if "intValue" in value:
        return int(value["intValue"])
    for key in ("stringValue", "doubleValue", "boolValue"):
        if key in value:
            return value[key]
    return None


def _otlp_attributes(attrs: Any) -> dict[str, Any]:
    """OTLP/JSON attributes ([{"key", "value": {"intValue": ...}}]) or an already flat mapping -> dict."""
    if not attrs:
        return {}
    if isinstance(attrs, Mapping):
        return dict(attrs)
    return {a["key"]: _otlp_value(a.get("value") or {}) for a in attrs}


def fold_telemetry(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Merge partial gpu_telemetry records of the same (event_at, hostname, gpu) into one.

    Non-null values fill the merged record (a later sample wins a conflict); ``arrived_at`` is the latest
    part's, since the merged record is complete only then. Replica-level records (``gpu`` null) pass through
    unchanged. Order is that of each key's first record.
    """
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i, rec in enumerate(records):
        key = (
            ("replica", i)
            if rec["gpu"] is None
            else (ts_from_wire(rec["event_at"]), rec["hostname"], rec["gpu"])
        )
        if key not in out:
            out[key] = dict(rec)
            continue
        into = out[key]
        arrived = max(ts_from_wire(into["arrived_at"]), ts_from_wire(rec["arrived_at"]))
        into.update((k, v) for k, v in rec.items() if v is not None)
        into["arrived_at"] = ts_to_wire(arrived)
    return list(out.values())
