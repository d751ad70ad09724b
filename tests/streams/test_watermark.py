"""The multi-partition watermark of streams/clock.py and how streams/pipeline.py drives it (no broker).

Semantics under test (PeriodClock's docstring): period k is (origin + k P, origin + (k + 1) P]; each
(topic, partition) keeps its largest clock time; `advance(active)` closes the periods that the slowest
*active* partition (one with records still to deliver) minus the allowed lateness has passed. An active
partition that has delivered nothing yet holds every close; a caught-up (idle) partition, i.e. one not in
`active`, holds nothing; `active` None or empty takes the largest time over all partitions. Records are
assigned before the batch's `advance`, so a partition that lags within a batch never makes another's records
late; a record whose period has already closed is late: counted, flagged and still ingested.
"""

from __future__ import annotations

import json
from datetime import timedelta

from schemas.topics import Topics
from streams.clock import PeriodClock, to_us
from streams.ingest import WorkerState
from streams.pipeline import Inbound, Pipeline

P_S, LATE_S = 60, 5  # 60 s periods, 5 s allowed lateness: period 0 = (0, 60] closes once the base passes 65 s
A, B, C = ("in", 0), ("in", 1), ("in", 2)


def _clock(t0):
    return PeriodClock(period_s=P_S, allowed_lateness_s=LATE_S, origin=t0)


def _us(t0, s: float) -> int:
    return to_us(t0 + timedelta(seconds=s))


# --- PeriodClock -------------------------------------------------------------------------------------------


def test_the_slowest_active_partition_holds_the_close(records):
    t0 = records.T0
    c = _clock(t0)
    c.assign(_us(t0, 400), A)
    c.assign(_us(t0, 30), B)
    assert c.advance({A, B}) == ()  # A is at 400 s, but B at 30 s: nothing closes
    assert c.closed_through == -1
    c.assign(_us(t0, 65), B)  # base 65 - 5 = 60 s: the end of period 0 still belongs to it
    assert c.advance({A, B}) == ()
    c.assign(_us(t0, 65.000001), B)  # one microsecond past: period 0 closes, and only it
    assert c.advance({A, B}) == (0,)
    c.assign(_us(t0, 190), B)  # base 185 s: periods 1 and 2 = (60, 180] close together
    assert c.advance({A, B}) == (1, 2)
    assert c.closed_through == 2
    # B caught up (no longer active): A alone sets the base, 400 - 5 = 395 s closes periods 3 .. 5
    assert c.advance({A}) == (3, 4, 5)
    # a watermark never moves back: a slower partition showing up later reopens nothing
    c.assign(_us(t0, 10), C)
    assert c.advance({A, B, C}) == () and c.closed_through == 5


def test_an_active_partition_without_records_holds_everything(records):
    t0 = records.T0
    c = _clock(t0)
    c.assign(_us(t0, 1000), A)
    assert c.advance({A, B}) == ()  # B is assigned and has records to deliver, none consumed yet
    assert c.closed_through == -1
    c.assign(_us(t0, 70), B)
    assert c.advance({A, B}) == (0,)


def test_an_idle_partition_does_not_hold_the_close(records):
    """A caught-up partition (not in `active`; e.g. empty, or nothing new) is ignored by the watermark."""
    t0 = records.T0
    c = _clock(t0)
    c.assign(_us(t0, 10), B)  # B delivered one early record and went idle
    c.assign(_us(t0, 200), A)
    assert c.advance({A}) == (0, 1, 2)  # base 195 s: B's 10 s does not hold it
    c2 = _clock(t0)
    c2.assign(_us(t0, 10), B)
    c2.assign(_us(t0, 200), A)
    assert c2.advance(None) == (0, 1, 2)  # None: everything caught up, the largest time over all
    c3 = _clock(t0)
    c3.assign(_us(t0, 10), B)
    c3.assign(_us(t0, 200), A)
    assert c3.advance(set()) == (0, 1, 2)  # empty: the same


def test_late_is_relative_to_closed_periods_only(records):
    t0 = records.T0
    c = _clock(t0)
    assert c.assign(_us(t0, -10), A) == (-1, False)  # history before the origin: not late while 0 is open
    # in one batch: A far ahead, then B's old record; closes wait for `advance`, so B's is not late
    assert c.assign(_us(t0, 300), A)[1] is False
    assert c.assign(_us(t0, 20), B) == (0, False)
    assert c.advance(None) == (0, 1, 2, 3)  # base 295 s
    assert c.assign(_us(t0, 60), B) == (0, True)  # the end of a closed period is in it: late
    assert c.assign(_us(t0, 179), B) == (2, True)
    assert c.assign(_us(t0, -10), B) == (-1, True)  # history is late once period 0 has closed
    assert c.assign(_us(t0, 241), B) == (4, False)  # period 4 is still open
    assert c.assign(_us(t0, 240), B) == (3, True)


def test_observe_is_a_one_record_batch_over_every_partition(records):
    t0 = records.T0
    c = PeriodClock(period_s=300, allowed_lateness_s=30, origin=t0)
    assert c.observe(t0 + timedelta(seconds=330)).closed == ()
    assert c.watermark() == t0 + timedelta(seconds=300)
    tick = c.observe(t0 + timedelta(seconds=335))
    assert tick.closed == (0,) and not tick.late and tick.period_index == 1
    assert c.observe(t0 + timedelta(seconds=300)).late


# --- Pipeline: partitions of the input topics, late records counted and still ingested ----------------------


def _arrivals(topics, records, partition, offsets_and_seconds):
    t = topics.request_arrivals.name
    return [Inbound(t, partition, off, json.dumps(records.arrival(f"p{partition}-{off}",
                                                                   records.T0 + timedelta(seconds=s))).encode())
            for off, s in offsets_and_seconds]


def test_pipeline_waits_for_the_slow_partition_and_counts_late_records(records):
    topics = Topics(prefix="wm.", partitions=2)
    arr = topics.request_arrivals.name
    p0, p1 = (arr, 0), (arr, 1)
    pipe = Pipeline(topics, WorkerState(), period_s=P_S, allowed_lateness_s=LATE_S, origin=records.T0)
    # batch 1: partition 0 runs to 200 s, partition 1 (its fetch came back later) only to 30 s
    batch = _arrivals(topics, records, 0, [(0, 10), (1, 100), (2, 200)]) + _arrivals(topics, records, 1, [(0, 30)])
    res = pipe.step(batch, active={p0, p1})
    assert pipe.clock.closed_through == -1
    assert res.due == [0]  # only the opening decision: no period has closed
    kr = res.batch.rows["request_arrival"]
    assert kr.late == [False] * 4 and kr.decision_period == [1, 2, 4, 1]
    # batch 2: partition 1 delivers older period-0 records (not late: nothing closed) and reaches 70 s
    res = pipe.step(_arrivals(topics, records, 1, [(1, 40), (2, 70)]), active={p0, p1})
    assert res.batch.rows["request_arrival"].late == [False, False]
    assert pipe.clock.closed_through == 0 and res.due == [0, 1]  # base min(200, 70) - 5 = 65 s
    # batch 3: partition 1 sends a record of the closed period 0: late, counted, still ingested
    res = pipe.step(_arrivals(topics, records, 1, [(3, 50)]), active={p0, p1})
    kr = res.batch.rows["request_arrival"]
    assert kr.late == [True] and len(kr.values) == 1
    assert kr.decision_period == [2]  # seen by the next decision still to be made (closed_through + 2)
    assert pipe.state.counts["late"] == 1 and pipe.state.counts["processed"] == 7
    # batch 4: nothing new, partition 1 caught up (idle): partition 0's 200 s closes periods 1 and 2
    res = pipe.step([], active={p0})
    assert pipe.clock.closed_through == 2 and res.due == [0, 1, 2, 3]
    assert pipe.state.counts["late"] == 1
    assert pipe.state.partition_max_us == {p0: _us(records.T0, 200), p1: _us(records.T0, 70)}


def test_a_partition_lagging_within_a_batch_makes_no_record_late(records):
    """Closes happen after the whole batch is clocked: a partition whose records come behind another's in the
    same batch is not late, even when the batch leaves every partition caught up (active empty)."""
    topics = Topics(prefix="wm.", partitions=2)
    pipe = Pipeline(topics, WorkerState(), period_s=P_S, allowed_lateness_s=LATE_S, origin=records.T0)
    batch = _arrivals(topics, records, 0, [(0, 200)]) + _arrivals(topics, records, 1, [(0, 30), (1, 61)])
    res = pipe.step(batch, active=set())
    kr = res.batch.rows["request_arrival"]
    assert kr.late == [False, False, False] and kr.decision_period == [4, 1, 2]
    assert pipe.state.counts["late"] == 0
    assert pipe.clock.closed_through == 2 and res.due == [0, 1, 2, 3]  # base 195 s, after the batch
    res = pipe.step(_arrivals(topics, records, 1, [(2, 30)]), active=set())  # the next batch: now it is late
    assert res.batch.rows["request_arrival"].late == [True] and pipe.state.counts["late"] == 1


def test_pipeline_restart_keeps_the_per_partition_watermark(records):
    """The per-partition maxima are durable state: a restarted worker is still held by the slow partition."""
    topics = Topics(prefix="wm.", partitions=2)
    arr = topics.request_arrivals.name
    p0, p1 = (arr, 0), (arr, 1)
    pipe = Pipeline(topics, WorkerState(), period_s=P_S, allowed_lateness_s=LATE_S, origin=records.T0)
    batch = _arrivals(topics, records, 0, [(0, 300)]) + _arrivals(topics, records, 1, [(0, 20)])
    pipe.step(batch, active={p0, p1})
    assert pipe.clock.closed_through == -1
    again = Pipeline(topics, pipe.state, period_s=P_S, allowed_lateness_s=LATE_S)
    assert again.step([], active={p0, p1}).due == [0] and again.clock.closed_through == -1
    res = again.step(_arrivals(topics, records, 1, [(1, 130)]), active={p0, p1})
    assert again.clock.closed_through == 1 and res.due == [0, 1, 2]  # base min(300, 130) - 5 = 125 s


def test_a_price_drives_the_clock_by_its_publication_time(records):
    """A day-ahead price published now for tomorrow must not close today's periods (clock_field)."""
    topics = Topics(prefix="wm.")
    pipe = Pipeline(topics, WorkerState(), period_s=P_S, allowed_lateness_s=LATE_S, origin=records.T0)
    rec = records.price(records.T0 + timedelta(seconds=30))  # published at 30 s; its interval starts an hour back
    rec["event_at"] = (records.T0 + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # about tomorrow
    res = pipe.step([Inbound(topics.prices.name, 0, 0, json.dumps(rec).encode())])
    assert res.dead_letters == []
    assert pipe.clock.closed_through == -1 and pipe.clock.max_event_at == records.T0 + timedelta(seconds=30)
    assert res.batch.rows["price"].decision_period == [1]
