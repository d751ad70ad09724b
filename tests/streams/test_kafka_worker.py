"""The faust worker against a real broker (tests/conftest.py: Kafka container or a Tansu process).

Periods are 60 s of event time with 5 s allowed lateness, so a handful of records closes several.
"""

from __future__ import annotations

import base64
import json
import signal
import struct
import time
from datetime import timedelta

import duckdb
import pyarrow.parquet as pq
import pytest

from schemas.topics import Topics
from sinks import sql
from sinks.audit_store import FILE_GLOB

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PERIOD = ["--period-s", "60", "--allowed-lateness-s", "5", "--policy", "production"]


def _worker(kafka_tools, bootstrap, prefix, tmp_path, db="state.duckdb", audit="audit"):
    return kafka_tools.Proc(["worker", "--bootstrap-servers", bootstrap, "--topic-prefix", prefix,
                             "--group-id", f"{prefix}worker", "--db", db, "--audit-dir", audit, *PERIOD],
                            cwd=tmp_path)


def _raw_ids(directory):
    return [i for f in sorted(directory.glob(FILE_GLOB)) for i in pq.read_table(f).column("decision_id").to_pylist()]


def test_dead_letters_late_records_redelivery_and_audit(kafka_bootstrap, topic_prefix_factory, kafka_tools,
                                                        records, tmp_path):
    prefix = topic_prefix_factory()
    topics = Topics(prefix=prefix)
    kafka_tools.create_topics(kafka_bootstrap, prefix)
    t0 = records.T0
    good = [json.dumps(records.arrival(f"r{i}", t0 + timedelta(seconds=15 * i))).encode() for i in range(10)]
    late = json.dumps(records.arrival("late", t0 + timedelta(seconds=10))).encode()  # period 0, closed by then
    unknown = json.dumps(dict(records.arrival("u", t0), gpu_secret=1)).encode()
    violation = json.dumps(dict(records.arrival("v", t0), request_class="urgent")).encode()
    bad = [b"{not json", violation, unknown]
    arrivals = topics.request_arrivals.name
    closer = json.dumps(records.arrival("closer", t0 + timedelta(seconds=200))).encode()  # closes period 2
    kafka_tools.produce(kafka_bootstrap, arrivals, good[:5] + bad + good[5:])
    worker = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path)
    try:
        # good records up to 135 s: watermark 130 s closes periods 0 = (0, 60] and 1 = (60, 120]
        worker.wait_for(lambda s: s["counts"]["records_in"] == 13 and s["decided_through"] >= 2)
        kafka_tools.produce(kafka_bootstrap, arrivals, [late, closer])  # late: period 0 closed before it came
        st = worker.wait_for(lambda s: s["counts"]["records_in"] == 15 and s["decided_through"] >= 3)
        c = st["counts"]
        assert (c["processed"], c["dead_letters"], c["late"]) == (12, 3, 1)
        assert c["records_in"] == c["processed"] + c["dead_letters"]
        # the same good records delivered again (new offsets): ignored by key, no new decision
        kafka_tools.produce(kafka_bootstrap, arrivals, good)
        st = worker.wait_for(lambda s: s["counts"]["records_in"] == 25)
        assert st["counts"]["duplicates"] == 10 and st["counts"]["records_in"] == 25
        assert st["counts"]["processed"] + st["counts"]["dead_letters"] == 25
    finally:
        worker.stop()
    dead = kafka_tools.consume_all(kafka_bootstrap, topics.dead_letters.name, expect=3)
    assert len(dead) == 3
    by_offset = {struct.unpack(">q", dict(m.headers)["kafka_dlt-original-offset"])[0]: m for m in dead}
    assert sorted(by_offset) == [5, 6, 7]
    for off, raw in zip((5, 6, 7), bad, strict=True):
        m = by_offset[off]
        body = json.loads(m.value)
        assert base64.b64decode(body["original_value_b64"]) == raw
        assert body["source_topic"] == arrivals and dict(m.headers)["__connect.errors.topic"] == arrivals.encode()
    reasons = [json.loads(by_offset[o].value)["reason"] for o in (5, 6, 7)]
    assert "invalid JSON" in reasons[0] and "request_class" in reasons[1] and "gpu_secret" in reasons[2]
    audit = sql.query("SELECT period_index, late_records FROM audit ORDER BY 1", tmp_path / "audit")
    periods = audit["period_index"].to_list()
    assert periods == list(range(len(periods))) and len(periods) >= 4
    assert sum(audit["late_records"].to_list()) == 1  # the late record reached a decision, flagged
    assert len(_raw_ids(tmp_path / "audit")) == len(periods)


def _rows_by_id(directory) -> dict[str, dict]:
    """Every row of a Parquet audit log by decision id; fails if an id was written twice."""
    rows = [r for f in sorted(directory.glob(FILE_GLOB)) for r in pq.read_table(f).to_pylist()]
    by_id = {r["decision_id"]: r for r in rows}
    assert len(by_id) == len(rows), "a decision id written twice"
    return by_id


def _decision(row: dict) -> dict:
    """An audit row without what only its writer sets (when written, the Kafka offset it came from)."""
    return {k: v for k, v in row.items() if k not in ("written_at", "kafka_offset")}


def _durable_state(db) -> tuple[int, dict, int]:
    """(decided_through, counters, arrivals in the ledger) as the worker's DuckDB file holds them."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        kv = dict(con.execute("SELECT name, value FROM worker_state").fetchall())
        (ledger,) = con.execute("SELECT count(*) FROM worker_ledger_request_arrival").fetchone()
    finally:
        con.close()
    return int(kv.get("decided_through", -1)), json.loads(kv["counts"]), int(ledger)


def _outbox(db) -> dict[str, dict]:
    """The worker's outbox (decision id -> audit record), as its DuckDB file holds it."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {i: json.loads(r) for i, r in con.execute("SELECT decision_id, record FROM worker_outbox").fetchall()}
    finally:
        con.close()


def test_sigkill_mid_replay_loses_and_duplicates_no_audit_row(kafka_bootstrap, topic_prefix_factory,
                                                               kafka_tools, records, tmp_path):
    prefix = topic_prefix_factory()
    topics = Topics(prefix=prefix)
    kafka_tools.create_topics(kafka_bootstrap, prefix)
    t0 = records.T0
    n_periods = 12
    values = [json.dumps(records.arrival(f"r{i}", t0 + timedelta(seconds=10 * i))).encode()
              for i in range(6 * n_periods + 1)]  # watermark 715 s: periods 0 .. n_periods - 2 close
    first_half = values[: len(values) // 2]
    sink = kafka_tools.Proc(["audit-sink", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix,
                             "--audit-dir", "sink_audit"], cwd=tmp_path)
    try:
        worker = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path)
        try:
            kafka_tools.produce(kafka_bootstrap, topics.request_arrivals.name, first_half)
            seen = worker.wait_for(lambda s: s["decided_through"] >= 3)["decided_through"]
            worker.stop(signal.SIGKILL)
            assert worker.p.returncode == -signal.SIGKILL
            # what the killed worker committed: its DuckDB state and its own audit log
            decided, counts, ledger = _durable_state(tmp_path / "state.duckdb")
            assert decided >= seen >= 3  # a period reported decided was marked durably first
            assert counts["records_in"] == counts["processed"] == ledger <= len(first_half)  # one transaction
            assert counts["dead_letters"] == counts["duplicates"] == counts["late"] == 0
            outbox = _outbox(tmp_path / "state.duckdb")  # decided = in the outbox, one record each, in one transaction
            assert sorted(r["period_index"] for r in outbox.values()) == list(range(decided + 1))
            before = _rows_by_id(tmp_path / "audit")
            assert sorted(r["period_index"] for r in before.values()) == list(range(len(before)))
            assert set(before) <= set(outbox)  # the local log is a copy of the outbox (it may trail it)
            assert all(json.loads(row["chosen_plan"]) == outbox[i]["chosen_plan"] for i, row in before.items())
            # the audit topic holds every decision the worker published before it died, each once; the sink, which
            # kept running, ends up with exactly those, row for row as the worker wrote them
            published = [json.loads(m.value) for m in kafka_tools.consume_all(
                kafka_bootstrap, topics.recommendations.name, expect=n_periods, timeout_s=5)]
            published_ids = [r["decision_id"] for r in published]
            assert len(published_ids) == len(set(published_ids))
            assert set(before) <= set(published_ids) <= set(outbox)  # published only from the outbox
            assert sorted(r["period_index"] for r in published) == list(range(len(published)))
            deadline = time.monotonic() + 30
            while set(_rows_by_id(tmp_path / "sink_audit")) != set(published_ids) and time.monotonic() < deadline:
                time.sleep(0.3)
            mid = sql.query("SELECT decision_id FROM audit ORDER BY period_index", tmp_path / "sink_audit")
            by_period = sorted(published, key=lambda r: r["period_index"])
            assert mid["decision_id"].to_list() == [r["decision_id"] for r in by_period]
            sink_rows = _rows_by_id(tmp_path / "sink_audit")
            assert all(_decision(sink_rows[i]) == _decision(row) for i, row in before.items())
            # restart on the same state: it resumes where the durable state says, not from scratch
            kafka_tools.produce(kafka_bootstrap, topics.request_arrivals.name, values[len(values) // 2:])
            worker = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path)
            last = str(t0 + timedelta(seconds=10 * (len(values) - 1) - 5))  # the last record, less the lateness
            # `decisions` counts a decision once its record is published, `decided_through` once it is decided
            # (before its publication): a stats line between the two shows the second ahead, so wait for both
            st = worker.wait_for(lambda s: s["decided_through"] >= n_periods - 1 and s["watermark"] == last
                                 and s["decisions"] >= n_periods - 1 - decided, timeout_s=90)
            assert st["decided_through"] == n_periods - 1
            assert st["decisions"] == n_periods - 1 - decided  # only the periods not marked decided before the kill
            assert st["counts"]["records_in"] == st["counts"]["processed"] == len(values)  # counters carried over
            assert st["counts"]["duplicates"] == 0  # consumption resumed at the stored offsets: nothing re-read
            q = kafka_tools.Proc(["audit", "sql", "SELECT count(*) AS n FROM audit", "--audit-dir", "sink_audit",
                                  "--format", "csv"], cwd=tmp_path)
            assert q.p.wait(30) == 0, "".join(q.lines)
        finally:
            worker.stop()
        assert _durable_state(tmp_path / "state.duckdb")[::2] == (n_periods - 1, len(values))
        expected = list(range(n_periods))
        after = _rows_by_id(tmp_path / "audit")
        assert sorted(r["period_index"] for r in after.values()) == expected
        assert all(after[i] == row for i, row in before.items())  # the pre-kill rows kept as written, not redone
        deadline = time.monotonic() + 30
        while set(_rows_by_id(tmp_path / "sink_audit")) != set(after) and time.monotonic() < deadline:
            time.sleep(0.3)
        sink.stop()
        sink_rows = _rows_by_id(tmp_path / "sink_audit")  # nothing duplicated (checked inside)
        assert set(sink_rows) == set(after)  # nothing lost
        assert all(_decision(sink_rows[i]) == _decision(row) for i, row in after.items())
    finally:
        sink.stop()
