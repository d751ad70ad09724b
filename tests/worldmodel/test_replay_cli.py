"""`aurelius replay` end to end on a tiny window: results.json contract, replay.duckdb tables, observations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ("production", "naive")
HEADLINE = (
    "offered",
    "completed",
    "sla_met",
    "sla_violation_rate",
    "unfinished",
    "gp_per_dollar",
    "tokens_sla_met_per_dollar",
    "cost_usd",
    "cost_usd_owned",
    "gp_per_dollar_owned",
    "energy_mwh",
    "energy_share",
    "gpu_hours",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "classes",
)
CLASS_KEYS = ("offered", "completed", "sla_met", "unfinished", "sla_violation_rate")

pytestmark = pytest.mark.slow  # the module fixture runs `aurelius replay` in a subprocess


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("replay")
    cmd = [sys.executable, "-m", "streams.cli", "replay", "--markets", "PJM", "--periods", "2",
           "--policies", ",".join(POLICIES), "--out", str(d), "--no-progress", "--emit-observations"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (d / "stdout.txt").write_text(proc.stdout)
    return d


@pytest.fixture(scope="module")
def results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def test_results_json_contract(results: dict[str, Any]) -> None:
    assert results["provenance"]
    market = results["markets"]["PJM"]
    w = market["window"]
    assert {"start", "end", "mean_price_usd_mwh"} <= set(w)
    assert w["start"] < w["end"] and isinstance(w["mean_price_usd_mwh"], float)
    assert set(POLICIES) <= set(market["policies"])
    for name in POLICIES:
        p = market["policies"][name]
        missing = [k for k in HEADLINE if k not in p]
        assert not missing, (name, missing)
        assert p["offered"] > 0 and p["offered"] == p["completed"] + p["unfinished"]
        assert 0 <= p["sla_met"] <= p["completed"]
        assert p["sla_violation_rate"] == pytest.approx((p["offered"] - p["sla_met"]) / p["offered"])
        assert p["cost_usd"] > 0 and p["cost_usd_owned"] > 0
        assert p["gp_per_dollar"] == pytest.approx(p["sla_met"] / p["cost_usd"])
        assert p["gp_per_dollar_owned"] == pytest.approx(p["sla_met"] / p["cost_usd_owned"])
        assert p["energy_mwh"] > 0 and p["gpu_hours"] > 0 and 0 < p["energy_share"] < 1
        assert set(p["classes"]) == {"code", "chat", "batch"}
        for c in p["classes"].values():
            assert all(k in c for k in CLASS_KEYS)
        assert sum(c["offered"] for c in p["classes"].values()) == p["offered"]
    # every policy is offered the same workload
    assert len({market["policies"][n]["offered"] for n in POLICIES}) == 1


def test_replay_duckdb_tables(out: Path, results: dict[str, Any]) -> None:
    con = duckdb.connect(str(out / "replay.duckdb"), read_only=True)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert {"periods", "classes", "requests"} <= tables
        for name in POLICIES:
            p = results["markets"]["PJM"]["policies"][name]
            n, met, unfinished, ids = con.execute(
                "SELECT count(*), sum(sla_met::INT), sum(unfinished::INT), count(DISTINCT request_id) "
                "FROM requests WHERE policy = ?",
                [name],
            ).fetchone()
            assert n == ids == p["offered"] and met == p["sla_met"] and unfinished == p["unfinished"]
            by_class = dict(con.execute("SELECT request_class, sum(offered) FROM classes WHERE policy = ? "
                                        "GROUP BY 1", [name]).fetchall())  # fmt: skip
            assert by_class == {k: v["offered"] for k, v in p["classes"].items()}
            arrivals = con.execute("SELECT sum(arrivals) FROM periods WHERE policy = ?", [name]).fetchone()[0]
            assert arrivals == p["offered"]
    finally:
        con.close()


def test_observations_written_as_parquet(out: Path, results: dict[str, Any]) -> None:
    for name in POLICIES:
        files = list((out / "observations").rglob(f"*{name}*/**/*.parquet")) or [
            f for f in (out / "observations").rglob("*.parquet") if f"/{name}/" in str(f)
        ]
        kinds = {f.stem for f in files}
        assert {"arrivals", "completions", "telemetry", "fleet_events"} <= kinds, (name, kinds)
        arrivals = pl.read_parquet(next(f for f in files if f.stem == "arrivals"))
        assert arrivals.height == results["markets"]["PJM"]["policies"][name]["offered"]
        assert not any("output" in c for c in arrivals.columns)  # output length is unknown at arrival
        comp = pl.read_parquet(next(f for f in files if f.stem == "completions"))
        assert comp.height == results["markets"]["PJM"]["policies"][name]["completed"]


def test_prints_a_table_per_market(out: Path) -> None:
    text = (out / "stdout.txt").read_text()
    assert "PJM" in text and all(name in text for name in POLICIES)
    assert "results.json" in text
