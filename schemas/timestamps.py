"""Instants on the wire and inside the packages: RFC 3339 UTC strings, and integer microseconds (us).

>>> from datetime import UTC, datetime
>>> at = datetime(2023, 7, 1, 13, tzinfo=UTC)
>>> ts_to_wire(at), to_us(at)
('2023-07-01T13:00:00.000000Z', 1688216400000000)
>>> from_us(to_us(at)) == at == ts_from_wire(ts_to_wire(at))
True
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WIRE_TS = "%Y-%m-%dT%H:%M:%S.%fZ"


def to_us(t: datetime | np.datetime64 | int) -> int:
    """Microseconds since the Unix epoch (UTC) of an aware datetime, a numpy datetime64 or an int (passed)."""
    if isinstance(t, datetime):
        if t.tzinfo is None:
            raise ValueError(f"naive datetime {t!r}: pass timezone-aware UTC times")
        delta = t - EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(t, np.datetime64):
        return int(t.astype("datetime64[us]").astype(np.int64))
    return int(t)


def from_us(us: int) -> datetime:
    """Integer microseconds since the Unix epoch (us) as an aware UTC datetime (exact)."""
    return EPOCH + timedelta(microseconds=int(us))


def ts_to_wire(at: datetime) -> str:
    """Format a tz-aware instant as the wire's RFC 3339 UTC string (microseconds, ``Z``)."""
    if at.tzinfo is None:
        raise ValueError(f"naive datetime {at!r}: wire timestamps must be tz-aware (UTC)")
    return at.astimezone(UTC).strftime(WIRE_TS)


def ts_from_wire(text: str) -> datetime:
    """Parse an RFC 3339 string into a UTC ``datetime``."""
    return datetime.fromisoformat(text).astimezone(UTC)
