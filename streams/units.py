"""Units a field map may convert between, and the wire schemas' unit of every numeric field it maps into.

>>> convert(1.5, "J", "mJ"), convert(250.0, "mW", "W")
(1500.0, 0.25)
"""

from __future__ import annotations

#: Units by dimension, as factors to the dimension's base unit.
UNITS: dict[str, dict[str, float]] = {
    "energy": {"J": 1.0, "mJ": 1e-3, "kJ": 1e3, "Wh": 3600.0, "kWh": 3.6e6},
    "power": {"W": 1.0, "mW": 1e-3, "kW": 1e3},
    "time": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    "ratio": {"ratio": 1.0, "%": 1e-2},
    "memory": {"B": 1.0, "KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3},
    "frequency": {"Hz": 1.0, "kHz": 1e3, "MHz": 1e6, "GHz": 1e9},
    "temperature": {"C": 1.0},
    "count": {"count": 1.0},
    "price": {"USD/MWh": 1.0, "USD/kWh": 1e3},
}
_DIMENSION = {u: dim for dim, units in UNITS.items() for u in units}

#: The schema's unit of every numeric field a map may convert into.
FIELD_UNITS: dict[str, str] = {
    "DCGM_FI_DEV_POWER_USAGE": "W",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "mJ",
    "DCGM_FI_DEV_SM_CLOCK": "MHz",
    "DCGM_FI_DEV_GPU_UTIL": "%",
    "DCGM_FI_DEV_FB_USED": "MiB",
    "DCGM_FI_DEV_GPU_TEMP": "C",
    "num_requests_running": "count",
    "num_requests_waiting": "count",
    "kv_cache_usage_perc": "ratio",
    "input_tokens": "count",
    "output_tokens": "count",
    "cached_input_tokens": "count",
    "ttft_s": "s",
    "e2e_s": "s",
    "lmp_usd_mwh": "USD/MWh",
}


def convert(value: float, unit: str, to: str) -> float:
    """Convert ``value`` from ``unit`` to ``to`` (same dimension, see ``UNITS``), e.g. 1.5 J -> 1500 mJ."""
    if _DIMENSION.get(unit) is None or _DIMENSION.get(unit) != _DIMENSION.get(to):
        raise ValueError(f"cannot convert {unit!r} to {to!r}; known units: {sorted(_DIMENSION)}")
    if unit == to:
        return value
    dim = UNITS[_DIMENSION[unit]]
    return value * dim[unit] / dim[to]
