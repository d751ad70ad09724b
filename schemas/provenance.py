"""Provenance tags: every input, parameter and reported figure says where it came from."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Provenance(StrEnum):
    """Where a figure comes from (DESIGN.md vocabulary)."""

    MEASURED = "measured"
    TRACE_DERIVED = "trace-derived"
    BENCHMARK_CALIBRATED = "benchmark-calibrated"
    MODELED = "modeled"


@dataclass(frozen=True)
class Tagged:
    """A scalar with its unit, provenance tag and source."""

    value: float
    unit: str
    provenance: Provenance
    source: str

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "unit": self.unit, "provenance": str(self.provenance), "source": self.source}
