"""The event-time control-period clock: watermark, period closes and late records.

Period k is `(origin + k * period_s, origin + (k + 1) * period_s]`: a record stamped exactly at a period's end
belongs to it, because the decision made at that instant sees it (the embedded replay delivers what was
observable by `as_of`, inclusive; a price published at 17:00 reaches the 17:00 decision). The watermark is the
clock time the input partitions have all reached (see `PeriodClock`) minus the allowed lateness; period k
closes once the watermark is past its end. A record whose period has already closed is late: it is still
ingested (flagged) and counted, never dropped. Times are kept as integer microseconds since the epoch, so the
per-record work is a few integer operations.

Bounds, against the stream itself and never the wall clock (a replay of 2023 data is as valid as live data):
`bound_error` says why a clock time is implausible: earlier than the origin minus `history_span_s`, or more
than `max_ahead_s` ahead of the stream's clock (the largest clock time accepted over all partitions, or the
origin if later). The caller dead-letters such a record instead of assigning it. At most `max_close_periods`
periods close per `advance`; the rest close at the next ones. Each `advance` also reports its `gaps`: runs of
closed periods that got no record at all, whose decisions see nothing, so the worker can decide once for a
gap instead of once per period.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

from schemas.timestamps import from_us, to_us

#: Defaults of the bounds (streams/settings.py documents them): 8 days of history before the origin, 1 day
#: ahead of the stream's clock, 2016 periods (7 days of 5-minute periods) closed per advance.
DEFAULT_HISTORY_SPAN_S = 8 * 86_400.0
DEFAULT_MAX_AHEAD_S = 86_400.0
DEFAULT_MAX_CLOSE_PERIODS = 2016


def wire_us(us: int) -> str:
    """An instant (us since the epoch) as RFC 3339 UTC for messages; the integer itself out of datetime's range."""
    try:
        return from_us(us).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError):
        return f"{us} us since the epoch"


def span_text(seconds: float) -> str:
    """A duration for messages: '8 days', '1 day', '6 h', '300 s'."""
    if seconds >= 86_400 and seconds % 86_400 == 0:
        days = int(seconds // 86_400)
        return f"{days} day{'s' if days != 1 else ''}"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return f"{seconds:g} s"


@dataclass(frozen=True)
class Gap:
    """A run of consecutive closed periods that got no record at all: `first` .. `last` (inclusive).

    The decisions that see only these periods, `first + 1` .. `last + 1` (`decisions`), see nothing: no
    record, no late record, no history (period 0 is never part of a gap). A worker may make one 'no data'
    decision for the run instead of one per period.
    """

    first: int
    last: int

    @property
    def periods(self) -> int:
        """Periods in the gap (count)."""
        return self.last - self.first + 1

    @property
    def decisions(self) -> range:
        """The decision periods that see only the gap."""
        return range(self.first + 1, self.last + 2)


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
    history_span_s : `bound_error` refuses clock times before the origin minus this (s); None: no bound.
    max_ahead_s : `bound_error` refuses clock times more than this ahead of the stream's clock (s); None: none.
    max_close_periods : most periods one `advance` closes; None: no bound.

    Attributes
    ----------
    low_us, high_us : clock times (us) inside these (inclusive) are within the bounds (a cheap test; outside,
        `bound_error` words why, or accepts while the stream has no anchor).
    gaps : what the last `advance` found: runs of closed periods that got no record (`Gap`), in order.
        Periods that were open when this clock was built (restored state) may have records this clock did
        not see, so they are never reported.

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
    >>> c.bound_error(to_us(t0 + timedelta(days=30)))[:50]  # one record stamped 30 days ahead: refused
    'is more than 1 day ahead of the stream: after 2023'
    >>> c.observe(t0 + timedelta(hours=2)).closed[-1], [(g.first, g.last) for g in c.gaps]  # periods 2..22 empty
    (22, [(2, 22)])
    """

    period_s: float
    allowed_lateness_s: float
    origin: datetime | None = None
    max_event_at: datetime | None = None
    closed_through: int = -1
    partition_max_us: dict[tuple[str, int], int] = field(default_factory=dict)
    history_span_s: float | None = DEFAULT_HISTORY_SPAN_S
    max_ahead_s: float | None = DEFAULT_MAX_AHEAD_S
    max_close_periods: int | None = DEFAULT_MAX_CLOSE_PERIODS
    gaps: tuple[Gap, ...] = field(init=False, default=())
    low_us: int = field(init=False, repr=False, default=-(2**63))
    high_us: int = field(init=False, repr=False, default=2**63)
    _period_us: int = field(init=False, repr=False)
    _lateness_us: int = field(init=False, repr=False)
    _origin_us: int | None = field(init=False, repr=False, default=None)
    _max_us: int | None = field(init=False, repr=False, default=None)
    _occupied: set[int] = field(init=False, repr=False, default_factory=set)
    _unknown_through: int = field(init=False, repr=False, default=-1)

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.allowed_lateness_s < 0:
            raise ValueError("period_s must be > 0 and allowed_lateness_s >= 0")
        if self.max_close_periods is not None and self.max_close_periods < 1:
            raise ValueError("max_close_periods must be >= 1 (or None)")
        self._period_us = round(self.period_s * 1e6)
        self._lateness_us = round(self.allowed_lateness_s * 1e6)
        self._origin_us = None if self.origin is None else to_us(self.origin)
        self._max_us = None if self.max_event_at is None else to_us(self.max_event_at)
        self._history_us = None if self.history_span_s is None else round(self.history_span_s * 1e6)
        self._ahead_us = None if self.max_ahead_s is None else round(self.max_ahead_s * 1e6)
        if self._origin_us is not None and self._max_us is not None:  # restored: open periods may hold records
            self._unknown_through = self._index(self._max_us)
        self._rebound()

    def _rebound(self) -> None:
        """Refresh `low_us` and `high_us` from the origin and the stream's clock."""
        if self._history_us is not None and self._origin_us is not None:
            self.low_us = self._origin_us - self._history_us
        high = max((v for v in (self._max_us, self._origin_us) if v is not None), default=None)
        if self._ahead_us is not None and high is not None:
            self.high_us = high + self._ahead_us

    @property
    def anchored(self) -> bool:
        """Whether the stream has an origin or a clock time to bound records against."""
        return self._origin_us is not None or self._max_us is not None

    def bound_error(self, us: int, reference_us: int | None = None) -> str | None:
        """Why clock time `us` (us since the epoch) is implausibly far from the stream, or None.

        Too early: before the origin minus `history_span_s`. Too far ahead: more than `max_ahead_s` after the
        stream's clock, the largest clock time accepted over all partitions (or the origin if later).
        `reference_us` stands in for both while the stream has neither (a first batch's median clock time).
        """
        low = self._origin_us if self._origin_us is not None else reference_us
        if self._history_us is not None and low is not None and us < low - self._history_us:
            what = "origin" if self._origin_us is not None else "first batch's median clock time"
            return (f"is before {wire_us(low - self._history_us)}: the stream's {what} {wire_us(low)} minus "
                    f"history_span_s ({span_text(self._history_us / 1e6)})")
        high = max((v for v in (self._max_us, self._origin_us) if v is not None), default=reference_us)
        if self._ahead_us is not None and high is not None and us > high + self._ahead_us:
            if self._max_us is not None and high == self._max_us:
                what = f"its clock {wire_us(high)} (the largest clock time accepted)"
            elif self._origin_us is not None:
                what = f"its origin {wire_us(high)}"
            else:
                what = f"its first batch's median clock time {wire_us(high)}"
            return (f"is more than {span_text(self._ahead_us / 1e6)} ahead of the stream: after "
                    f"{wire_us(high + self._ahead_us)}, {what} plus max_ahead_s")
        return None

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
            self._rebound()
        index = -((self._origin_us - us) // self._period_us) - 1
        if us > self.partition_max_us.get(source, -(2**62)):
            self.partition_max_us[source] = us
            if self._max_us is None or us > self._max_us:
                self._max_us = us
                if self._ahead_us is not None and us > self._origin_us:
                    self.high_us = us + self._ahead_us
        late = 0 <= self.closed_through and index <= self.closed_through
        # the period whose decision sees the record is not empty: its own, or for a late one the next to close
        self._occupied.add(self.closed_through + 1 if late else index)
        return index, late

    def advance(self, active: Collection[tuple[str, int]] | None = None) -> tuple[int, ...]:
        """Close the periods the watermark has passed; return them in order.

        Parameters
        ----------
        active : partitions with records still to deliver; the watermark waits for the slowest of them
            (one without any record yet holds it). None or empty: every partition is caught up.
        """
        self.gaps = ()
        if self._max_us is None or self._origin_us is None:
            return ()
        base = self._max_us
        if active:
            lags = [self.partition_max_us.get(tp) for tp in active]
            if any(v is None for v in lags):
                return ()
            base = min(base, *(v for v in lags if v is not None))
        through = self._index(base - self._lateness_us) - 1
        if self.max_close_periods is not None:
            through = min(through, max(self.closed_through, -1) + self.max_close_periods)
        if through <= self.closed_through:
            return ()
        closed = tuple(range(max(self.closed_through + 1, 0), through + 1))
        self.gaps = self._gaps(closed)
        self.closed_through = through
        self._occupied = {k for k in self._occupied if k > through}
        return closed

    def _gaps(self, closed: tuple[int, ...]) -> tuple[Gap, ...]:
        """Runs of `closed` periods known to be empty (after period 0 and the restored open periods)."""
        runs: list[Gap] = []
        first = None
        for k in (*closed, None):
            empty = k is not None and k >= 1 and k > self._unknown_through and k not in self._occupied
            if empty and first is None:
                first = k
            elif not empty and first is not None:
                runs.append(Gap(first, k - 1 if k is not None else closed[-1]))
                first = None
        return tuple(runs)

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
