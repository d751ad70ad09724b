"""The event-time control-period clock: watermark, period closes and late records.

Periods are `[origin + k * period_s, origin + (k + 1) * period_s)`. The watermark is the largest event
time seen minus the allowed lateness; period k closes once the watermark reaches its end. A record whose
period has already closed is late: it is still ingested (flagged) and counted, never dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta


@dataclass(frozen=True)
class Tick:
    """What observing one event time did.

    period_index : the record's period (< 0 before the origin: history, late only once period 0 closed).
    late : its period had already closed.
    closed : periods this record closed, in order.
    """

    period_index: int
    late: bool
    closed: tuple[int, ...]


@dataclass
class PeriodClock:
    """Event-time period clock.

    Parameters
    ----------
    period_s : control period length (s).
    allowed_lateness_s : how far event time may run behind the largest seen before a period closes (s).
    origin : start of period 0 (UTC); None takes the first event time, floored to a whole period.
    max_event_at : largest event time seen so far (restored from the store on restart).
    closed_through : last closed period index (-1: none), restored on restart.

    Examples
    --------
    >>> t0 = datetime(2023, 7, 1, tzinfo=UTC)
    >>> c = PeriodClock(period_s=300, allowed_lateness_s=30, origin=t0)
    >>> c.observe(t0 + timedelta(seconds=320)).closed     # watermark 290 s: period 0 still open
    ()
    >>> c.observe(t0 + timedelta(seconds=335)).closed     # watermark 305 s: period 0 closes
    (0,)
    >>> c.observe(t0 + timedelta(seconds=100)).late
    True
    """

    period_s: float
    allowed_lateness_s: float
    origin: datetime | None = None
    max_event_at: datetime | None = None
    closed_through: int = -1
    _period: timedelta = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.allowed_lateness_s < 0:
            raise ValueError("period_s must be > 0 and allowed_lateness_s >= 0")
        self._period = timedelta(seconds=self.period_s)

    def period_of(self, at: datetime) -> int:
        """Index of the period containing `at` (the origin must be set)."""
        assert self.origin is not None
        return math.floor((at - self.origin) / self._period)

    def start_of(self, index: int) -> datetime:
        """Start of period `index` (UTC)."""
        assert self.origin is not None
        return self.origin + index * self._period

    def watermark(self) -> datetime | None:
        """Largest event time seen minus the allowed lateness; None before the first record."""
        if self.max_event_at is None:
            return None
        return self.max_event_at - timedelta(seconds=self.allowed_lateness_s)

    def observe(self, at: datetime) -> Tick:
        """Account one record's event time `at` (tz-aware UTC)."""
        if self.origin is None:
            epoch = datetime(1970, 1, 1, tzinfo=UTC)
            self.origin = epoch + math.floor((at - epoch) / self._period) * self._period
        index = self.period_of(at)
        late = 0 <= self.closed_through and index <= self.closed_through
        if self.max_event_at is None or at > self.max_event_at:
            self.max_event_at = at
        wm = self.watermark()
        assert wm is not None
        through = self.period_of(wm) - 1
        closed: tuple[int, ...] = ()
        if through > self.closed_through:
            first = max(self.closed_through + 1, 0)
            closed = tuple(range(first, through + 1))
            self.closed_through = through
        return Tick(index, late, closed)
