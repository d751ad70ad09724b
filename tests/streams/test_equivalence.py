"""Issue 7 item 8: decisions made through the streaming worker equal the embedded replay's.

The embedded replay runs a 4-period PJM window (then its drain, 36 decisions) under production-tuned, whose
plan depends on the prices published so far (its p90 price rule and the note it records); it writes the
observation stream as `aurelius replay --emit-observations` does. That directory goes (a) through the
worker's per-batch logic in process and (b) through Kafka (`aurelius publish --from-dir`, `aurelius worker`
with the replay's history), and the plan chosen for every period must be the same dict.

Also here: the validation fast path (`streams.pipeline.fast_validator`) never accepts what the JSON Schema
rejects, and accepts every good record, on records of every kind and their mutations.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from schemas import SchemaError, validate
from schemas.topics import INPUT_KINDS
from streams.equivalence import embedded_replay, replay_decisions
from streams.pipeline import fast_validator
from streams.publish import load_directory
from streams.settings import WorkerSettings

START = datetime(2023, 7, 27, 16, tzinfo=UTC)
PERIODS = 4
POLICY = "production-tuned"


def _canon(plans: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(p, sort_keys=True, default=str) for p in plans]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("replay")
    return out, embedded_replay("PJM", START, PERIODS, POLICY, out)


def _settings(policy: str = POLICY) -> WorkerSettings:
    return WorkerSettings(market="PJM", policy=policy, period_s=300.0, window_periods=PERIODS,
                          history_from_replay=True)


@pytest.mark.slow
def test_worker_logic_decides_as_the_embedded_replay(replayed):
    from streams.worker_cli import replay_setup

    out, plans = replayed
    # the policy reads the worker's own state (one world state), as `aurelius worker` wires it
    records = replay_decisions(out, lambda _origin, world: replay_setup(_settings(), START, world).decider,
                               period_s=300.0, allowed_lateness_s=30.0, origin=START, batch_records=7000)
    assert [r["period_index"] for r in records] == list(range(len(plans)))
    assert _canon([r["chosen_plan"] for r in records]) == _canon(plans)
    notes = {p["notes"] for p in plans}
    assert len(notes) >= 3, "the plans must depend on the published prices, or the test proves little"
    # decision 1 sees the week of prices published before the window; the 17:00 price reaches the 17:00 one
    assert records[1]["observed"]["price"] == 168 and records[12]["observed"]["price"] == 1


@pytest.mark.slow
def test_a_restarted_worker_rebuilds_aurelius_and_decides_as_an_uninterrupted_run(tmp_path):
    """A worker stopped after two batches and restarted on its DuckDB file (a new aurelius policy, rebuilt from the
    outbox's decisions) chooses every period's plan as the uninterrupted embedded replay. In this 4-period window
    aurelius's later plans do not depend on what it saw before the restart (the test also passes without the
    rebuild); test_outbox.py's stateful decider is what shows the rebuild itself."""
    from streams.worker_cli import replay_setup

    plans = embedded_replay("PJM", START, PERIODS, "aurelius", tmp_path)
    records = replay_decisions(tmp_path, lambda _origin, world: replay_setup(_settings("aurelius"), START, world)
                               .decider, period_s=300.0, allowed_lateness_s=30.0, origin=START, batch_records=7000,
                               restart_after_batches=2, db=tmp_path / "state.duckdb")
    assert [r["period_index"] for r in records] == list(range(len(plans)))
    assert _canon([r["chosen_plan"] for r in records]) == _canon(plans)


@pytest.mark.slow
def test_aurelius_reading_the_workers_state_decides_as_the_embedded_replay(tmp_path):
    """One world state: in the worker the aurelius policy reads the worker's DuckDB (records committed by the
    worker's transaction, no second ingest), and still chooses every period's plan as in the embedded replay,
    where it keeps its own state."""
    from streams.worker_cli import replay_setup

    plans = embedded_replay("PJM", START, PERIODS, "aurelius", tmp_path)
    seen: list = []

    def factory(_origin, world):
        decider = replay_setup(_settings("aurelius"), START, world).decider
        seen.append((decider.policy.world_model, world))
        return decider

    records = replay_decisions(tmp_path, factory, period_s=300.0, allowed_lateness_s=30.0, origin=START,
                               batch_records=7000)
    ((world_model, world),) = seen
    assert world_model.state is world  # the policy read the worker's state, it did not open one of its own
    assert [r["period_index"] for r in records] == list(range(len(plans)))
    assert _canon([r["chosen_plan"] for r in records]) == _canon(plans)
    assert sum(not r["fallback"] for r in records) >= 1, "some plan must come from the forward model"


@pytest.mark.kafka
@pytest.mark.slow
def test_kafka_worker_decides_as_the_embedded_replay(replayed, kafka_bootstrap, topic_prefix_factory, kafka_tools,
                                                     tmp_path):
    from sinks import sql

    out, plans = replayed
    prefix = topic_prefix_factory()
    kafka_tools.create_topics(kafka_bootstrap, prefix)
    pub = kafka_tools.Proc(["publish", "--from-dir", str(out), "--speedup", "0", "--bootstrap-servers",
                            kafka_bootstrap, "--topic-prefix", prefix], cwd=tmp_path)
    assert pub.p.wait(180) == 0, "".join(pub.lines)
    env = {"AURELIUS_HISTORY_FROM_REPLAY": "true", "AURELIUS_WINDOW_PERIODS": str(PERIODS)}
    worker = kafka_tools.Proc(["worker", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix,
                               "--group-id", f"{prefix}worker", "--db", "state.duckdb", "--audit-dir", "audit",
                               "--policy", POLICY, "--market", "PJM", "--period-s", "300",
                               "--allowed-lateness-s", "30", "--start", START.isoformat()], cwd=tmp_path, env=env)
    try:
        st = worker.wait_for(lambda s: s["decided_through"] >= len(plans) - 1, timeout_s=300)
    finally:
        worker.stop()
    assert st["counts"]["late"] == 0 and st["counts"]["dead_letters"] == 0
    got = sql.query("SELECT period_index, chosen_plan FROM audit ORDER BY 1", tmp_path / "audit")
    assert got["period_index"].to_list() == list(range(len(plans)))
    assert _canon([json.loads(p) for p in got["chosen_plan"]]) == _canon(plans)


# --- the validation fast path against the schema validator ---


def _mutations(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Each field: removed, null, a wrong type, out of range, a bad time; plus an unknown field."""
    out = [dict(record, unknown_field=1)]
    for name, value in record.items():
        out.append({k: v for k, v in record.items() if k != name})
        for bad in (None, "x", "", 1, 1.5, -1, 10**20, True, [], {}, [None], ["x"], [1.0],
                    "2023-07-01T13:00:00", "2023-02-30T13:00:00Z", "2023-07-01T13:00:00Z\n", "2023-07-01 13:00:00Z"):
            if bad != value or type(bad) is not type(value):
                out.append(dict(record, **{name: bad}))
        if isinstance(value, int | float) and not isinstance(value, bool):
            out.append(dict(record, **{name: float(value)}))  # integral float: "integer" accepts it
    return out


def _schema_ok(kind: str, record: Any) -> bool:
    try:
        validate(kind, json.loads(json.dumps(record)))
        return True
    except SchemaError:
        return False


@pytest.mark.slow
def test_fast_path_accepts_only_schema_valid_records(replayed):
    out, _ = replayed
    records = load_directory(out)
    assert set(records) == set(INPUT_KINDS)
    for kind, rows in records.items():
        fast = fast_validator(kind)
        assert fast is not None, f"no fast path for {kind}"
        sample = rows[:: max(len(rows) // 40, 1)]
        for good in sample:
            fast(json.dumps(good).encode())  # every good record takes the fast path
        tried = accepted = 0
        for bad in (m for good in sample[:3] for m in _mutations(good)):
            tried += 1
            raw = json.dumps(bad).encode()
            try:
                fast(raw)
            except ValueError:
                continue
            accepted += 1
            assert _schema_ok(kind, bad), f"fast path accepted a schema-invalid {kind}: {raw!r}"
        assert tried > 100 and accepted < tried


def test_fast_path_rejects_malformed_bytes():
    fast = fast_validator("price")
    assert fast is not None
    for raw in (b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"schema_version": "1"} trailing', b"NaN"):
        with pytest.raises(ValueError):
            fast(raw)
