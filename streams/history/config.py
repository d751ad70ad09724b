"""The operator's history config (TOML): market, classes and SLAs, deadlines, inventory, check tolerances.

Every key is optional; a missing one falls back to what the records carry, then to protocol v1's default,
and the `HistoryReport` says which was used. `examples/history.toml` documents the format.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.fleet import GpuType
from schemas.protocol import PROTOCOL_V1, RequestClass


@dataclass(frozen=True)
class ClassConfig:
    """One request class as the operator defines it.

    ttft_ms, tpot_ms : interactive SLA (ms); None: from the records, else protocol v1's.
    deadline_s : deadline after arrival (s) of deferrable work whose record has no deadline_at; None:
        protocol v1's mid-range (the mean of its 30-180 min).
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    deadline_s: float | None = None


@dataclass(frozen=True)
class SiteInventory:
    """Nodes of 8 GPUs per GPU type at one site, and its IT power cap (W; None: the default share of peak)."""

    nodes: dict[GpuType, int]
    power_cap_w: float | None = None


@dataclass(frozen=True)
class HistoryConfig:
    """What the records cannot say.

    market : price market of the site ("PJM", "ERCOT", "CAISO"); None: the price records' market.
    period_minutes : control period (min).
    classes : class -> its SLA and deadline rule.
    fleet : site name -> inventory; sites absent here get the nodes seen in telemetry and fleet events.
    skew_tolerance_s : a topic whose clock differs from the arrivals' by more than this is shifted (s).
    gap_s : an interval without arrivals (or without telemetry) longer than this is reported as a gap (s).
    """

    market: str | None = None
    period_minutes: float = PROTOCOL_V1.period_s / 60.0
    classes: dict[RequestClass, ClassConfig] = field(default_factory=dict)
    fleet: dict[str, SiteInventory] = field(default_factory=dict)
    skew_tolerance_s: float = 1.0
    gap_s: float = 600.0


def _site(raw: dict[str, Any]) -> SiteInventory:
    nodes = {GpuType(k): int(v) for k, v in raw.items() if k != "power_cap_w"}
    cap = raw.get("power_cap_w")
    return SiteInventory(nodes, None if cap is None else float(cap))


def load_config(path: str | Path | None) -> HistoryConfig:
    """Read a history config TOML (None: every default)."""
    if path is None:
        return HistoryConfig()
    raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    checks = raw.get("checks", {})
    return HistoryConfig(
        market=raw.get("market"),
        period_minutes=float(raw.get("period_minutes", HistoryConfig.period_minutes)),
        classes={RequestClass(k): ClassConfig(**v) for k, v in raw.get("classes", {}).items()},
        fleet={name: _site(v) for name, v in raw.get("fleet", {}).items()},
        skew_tolerance_s=float(checks.get("skew_tolerance_s", HistoryConfig.skew_tolerance_s)),
        gap_s=float(checks.get("gap_s", HistoryConfig.gap_s)),
    )
