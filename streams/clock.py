"""The event-time control-period clock: watermark, period closes and late records.

Period k is `(origin + k * period_s, origin + (k + 1) * period_s]`: a record stamped exactly at a period's end
belongs to it, because the decision made at that instant sees it (the embedded replay delivers what was
observable by `as_of`, inclusive; a price published at 17:00 reaches the 17:00 decision). The watermark is the
clock time the input partitions have all reached (see `PeriodClock`) minus the allowed lateness; period k
closes once the watermark is past its end. A record whose period has already closed is late: it is still
ingested (flagged) and counted, never dropped. Times are kept as integer microseconds since the epoch, so the
per-record work is a few integer operations.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from schemas.timestamps import from_us, to_us


@dataclass(frozen=True)
class Tick:
    """What observing one clock time did.

    period_index : the record's period (< 0 before the origin: history, late only once period 0 closed).
    late : its period had already closed.
    closed : periods this record closed, in order.
    """

    period_index: int
    late: bool
    closed: tuple[int, ...]


@dataclass
class PeriodClock:
    """Event-time period clock with per-partition watermarks.

    Each input partition keeps its largest clock time. The watermark is the smallest of them over the
    partitions that still have records to deliver (`active`; the caller knows which are caught up), or
    the largest over all when none is active, minus the allowed lateness. Records are assigned to periods
    as they come (`assign`); periods close when the caller advances the clock (`advance`, after each
    micro-batch), so a partition that lags in a batch (its fetch came back later) never makes another's
    records late, while a record older than an already closed period is.

    Parameters
    ----------
    period_s : control period length (s).
    allowed_lateness_s : how far event time may run behind the watermark base before a period closes (s).
    origin : start of period 0 (UTC); None takes the first clock time's period on the epoch grid.
    max_event_at : largest clock time seen so far (restored from the store on restart).
    closed_through : last closed period index (-1: none), restored on restart.
    partition_max_us : (topic, partition) -> largest clock time seen there (us), restored on restart.

    Examples
    --------
    >>> from datetime import UTC, timedelta
    >>> t0 = datetime(2023, 7, 1, tzinfo=UTC)
    >>> c = PeriodClock(period_s=300, allowed_lateness_s=30, origin=t0)
    >>> c.observe(t0 + timedelta(seconds=330)).closed     # watermark 300 s: period 0 = (0, 300] still open
    ()
    >>> c.observe(t0 + timedelta(seconds=335)).closed     # watermark 305 s: period 0 closes
    (0,)
    >>> c.observe(t0 + timedelta(seconds=300)).late       # the end of period 0 belongs to period 0
    True
    """

    period_s: float
    allowed_lateness_s: float
    origin: datetime | None = None
    max_event_at: datetime | None = None
    closed_through: int = -1
    partition_max_us: dict[tuple[str, int], int] = field(default_factory=dict)
    _period_us: int = field(init=False, repr=False)
    _lateness_us: int = field(init=False, repr=False)
    _origin_us: int | None = field(init=False, repr=False, default=None)
    _max_us: int | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.allowed_lateness_s < 0:
            raise ValueError("period_s must be > 0 and allowed_lateness_s >= 0")
        self._period_us = round(self.period_s * 1e6)
        self._lateness_us = round(self.allowed_lateness_s * 1e6)
        self._origin_us = None if self.origin is None else to_us(self.origin)
        self._max_us = None if self.max_event_at is None else to_us(self.max_event_at)

    def _index(self, us: int) -> int:
        assert self._origin_us is not None
        return -((self._origin_us - us) // self._period_us) - 1  # ceil((us - origin) / period) - 1

    def period_of(self, at: datetime) -> int:
        """Index of the period containing `at` (the origin must be set)."""
        return self._index(to_us(at))

    def start_of(self, index: int) -> datetime:
        """Start of period `index` (UTC): also the end of period index - 1 and the decision time."""
        assert self._origin_us is not None
        return from_us(self._origin_us + index * self._period_us)

    def watermark(self) -> datetime | None:
        """Largest clock time seen minus the allowed lateness; None before the first record."""
        return None if self._max_us is None else from_us(self._max_us - self._lateness_us)

    def assign(self, us: int, source: tuple[str, int] = ("", 0)) -> tuple[int, bool]:
        """Account one clock time (us since the epoch) from partition `source`; return (its period, late)."""
        if self._origin_us is None:
            self._origin_us = us // self._period_us * self._period_us
            self.origin = from_us(self._origin_us)
        index = -((self._origin_us - us) // self._period_us) - 1
        if us > self.partition_max_us.get(source, -(2**62)):
            self.partition_max_us[source] = us
            if self._max_us is None or us > self._max_us:
                self._max_us = us
        return index, 0 <= self.closed_through and index <= self.closed_through

    def advance(self, active: Collection[tuple[str, int]] | None = None) -> tuple[int, ...]:
        """Close the periods the watermark has passed; return them in order.

        Parameters
        ----------
        active : partitions with records still to deliver; the watermark waits for the slowest of them
            (one without any record yet holds it). None or empty: every partition is caught up.
        """
        if self._max_us is None or self._origin_us is None:
            return ()
        base = self._max_us
        if active:
            lags = [self.partition_max_us.get(tp) for tp in active]
            if any(v is None for v in lags):
                return ()
            base = min(base, *(v for v in lags if v is not None))
        through = self._index(base - self._lateness_us) - 1
        if through <= self.closed_through:
            return ()
        closed = tuple(range(max(self.closed_through + 1, 0), through + 1))
        self.closed_through = through
        return closed

    def observe(self, at: datetime) -> Tick:
        """Account one record's clock time `at` (tz-aware) and advance at once (a one-record batch)."""
        index, late = self.assign(to_us(at))
        closed = self.advance()
        self.sync()
        return Tick(index, late, closed)

    def sync(self) -> None:
        """Refresh the datetime views (`origin`, `max_event_at`) from the integer state."""
        self.origin = None if self._origin_us is None else from_us(self._origin_us)
        self.max_event_at = None if self._max_us is None else from_us(self._max_us)
