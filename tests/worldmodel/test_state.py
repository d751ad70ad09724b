"""World-model DuckDB state: idempotent ingestion, positions, migrations, snapshot as of an instant."""

from datetime import UTC, datetime, timedelta

import duckdb
import polars as pl
import pytest

from worldmodel.snapshot import snapshot
from worldmodel.state import CURRENT_VERSION, WorldState, migrate, schema_version
from worldmodel.state import synthetic as syn
from worldmodel.state.store import CHECKPOINT_THRESHOLD

T0 = datetime(2023, 7, 1, tzinfo=UTC)


def _batch():
    arr = syn.arrivals(T0, 200, rate_per_s=10.0)
    return {
        "request_arrival": arr,
        "request_completion": syn.completions(arr.head(120)),
        "gpu_telemetry": syn.telemetry(T0, 8 * 8 * 10, hosts=8),
        "price": syn.prices(T0, 3),
        "fleet_event": syn.fleet_events(T0 - timedelta(minutes=5), 2),
    }


def test_ingest_is_idempotent_and_positions_never_go_back():
    ws = WorldState.open(":memory:")
    batch = _batch()
    total = sum(f.height for f in batch.values())
    first = ws.update(batch, {("aurelius.telemetry", 0): 640, ("aurelius.requests", 1): 200})
    assert (first.inserted, first.duplicates) == (total, 0)
    before = ws.digest()
    # a replay of the same records plus an older position changes nothing
    again = ws.update(batch, {("aurelius.telemetry", 0): 100})
    assert (again.inserted, again.duplicates) == (0, total)
    assert ws.digest() == before
    assert ws.positions() == {("aurelius.telemetry", 0): 640, ("aurelius.requests", 1): 200}
    # duplicates inside one batch are inserted once
    dup = syn.arrivals(T0 + timedelta(hours=1), 5, request_class="code", seed=3)
    dup = dup.with_columns(pl.col("request_id") + "-new")
    res = ws.update({"request_arrival": pl.concat([dup, dup])}, {("aurelius.requests", 1): 205})
    assert (res.inserted, res.duplicates) == (5, 5)
    assert ws.positions()[("aurelius.requests", 1)] == 205


def test_failed_batch_rolls_back_records_and_positions():
    ws = WorldState.open(":memory:")
    good = syn.arrivals(T0, 10)
    bad = syn.telemetry(T0, 8).drop("hostname")  # key column missing
    with pytest.raises(ValueError, match="lacks key columns"):
        ws.update({"request_arrival": good, "gpu_telemetry": bad}, {("t", 0): 10})
    assert ws.count("request_arrival") == 0
    assert ws.positions() == {}


def test_fleet_events_drive_replica_state():
    ws = WorldState.open(":memory:")
    started = syn.fleet_events(T0, 3, kind="replica_started")
    ready = syn.fleet_events(T0 + timedelta(seconds=90), 2, kind="replica_ready")
    ws.update({"fleet_event": pl.concat([started, ready])})
    states = dict(ws.frame("SELECT replica_id, state FROM replicas").iter_rows())
    assert states == {"r-000": "warm", "r-001": "warm", "r-002": "loading"}
    fp8 = syn.fleet_events(T0 + timedelta(seconds=200), 1, kind="replica_reconfigured", precision="fp8")
    ws.update({"fleet_event": fp8})
    assert ws.frame("SELECT state FROM replicas WHERE replica_id = 'r-000'")["state"][0] == "loading"


def test_kv_cache_dtype_reaches_the_replicas_and_the_snapshot():
    """A pool whose replicas report an fp8 KV cache snapshots as kv_dtype "fp8"; events without the field (recorded
    before it) as not reported (None); a reconfiguration that changes only the KV dtype restarts the engine
    (loading)."""
    ws = WorldState.open(":memory:")
    ws.update({"fleet_event": syn.fleet_events(T0, 2, precision="fp8", kv_cache_dtype="fp8")})
    old = syn.fleet_events(T0, 1, model="llama-3.1-8b", tp=1).drop("kv_cache_dtype")
    ws.update({"fleet_event": old.with_columns(pl.lit("r-100").alias("replica_id"))})
    assert dict(ws.frame("SELECT replica_id, kv_cache_dtype FROM replicas").iter_rows()) == {
        "r-000": "fp8", "r-001": "fp8", "r-100": None}
    snap = snapshot(ws, T0 + timedelta(minutes=1))
    assert snap.pool(("PJM-1", "llama-3.1-70b", "H100")).kv_dtype == "fp8"
    assert snap.pool(("PJM-1", "llama-3.1-8b", "H100")).kv_dtype is None
    back = syn.fleet_events(T0 + timedelta(minutes=2), 1, kind="replica_reconfigured", precision="fp8")
    ws.update({"fleet_event": back})
    row = ws.frame("SELECT state, kv_cache_dtype FROM replicas WHERE replica_id = 'r-000'").row(0)
    assert row == ("loading", "auto")


def test_an_event_that_does_not_report_the_kv_dtype_keeps_the_replicas():
    """A replica started with an fp8 KV cache, then reconfigured by an event that reports only the clock (no
    dtype): its engine did not restart, it stays warm at fp8; a replica whose events never report one has none
    (None), and its first report is no restart either."""
    ws = WorldState.open(":memory:")
    ws.update({"fleet_event": syn.fleet_events(T0, 2, precision="fp8", kv_cache_dtype="fp8")})
    clock = syn.fleet_events(T0 + timedelta(minutes=2), 1, kind="replica_reconfigured", precision="fp8",
                             sm_clock_mhz=1500.0)
    ws.update({"fleet_event": clock.with_columns(pl.lit(None, pl.String).alias("kv_cache_dtype"))})
    silent = syn.fleet_events(T0, 1, model="llama-3.1-8b", tp=1).with_columns(
        pl.lit("r-100").alias("replica_id"), pl.lit(None, pl.String).alias("kv_cache_dtype"))
    ws.update({"fleet_event": silent})
    rows = {r[0]: r[1:] for r in ws.frame("SELECT replica_id, state, kv_cache_dtype, sm_clock_mhz FROM replicas")
            .iter_rows()}  # fmt: skip
    assert rows == {"r-000": ("warm", "fp8", 1500), "r-001": ("warm", "fp8", 1980), "r-100": ("warm", None, 1980)}
    assert snapshot(ws, T0 + timedelta(minutes=3)).pool(("PJM-1", "llama-3.1-70b", "H100")).kv_dtype == "fp8"
    first = syn.fleet_events(T0 + timedelta(minutes=4), 1, model="llama-3.1-8b", tp=1, kind="replica_reconfigured",
                             kv_cache_dtype="fp8")
    ws.update({"fleet_event": first.with_columns(pl.lit("r-100").alias("replica_id"))})
    assert ws.frame("SELECT state, kv_cache_dtype FROM replicas WHERE replica_id = 'r-100'").row(0) == ("warm", "fp8")


def test_migrating_a_v3_file_adds_the_kv_cache_dtype(tmp_path):
    path = tmp_path / "v3.duckdb"
    con = duckdb.connect(str(path))
    assert migrate(con, target=3) == 3
    ev = syn.fleet_events(T0, 2).drop("kv_cache_dtype")
    con.register("e", ev.to_arrow())
    con.execute("INSERT INTO fleet_event BY NAME SELECT * FROM e").fetchall()
    con.close()
    ws = WorldState.open(path)
    ws.update({"fleet_event": syn.fleet_events(T0, 1, precision="fp8", kv_cache_dtype="fp8").with_columns(
        pl.lit("r-009").alias("replica_id"))})
    kv = dict(ws.frame("SELECT replica_id, kv_cache_dtype FROM replicas").iter_rows())
    assert kv == {"r-000": None, "r-001": None, "r-009": "fp8"}  # v3 events: not reported


def test_migrating_a_v1_file_keeps_its_data(tmp_path):
    path = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(path))
    assert migrate(con, target=1) == 1
    arr = syn.arrivals(T0, 7)
    con.register("a", arr.to_arrow())
    con.execute("INSERT INTO request_arrival BY NAME SELECT * FROM a").fetchall()
    con.execute("INSERT INTO consumer_positions VALUES ('aurelius.requests', 0, 7)").fetchall()
    con.close()
    ws = WorldState.open(path)
    assert ws.version == CURRENT_VERSION == 4
    assert ws.count("request_arrival") == 7
    assert ws.positions() == {("aurelius.requests", 0): 7}
    assert "calibration_state" in ws.tables() and "replicas" in ws.tables()
    ws.close()
    # reopening is a no-op
    ws = WorldState.open(path)
    assert schema_version(ws.con) == CURRENT_VERSION
    assert ws.frame("SELECT count(*) AS n FROM schema_version")["n"][0] == CURRENT_VERSION


def test_snapshot_sees_only_what_arrived_by_as_of():
    ws = WorldState.open(":memory:")
    arr = syn.arrivals(T0, 100, rate_per_s=1.0)  # one request per second on average
    comp = syn.completions(arr.head(30), ttft_s=0.2, tpot_s=0.01)
    late = arr.tail(10).with_columns(pl.col("arrived_at").dt.offset_by("1h"))  # delivered an hour late
    ws.update(
        {
            "request_arrival": pl.concat([arr.head(90), late]),
            "request_completion": comp,
            "fleet_event": syn.fleet_events(T0 - timedelta(minutes=1), 2),
        }
    )
    as_of = T0 + timedelta(hours=2)
    arrived = arr.head(90).filter(pl.col("event_at") <= as_of).height
    done = comp.filter(pl.col("arrived_at") <= as_of).height
    snap = snapshot(ws, as_of)
    assert snap.queue("chat").outstanding == 100 - done
    early = snapshot(ws, T0 + timedelta(minutes=30))
    assert early.queue("chat").outstanding == arrived - done
    assert snap.pool(("PJM-1", "llama-3.1-70b", "H100")).warm == 2
    assert snap.prefix_hit_rate == {}  # no completion in the last 15 min
    recent = snapshot(ws, T0 + timedelta(minutes=10))
    assert recent.prefix_hit_rate["llama-3.1-70b"] == pytest.approx(0.25, abs=0.01)


def test_aggregates_per_period():
    ws = WorldState.open(":memory:")
    ws.update(_batch())
    ws.aggregate_period(T0, T0 + timedelta(minutes=5))
    ws.aggregate_period(T0, T0 + timedelta(minutes=5))  # recomputing replaces, never duplicates
    row = ws.frame("SELECT * FROM period_class WHERE request_class = 'chat'").row(0, named=True)
    assert row["arrivals"] == 200 and row["completions"] > 0 and row["violations"] == 0
    power = ws.frame("SELECT * FROM period_power")
    assert power.height == 1 and power["power_mean_w"][0] > 0


def test_committed_batches_survive_without_a_checkpoint(tmp_path):
    """The state checkpoints rarely (CHECKPOINT_THRESHOLD, off the decision path); a batch that only reached the
    WAL is still there when a copy of the files taken mid-run (as after a crash) is opened."""
    path = tmp_path / "live.duckdb"
    ws = WorldState.open(path)
    setting = ws.frame("SELECT current_setting('checkpoint_threshold') AS v")["v"][0]
    ref = duckdb.connect()
    ref.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    assert setting == ref.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0] != "16.0 MiB"
    ws.update(_batch())
    wal = path.with_name(path.name + ".wal")
    assert wal.exists() and wal.stat().st_size > 0  # the batch sits in the WAL, not yet checkpointed
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(path.read_bytes())
    copy.with_name(copy.name + ".wal").write_bytes(wal.read_bytes())
    ws.close()
    again = WorldState.open(copy)
    assert again.count("request_arrival") == 200 and again.count("request_completion") == 120
    again.close()
