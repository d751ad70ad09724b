"""`aurelius audit sql` under its time and memory limits (issue 18, item 6): a runaway cross join is stopped at
the time limit, a memory-heavy query at the memory limit, each with a message naming the limit and its flag
and a non-zero exit code; an ordinary query is unaffected. The read-only protections are
tests/sinks/test_audit_store.py's."""

from __future__ import annotations

import time

import pytest

from sinks import sql
from sinks.audit_store import ParquetAuditStore
from streams.cli import build_parser, main

#: The audit log crossed with itself and two ranges of 1e6 rows: ~1e13 rows, hours of CPU, little memory.
CROSS_JOIN = ("SELECT count(*) AS n FROM audit AS x, audit AS y, range(1000000) AS a, range(1000000) AS b "
              "WHERE a.range + b.range < 0")
#: One list of 5e7 BIGINTs per audit row: ~400 MB, far over a 64 MB limit.
MEMORY_HEAVY = "SELECT decision_id, list(r.range) AS xs FROM audit, range(50000000) AS r GROUP BY decision_id"


@pytest.fixture
def audit_dir(tmp_path):
    store = ParquetAuditStore(tmp_path / "audit")
    for i in range(3):
        store.add({"decision_id": f"d{i}", "policy": "aurelius", "markets": ["PJM"], "period_index": i,
                   "period_start": "2023-07-01T12:00:00Z", "as_of": "2023-07-01T12:00:00Z",
                   "chosen_plan": {"label": f"plan {i}"}, "gates": [], "fallback": i == 0,
                   "fallback_reason": "missing inputs: no GPU telemetry has arrived" if i == 0 else None,
                   "regret": 0.0})
    store.flush()
    return tmp_path / "audit"


def test_a_cross_join_stops_at_the_time_limit(audit_dir):
    t0 = time.perf_counter()
    with pytest.raises(sql.QueryLimitError) as info:
        sql.query(CROSS_JOIN, audit_dir, timeout_s=1.5)
    elapsed = time.perf_counter() - t0
    assert str(info.value) == "query stopped: time limit of 1.5 s reached (--timeout-s)"
    assert 1.5 <= elapsed < 6.0, elapsed  # about the limit (2 shared cores: some slack to notice the interrupt)


def test_a_memory_heavy_query_stops_at_the_memory_limit(audit_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # DuckDB would spill to ./.tmp: the limit is a ceiling, nothing is written
    with pytest.raises(sql.QueryLimitError) as info:
        sql.query(MEMORY_HEAVY, audit_dir, timeout_s=60.0, memory_limit="64MB")
    assert str(info.value) == "query stopped: memory limit of 64MB reached (--memory-limit)"
    assert not (tmp_path / ".tmp").exists()


def test_an_ordinary_query_is_unaffected(audit_dir):
    df = sql.query("SELECT decision_id, fallback, fallback_reason FROM audit ORDER BY 1", audit_dir,
                   timeout_s=1.0, memory_limit="64MB", threads=1)
    assert df.rows() == [("d0", True, "missing inputs: no GPU telemetry has arrived"), ("d1", False, None),
                         ("d2", False, None)]
    work = sql.query("SELECT count(*) AS n, sum(r.range) AS s FROM audit, range(1000000) AS r", audit_dir,
                     timeout_s=5.0, memory_limit="64MB", threads=1)  # some real work, well inside the limits
    assert work.rows() == [(3_000_000, 3 * 999_999 * 1_000_000 // 2)]
    settings = sql.query("SELECT current_setting('threads') AS t, current_setting('memory_limit') AS m, "
                         "current_setting('temp_directory') AS tmp", audit_dir, memory_limit="64MB", threads=1)
    assert settings.rows() == [(1, "61.0 MiB", "")]  # 64 MB = 61.0 MiB; no spill directory


def test_cli_says_which_limit_and_exits_non_zero(audit_dir, capsys):
    base = ["audit", "sql", "--audit-dir", str(audit_dir)]
    assert main([*base, CROSS_JOIN, "--timeout-s", "1"]) == 3
    assert capsys.readouterr().err.strip() == (
        "aurelius audit sql: query stopped: time limit of 1 s reached (--timeout-s)")
    assert main([*base, MEMORY_HEAVY, "--memory-limit", "64MB"]) == 3
    assert capsys.readouterr().err.strip() == (
        "aurelius audit sql: query stopped: memory limit of 64MB reached (--memory-limit)")
    assert main([*base, "SELECT count(*) AS n FROM audit", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "3"]
    assert main([*base, "SELECT 1", "--timeout-s", "0"]) == 2


def test_cli_defaults_are_the_library_defaults():
    args = build_parser().parse_args(["audit", "sql", "SELECT 1"])
    assert (args.timeout_s, args.memory_limit, args.threads) == (
        sql.DEFAULT_TIMEOUT_S, sql.DEFAULT_MEMORY_LIMIT, sql.DEFAULT_THREADS)
