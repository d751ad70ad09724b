"""Bounded event time, against the stream itself, never the wall clock (issue 18, item 2).

Before: one arrival stamped 30 days ahead closed 8,638 periods (one decision each), year 9999 raised
MemoryError, and timestamps in year 1/1900/1970 grew the worker to 24 GB through a set over the whole range in
forecasting/series.py. Now a clock time before the origin minus `history_span_s`, or more than `max_ahead_s`
ahead of the stream's clock, is dead-lettered with its reason; at most `max_close_periods` close per batch; a
gap within the bounds is reported once (`StepResult.gaps`); and series.py holds what its records need, not
what their time range spans. Everything is 2023 data, so replays of old data through Kafka are covered.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from forecasting.series import PeriodAggregator, period_counts, period_grid
from schemas.topics import Topics
from streams.clock import Gap
from streams.ingest import DuckDBIngestor, WorkerState
from streams.pipeline import Inbound, Limits, Pipeline

TOPICS = Topics(prefix="x.")
ARR = TOPICS.request_arrivals.name
P_S, LATE_S = 60, 5


def _pipe(origin, **limits) -> Pipeline:
    return Pipeline(TOPICS, WorkerState(), P_S, LATE_S, origin=origin, limits=Limits(**limits))


def _wire(t: datetime) -> str:
    return t.isoformat(timespec="microseconds").replace("+00:00", "Z")  # 4-digit years, year 1 too


def _batch(records, times, start=0, partition=0, topic=ARR) -> list[Inbound]:
    out = []
    for i, t in enumerate(times):
        rec = records.arrival(f"r{partition}-{start + i}", t) | {"event_at": _wire(t), "arrived_at": _wire(t)}
        out.append(Inbound(topic, partition, start + i, json.dumps(rec).encode()))
    return out


def _reconciles(pipe: Pipeline) -> None:
    c = pipe.state.counts
    assert c["records_in"] == c["processed"] + c["dead_letters"]


def _reasons(res) -> list[str]:
    return [json.loads(o.value)["reason"] for o in res.dead_letters]


@pytest.mark.parametrize("stamp, says", [
    (datetime(2023, 7, 31, 12, tzinfo=UTC), "is more than 1 day ahead of the stream: after 2023-07-02T12:00:50Z, "
                                            "its clock 2023-07-01T12:00:50Z (the largest clock time accepted) plus "
                                            "max_ahead_s"),
    (datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), "is more than 1 day ahead of the stream"),
    (datetime(1, 1, 1, tzinfo=UTC), "is before 2023-06-23T12:00:00Z: the stream's origin 2023-07-01T12:00:00Z "
                                     "minus history_span_s (8 days)"),
    (datetime(1900, 1, 1, tzinfo=UTC), "is before 2023-06-23T12:00:00Z"),
    (datetime(1970, 1, 1, tzinfo=UTC), "is before 2023-06-23T12:00:00Z"),
])
def test_an_implausible_event_time_is_one_dead_letter_and_closes_nothing(records, stamp, says):
    t0 = records.T0
    pipe = _pipe(t0)
    ing = DuckDBIngestor.open(":memory:")
    times = [t0 + timedelta(seconds=10), t0 + timedelta(seconds=50), stamp, t0 + timedelta(seconds=60)]
    res = pipe.step(_batch(records, times))
    assert len(res.dead_letters) == 1
    (reason,) = _reasons(res)
    assert reason.startswith(f"field 'event_at' = {stamp.isoformat().replace('+00:00', 'Z')} "), reason
    assert says in reason, reason
    assert reason.endswith("; not ingested")
    assert json.loads(res.dead_letters[0].value)["error_class"] == "streams.pipeline.EventTimeError"
    assert dict(res.dead_letters[0].headers)["__connect.errors.offset"] == b"2"
    assert pipe.clock.closed_through == -1 and res.due == [0] and res.gaps == ()  # watermark 55 s: nothing closed
    c = pipe.state.counts
    assert (c["records_in"], c["processed"], c["dead_letters"]) == (4, 3, 1)
    _reconciles(pipe)
    assert ing.commit(res.batch) == 3
    # the stream goes on as if the record had never come
    res = pipe.step(_batch(records, [t0 + timedelta(seconds=130)], start=4))
    assert res.dead_letters == [] and pipe.clock.closed_through == 1 and res.due == [0, 1, 2]


def test_history_within_the_span_and_late_records_are_kept(records):
    t0 = records.T0
    pipe = _pipe(t0)
    times = [t0 - timedelta(days=7, hours=23), t0 - timedelta(days=1), t0 + timedelta(hours=20)]
    res = pipe.step(_batch(records, times))
    assert res.dead_letters == [] and pipe.state.counts["processed"] == 3
    res = pipe.step(_batch(records, [t0 + timedelta(minutes=1)], start=3))  # long closed: late, kept
    assert res.dead_letters == [] and pipe.state.counts["late"] == 1
    _reconciles(pipe)


def test_replayed_2023_data_without_origin_is_bounded_by_its_first_batch(records):
    """No --start, no stored state: the first batch's median clock time stands in for the stream's clock."""
    t0 = records.T0
    pipe = _pipe(None)
    times = [datetime(1900, 1, 1, tzinfo=UTC), t0, t0 + timedelta(seconds=30), datetime(9999, 1, 1, tzinfo=UTC),
             t0 + timedelta(seconds=90)]
    res = pipe.step(_batch(records, times))
    assert len(res.dead_letters) == 2
    early, late = _reasons(res)
    assert "the stream's first batch's median clock time 2023-07-01T12:00:30Z minus history_span_s" in early
    assert "is more than 1 day ahead of the stream" in late
    assert pipe.clock.origin == t0  # the first accepted record's period, not 1900's
    _reconciles(pipe)


def test_the_bound_follows_the_stream_not_the_wall_clock(records):
    """A stream that moves on a few hours at a time may travel any distance; one jump may not."""
    t0 = records.T0
    pipe = _pipe(t0, max_ahead_s=6 * 3600)
    at, offset = t0, 0
    for _ in range(10):
        at += timedelta(hours=5)
        res = pipe.step(_batch(records, [at], start=offset))
        offset += 1
        assert res.dead_letters == []
    res = pipe.step(_batch(records, [at + timedelta(hours=7)], start=offset))
    assert "is more than 6 h ahead of the stream" in _reasons(res)[0]
    _reconciles(pipe)


def test_a_gap_is_reported_once_with_its_decisions(records):
    t0 = records.T0
    pipe = _pipe(t0)
    pipe.step(_batch(records, [t0 + timedelta(seconds=s) for s in (10, 70, 130)]))
    assert pipe.clock.closed_through == 1  # watermark 125 s
    # twelve hours later (inside max_ahead_s): periods 2 .. 719 close at once; 2 holds a record, 3 .. 719 none
    res = pipe.step(_batch(records, [t0 + timedelta(hours=12, seconds=30)], start=3))
    assert res.dead_letters == [] and pipe.clock.closed_through == 719
    assert res.gaps == (Gap(3, 719),)  # period 2 holds the record at 130 s
    gap = res.gaps[0]
    assert gap.periods == 717 and gap.decisions == range(4, 721)
    assert res.due == list(range(0, 721)) and set(gap.decisions) <= set(res.due)
    # the decisions of the gap see nothing: no record of this batch or any earlier one is routed to them
    seen = {p for kr in res.batch.rows.values() for p in kr.decision_period}
    assert not seen & set(gap.decisions)


def test_a_late_record_keeps_its_decision_out_of_the_gap(records):
    t0 = records.T0
    pipe = _pipe(t0)
    pipe.step(_batch(records, [t0 + timedelta(seconds=10), t0 + timedelta(seconds=124)]))
    assert pipe.clock.closed_through == 0  # watermark 119 s; period 1 = (60, 120] got nothing
    res = pipe.step(_batch(records, [t0 + timedelta(seconds=20), t0 + timedelta(hours=1, seconds=5)], start=2))
    rows = res.batch.rows["request_arrival"]
    assert rows.late == [True, False] and rows.decision_period[0] == 2  # the next decision sees the late one
    assert pipe.clock.closed_through == 58
    assert res.gaps == (Gap(3, 58),)  # not (1, 1): decision 2 sees the late record


def test_periods_close_in_bounded_steps(records):
    t0 = records.T0
    pipe = _pipe(t0, max_close_periods=100)
    pipe.step(_batch(records, [t0 + timedelta(seconds=10)]))
    res = pipe.step(_batch(records, [t0 + timedelta(hours=12)], start=1))
    assert pipe.clock.closed_through == 99 and len(res.due) == 101 and res.gaps == (Gap(1, 99),)
    steps = 1
    while pipe.clock.closed_through < 718:  # idle polls are batches too: the rest closes 100 at a time
        res = pipe.step([])
        steps += 1
        assert len(res.gaps) == 1 and res.gaps[0].periods <= 100
    assert steps == 8 and pipe.clock.closed_through == 718


def test_a_restarted_pipeline_never_calls_open_periods_it_did_not_see_empty(records):
    t0 = records.T0
    pipe = _pipe(t0)
    pipe.step(_batch(records, [t0 + timedelta(seconds=10), t0 + timedelta(seconds=200)]), active={(ARR, 0), (ARR, 1)})
    assert pipe.clock.closed_through == -1  # partition 1 has delivered nothing: it holds the watermark
    again = Pipeline(TOPICS, pipe.state, P_S, LATE_S)
    res = again.step(_batch(records, [t0 + timedelta(minutes=30)], partition=1))
    assert again.clock.closed_through == 28
    assert res.gaps == (Gap(4, 28),)  # 1 and 2 are empty, but were open at the restart: not reported


# --- forecasting/series.py: nothing sized by the time range ------------------------------------------------


def _arrivals(times: list[datetime]) -> pl.DataFrame:
    return pl.DataFrame({"event_at": times, "request_class": ["chat"] * len(times),
                         "input_tokens": [100] * len(times), "prefix_block_ids": [[1, 2]] * len(times)},
                        schema={"event_at": pl.Datetime("us", "UTC"), "request_class": pl.String,
                                "input_tokens": pl.Int64, "prefix_block_ids": pl.List(pl.Int64)})


def test_period_aggregator_holds_what_its_records_need(records):
    t0 = records.T0
    agg = PeriodAggregator(period_s=300)
    far = [datetime(1, 1, 1, tzinfo=UTC), datetime(1900, 1, 1, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC),
           datetime(9999, 12, 31, tzinfo=UTC)]
    agg.update_arrivals(_arrivals([*far, t0, t0 + timedelta(minutes=7)]))
    out = agg.close(int((t0 + timedelta(minutes=10)).timestamp() * 1e6))
    arrivals = [(y, ev) for name, y, ev, _ in out if name == "arrivals/chat"]
    assert [y for y, _ in arrivals] == [1.0, 1.0]  # the two 2023 periods; year 1/1900/1970 dropped
    assert agg.dropped_records == 3
    assert len(out) < 50 and agg.held() < 30  # year 9999 waits, one entry
    out = agg.close(int((t0 + timedelta(hours=1)).timestamp() * 1e6))
    assert len([1 for name, *_ in out if name == "arrivals/chat"]) == 10 and agg.held() < 30


def test_period_counts_grid_is_bounded_by_the_data(records):
    t0 = records.T0
    minutes = [datetime(1, 1, 1, tzinfo=UTC), t0, t0 + timedelta(minutes=12), datetime(9999, 12, 31, tzinfo=UTC)]
    per_minute = pl.DataFrame({"minute_at": minutes, "request_class": ["chat"] * 4, "requests": [1, 2, 3, 4]})
    counts, event_us, arrived_us = period_counts(per_minute, None, t0)["chat"]
    assert len(counts) == len(event_us) == len(arrived_us) == 5  # year 1, 3 periods of 2023 (one empty), 9999
    assert counts.tolist() == [1.0, 2.0, 0.0, 3.0, 4.0] and np.all(np.diff(event_us) > 0)
    assert len(period_grid(np.array([-10**12, 0, 10**12]))) == 3
