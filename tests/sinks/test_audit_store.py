"""The Parquet audit store, the in-memory sink and the read-only SQL entry point (no broker needed)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from sinks import sql
from sinks.audit_store import FILE_GLOB, ParquetAuditStore
from sinks.base import SinkBackpressureError
from sinks.memory import MemorySink
from streams.cli import main


def _rec(i: int) -> dict:
    return {"decision_id": f"d{i}", "policy": "production", "markets": ["PJM"], "period_index": i,
            "period_start": "2023-07-01T12:00:00Z", "as_of": "2023-07-01T12:00:00Z",
            "chosen_plan": {"label": f"plan {i}"}, "gates": [{"name": "sla", "passed": True, "reason": "ok"}],
            "fallback": False, "fallback_reason": None, "regret": 0.0}


def test_store_is_idempotent_across_flushes_and_reopen(tmp_path):
    store = ParquetAuditStore(tmp_path)
    assert [store.add(_rec(i), offset=i) for i in (0, 1, 1)] == [True, True, False]
    assert store.flush() == 2 and store.flush() == 0
    again = ParquetAuditStore(tmp_path)  # a restarted sink re-reads the ids on disk
    assert again.add(_rec(1)) is False and again.add(_rec(2)) is True
    again.flush()
    files = sorted(tmp_path.glob(FILE_GLOB))
    assert len(files) == 2 and not list(tmp_path.glob(".*"))  # no temporary file left behind
    raw = [i for f in files for i in pq.read_table(f).column("decision_id").to_pylist()]
    assert sorted(raw) == ["d0", "d1", "d2"]


def test_backpressure_is_a_typed_error(tmp_path):
    store = ParquetAuditStore(tmp_path, max_pending=2, retry_after_s=0.25)
    store.add(_rec(0))
    store.add(_rec(1))
    with pytest.raises(SinkBackpressureError) as info:
        store.add(_rec(2))
    assert info.value.retry_after_s == 0.25 and info.value.pending == 2
    store.flush()
    assert store.add(_rec(2))


def test_memory_sink_is_list_like():
    sink = MemorySink()
    sink.add(_rec(0))
    sink.add(_rec(0))
    sink.flush()
    assert len(sink) == 1 and sink[0]["decision_id"] == "d0" and [r["period_index"] for r in sink] == [0]


def test_sql_reads_dedupes_and_queries_json(tmp_path):
    s = ParquetAuditStore(tmp_path)
    s.add(_rec(0))
    s.add(_rec(1))
    s.flush()
    # a duplicate row written behind the store's back (e.g. two writers): the view keeps one
    t = ParquetAuditStore(tmp_path / "other")
    t.add(_rec(1))
    t.flush()
    for f in (tmp_path / "other").glob(FILE_GLOB):
        f.rename(tmp_path / f"audit-zz-{f.name}")
    df = sql.query("SELECT decision_id, market, json_extract_string(chosen_plan, '$.label') AS label "
                   "FROM audit ORDER BY 1", tmp_path)
    assert df.rows() == [("d0", "PJM", "plan 0"), ("d1", "PJM", "plan 1")]


def test_sql_on_empty_directory(tmp_path):
    assert sql.query("SELECT count(*) AS n FROM audit", tmp_path).item() == 0


@pytest.mark.parametrize("statement", [
    "INSERT INTO audit (decision_id) VALUES ('x')", "UPDATE audit SET policy = 'x'", "DELETE FROM audit",
    "CREATE TABLE t AS SELECT 1", "COPY audit TO 'out.csv'", "ATTACH 'x.duckdb'", "INSTALL httpfs",
    "LOAD httpfs", "PRAGMA version", "SET threads = 1", "EXPORT DATABASE 'x'", "DROP VIEW audit",
    "SELECT 1; DELETE FROM audit",
])
def test_sql_refuses_writes(tmp_path, statement):
    with pytest.raises(sql.ReadOnlyError, match="read-only|one SELECT"):
        sql.query(statement, tmp_path)


def test_sql_cannot_read_outside_the_audit_dir(tmp_path):
    (tmp_path / "secret.csv").write_text("a\n1\n")
    (tmp_path / "audit").mkdir()
    with pytest.raises(Exception, match="disabled|Permission"):
        sql.query(f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')", tmp_path / "audit")


def test_cli_formats_and_refusal(tmp_path, capsys):
    s = ParquetAuditStore(tmp_path)
    s.add(_rec(0))
    s.flush()
    assert main(["audit", "sql", "SELECT decision_id FROM audit", "--audit-dir", str(tmp_path)]) == 0
    assert "d0" in capsys.readouterr().out
    assert main(["audit", "sql", "SELECT decision_id FROM audit", "--audit-dir", str(tmp_path),
                 "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["decision_id", "d0"]
    out = tmp_path / "x.parquet"
    assert main(["audit", "sql", "SELECT * FROM audit", "--audit-dir", str(tmp_path), "--format", "parquet",
                 "--output", str(out)]) == 0
    assert pq.read_table(out).num_rows == 1
    assert main(["audit", "sql", "DELETE FROM audit", "--audit-dir", str(tmp_path)]) == 2
    assert "read-only" in capsys.readouterr().err
