"""The world model's persistent DuckDB state: raw observations, fleet state, aggregates, calibration."""

from worldmodel.state.migrations import CURRENT_VERSION, RAW_KINDS, migrate, schema_version
from worldmodel.state.store import FLOAT_DIGITS, REPLICA_STATE_SQL, IngestResult, WorldState

__all__ = [
    "CURRENT_VERSION",
    "FLOAT_DIGITS",
    "RAW_KINDS",
    "REPLICA_STATE_SQL",
    "IngestResult",
    "WorldState",
    "migrate",
    "schema_version",
]
