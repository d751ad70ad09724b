"""The faust worker against a real broker (tests/conftest.py: Kafka container or a Tansu process).

Periods are 60 s of event time with 5 s allowed lateness, so a handful of records closes several.
"""

from __future__ import annotations

import base64
import json
import signal
import struct
from datetime import timedelta

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


def test_sigkill_mid_replay_loses_and_duplicates_no_audit_row(kafka_bootstrap, topic_prefix_factory,
                                                               kafka_tools, records, tmp_path):
    prefix = topic_prefix_factory()
    topics = Topics(prefix=prefix)
    kafka_tools.create_topics(kafka_bootstrap, prefix)
    t0 = records.T0
    n_periods = 12
    values = [json.dumps(records.arrival(f"r{i}", t0 + timedelta(seconds=10 * i))).encode()
              for i in range(6 * n_periods + 1)]  # watermark 715 s: periods 0 .. n_periods - 2 close
    sink = kafka_tools.Proc(["audit-sink", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix,
                             "--audit-dir", "sink_audit"], cwd=tmp_path)
    worker = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path)
    try:
        kafka_tools.produce(kafka_bootstrap, topics.request_arrivals.name, values[: len(values) // 2])
        worker.wait_for(lambda s: s["decided_through"] >= 3)
        worker.stop(signal.SIGKILL)
        # a query while the sink keeps writing
        mid = sql.query("SELECT count(*) AS n FROM audit", tmp_path / "sink_audit").item()
        assert mid >= 0
        kafka_tools.produce(kafka_bootstrap, topics.request_arrivals.name, values[len(values) // 2:])
        worker = _worker(kafka_tools, kafka_bootstrap, prefix, tmp_path)
        worker.wait_for(lambda s: s["decided_through"] >= n_periods - 1, timeout_s=90)
        q = kafka_tools.Proc(["audit", "sql", "SELECT count(*) AS n FROM audit", "--audit-dir", "sink_audit",
                              "--format", "csv"], cwd=tmp_path)
        assert q.p.wait(30) == 0, "".join(q.lines)
    finally:
        worker.stop()
    expected = list(range(n_periods))
    worker_ids = _raw_ids(tmp_path / "audit")
    assert sorted(sql.query("SELECT period_index FROM audit", tmp_path / "audit")["period_index"]) == expected
    assert len(worker_ids) == len(set(worker_ids)) == len(expected)
    import time

    deadline = time.monotonic() + 30
    while len(set(_raw_ids(tmp_path / "sink_audit"))) < len(expected) and time.monotonic() < deadline:
        time.sleep(0.3)
    sink.stop()
    sink_ids = _raw_ids(tmp_path / "sink_audit")
    assert sorted(sink_ids) == sorted(worker_ids)  # nothing lost, nothing duplicated
