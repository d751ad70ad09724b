"""One audit truth: decisions go through the outbox in the worker's DuckDB (streams/ingest.py) before the
audit topic and the local audit log get their copies; a crash anywhere leaves one record per decision id."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest

from schemas.topics import Topics
from sinks.memory import MemorySink
from streams.app import Worker
from streams.decide import DecisionInput
from streams.ingest import DuckDBIngestor
from streams.pipeline import Inbound, Outbound, Pipeline


class PlanDecider:
    """Returns an audit record whose plan carries a run tag: a re-made decision differs from the first."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def decide(self, inp: DecisionInput) -> dict:
        return {"decision_id": f"d{inp.period_index}", "period_index": inp.period_index,
                "period_start": inp.period_start.isoformat(), "chosen_plan": {"run": self.tag}}


class Crash(Exception):
    pass


def _worker(db, tag, fail_after=None):
    """A worker on `db` whose `send` raises (a crash) once `fail_after` audit records went out."""
    topics = Topics(prefix="x.")
    ing = DuckDBIngestor.open(db)
    pipe = Pipeline(topics, ing.load_state(), period_s=60, allowed_lateness_s=5)
    sent: list[Outbound] = []

    async def send(o: Outbound) -> None:
        if o.topic == topics.recommendations.name:
            if fail_after is not None and len(sent) >= fail_after:
                raise Crash("broker gone")
            sent.append(o)

    audit = MemorySink()
    return topics, ing, Worker(pipe, ing, lambda origin: PlanDecider(tag), audit, send), sent, audit


def _arrivals(topics, records, n, start=0):
    t = topics.for_kind("request_arrival").name
    return [Inbound(t, 0, start + i, json.dumps(records.arrival(f"r{start + i}", records.T0 + timedelta(
        seconds=30 * (start + i)))).encode()) for i in range(n)]


def test_record_decision_keeps_the_first_record_and_marks_the_period(tmp_path):
    ing = DuckDBIngestor.open(tmp_path / "s.duckdb")
    first = ing.record_decision(0, {"decision_id": "d0", "chosen_plan": {"run": "a"}})
    again = ing.record_decision(0, {"decision_id": "d0", "chosen_plan": {"run": "b"}})
    assert first == again == {"decision_id": "d0", "chosen_plan": {"run": "a"}}
    assert ing.load_state().decided_through == 0
    assert [r["decision_id"] for r in ing.unpublished()] == ["d0"]
    ing.mark_published(["d0"])
    assert ing.unpublished() == []
    ing.close()
    assert DuckDBIngestor.open(tmp_path / "s.duckdb").load_state().decided_through == 0


@pytest.mark.parametrize("fail_after", [0, 1, 2])
def test_a_crash_while_publishing_leaves_one_record_per_decision(tmp_path, records, fail_after):
    db = tmp_path / "s.duckdb"
    topics, ing, worker, sent, audit = _worker(db, "first", fail_after=fail_after)
    with pytest.raises(Crash):  # the batch closes periods 0-3; publishing stops after `fail_after` records
        asyncio.run(worker.handle(_arrivals(topics, records, 12)))
    decided = ing.load_state().decided_through
    ing.close()
    assert decided >= 0  # decided into the outbox before any publication was tried

    # restart: a different decider would choose differently, but the stored decisions stand and are published
    topics, ing, worker, sent2, audit2 = _worker(db, "second")
    asyncio.run(worker.handle(_arrivals(topics, records, 4, start=12)))
    on_topic = [json.loads(o.value) for o in sent + sent2]
    ids = [r["decision_id"] for r in on_topic]
    assert sorted(set(ids)) == [f"d{k}" for k in range(ing.load_state().decided_through + 1)]
    first_run = {f"d{k}" for k in range(decided + 1)}
    assert all(r["chosen_plan"]["run"] == "first" for r in on_topic if r["decision_id"] in first_run)
    # only what the crashed run got onto the topic can be there twice (consumers drop it by decision id)
    assert len(ids) - len(set(ids)) == len(sent) == fail_after
    local = list(audit) + list(audit2)
    assert sorted(r["decision_id"] for r in local) == sorted(set(ids))  # the local log: exactly one each
    assert ing.unpublished() == []
    ing.close()


def test_a_gap_in_the_stream_gets_one_decision_not_one_per_period(tmp_path, records):
    topics, ing, worker, sent, audit = _worker(tmp_path / "s.duckdb", "run")
    asyncio.run(worker.handle(_arrivals(topics, records, 4)))  # 0-90 s: period 0 open, one minute periods
    later = records.arrival("late-burst", records.T0 + timedelta(hours=10))  # 600 quiet periods, then a record
    t = topics.for_kind("request_arrival").name
    asyncio.run(worker.handle([Inbound(t, 0, 4, json.dumps(later).encode())]))
    got = [json.loads(o.value) for o in sent]
    gaps = [r for r in got if r.get("gap")]
    assert len(got) < 10 and len(gaps) == 1  # not ~600 decisions
    g = gaps[0]["gap"]
    assert g["decisions_skipped"] == g["last_period"] - g["first_period"] > 500
    assert gaps[0]["period_index"] == g["last_period"] + 1
    assert ing.load_state().decided_through == max(r["period_index"] for r in got)
    ing.close()


class RunningTotal:
    """A decider with state: its plan is the number of arrivals it has seen over all its decisions."""

    def __init__(self) -> None:
        self.seen = 0

    def decide(self, inp: DecisionInput) -> dict:
        arrivals = inp.observations.get("request_arrival")
        self.seen += 0 if arrivals is None else arrivals.height
        return {"decision_id": f"d{inp.period_index}", "period_index": inp.period_index,
                "period_start": inp.period_start.isoformat(), "chosen_plan": {"seen": self.seen}}


def test_a_restarted_worker_rebuilds_its_deciders_state_from_the_outbox_periods(tmp_path, records):
    def run(db, parts):
        topics = Topics(prefix="x.")
        out = []
        for part in parts:
            ing = DuckDBIngestor.open(db)
            pipe = Pipeline(topics, ing.load_state(), period_s=60, allowed_lateness_s=5)

            async def send(o: Outbound) -> None:
                out.append(json.loads(o.value))

            worker = Worker(pipe, ing, lambda origin: RunningTotal(), MemorySink(), send)
            for lo, hi in part:
                asyncio.run(worker.handle(_arrivals(topics, records, hi - lo, start=lo)))
            ing.close()
        return {r["period_index"]: r["chosen_plan"] for r in out}

    whole = run(tmp_path / "a.duckdb", [[(0, 10), (10, 20), (20, 30)]])
    restarted = run(tmp_path / "b.duckdb", [[(0, 10)], [(10, 20), (20, 30)]])  # a new worker and decider
    assert len(whole) >= 10 and whole == restarted
    assert whole[max(whole)]["seen"] > 10  # the last plan counts arrivals from before the restart
