"""`aurelius audit summary`: the canned questions over a synthesized audit log, as table and CSV."""

from __future__ import annotations

import csv

import pytest

from sinks import audit_summary
from sinks.audit_store import ParquetAuditStore
from streams.cli import main


def _plan(label: str, floor: int) -> dict:
    return {"label": label, "batch_admission": "pressure", "pools": [
        {"site": "s", "model": "llama-3.1-70b", "gpu": "H100", "replica_floor": floor, "replica_ceiling": 16,
         "tp": 4, "precision": "fp8", "kv_dtype": "fp8", "max_batch": 256, "sm_clock_mhz": 1500}]}


def _rec(i: int, policy: str = "aurelius", *, fallback: str | None = None, cost: float | None = -2.0,
         realized: float | None = None, replay: bool = True) -> dict:
    rec = {"decision_id": f"{policy}-{i}", "policy": policy, "markets": ["PJM"], "period_index": i,
           "period_start": f"2023-07-01T12:{5 * i:02d}:00Z", "as_of": f"2023-07-01T12:{5 * i:02d}:00Z",
           "fallback": fallback is not None, "fallback_reason": fallback,
           "chosen_plan": _plan("reference" if fallback else "cheaper", 8 if fallback else 6),
           "reference_plan": _plan("reference", 8),
           "predicted_delta": None if cost is None else {"cost_usd": 0.0 if fallback else cost,
                                                         "gp_per_dollar_rel": 0.0 if fallback else 0.10},
           "regret": 0.0, "realized": None if realized is None else {"regret": realized}}
    if realized is not None and fallback is not None:  # the refused candidate, branched (streams/replay/hindsight.py)
        rec["realized"]["refused"] = {"gain": 0.02 * i, "value_gap": 5.0 * i - 12.0, "within_sla": i != 4}
    if replay:
        rec["live_decision_id"] = f"live-{i}"
    return rec


def _log(path, records):
    store = ParquetAuditStore(path)
    for r in records:
        store.add(r)
    store.flush()
    return path


@pytest.fixture
def replay_log(tmp_path):
    recs = [_rec(0, fallback="start: no fleet observation yet"),
            _rec(1, realized=0.01), _rec(2, realized=0.03),
            _rec(3, fallback="pareto: gp/$ 10 <= reference 10 x 1.03", realized=0.0),
            _rec(4, fallback="pareto: gp/$ 11 <= reference 11 x 1.03", realized=0.05),
            _rec(5, fallback="no candidate passed the hard gates (best: sla: code 2% > budget 1%)"),
            _rec(0, "production", cost=None)]
    return _log(tmp_path / "audit", recs)


def test_summary_answers(replay_log):
    s = audit_summary.summarize(replay_log)
    dec = {r["policy"]: r for r in s.decisions.iter_rows(named=True)}
    assert dec["aurelius"]["decisions"] == 6 and dec["aurelius"]["fallbacks"] == 4
    assert dec["production"]["fallbacks"] == 0
    kinds = {r["reason_kind"]: r["fallbacks"] for r in s.fallback_kinds.iter_rows(named=True)}
    assert kinds == {"pareto": 2, "start": 1, "no candidate passed the hard gates": 1}
    sav = {r["policy"]: r for r in s.savings.iter_rows(named=True)}
    assert sav["aurelius"]["predicted_savings_usd"] == pytest.approx(4.0)  # two non-fallback decisions x $2
    assert sav["aurelius"]["decisions_with_reference"] == 6 and sav["production"]["decisions_with_reference"] == 0
    reg = {r["policy"]: r for r in s.regret.iter_rows(named=True)}
    assert reg["aurelius"]["decisions_measured"] == 4
    assert reg["aurelius"]["realized_regret_mean"] == pytest.approx(0.09 / 4, abs=1e-5)
    assert reg["aurelius"]["realized_regret_max"] == pytest.approx(0.05)
    assert reg["aurelius"]["decisions_measured_fallback"] == 2  # periods 3 and 4 fell back; 1 and 2 did not
    assert reg["aurelius"]["realized_regret_mean_fallback"] == pytest.approx(0.025)
    assert reg["aurelius"]["realized_regret_mean_planned"] == pytest.approx(0.02)
    # the refused candidates of periods 3 (gap 3, within SLA) and 4 (gap 8, over an SLA): gains 0.06 and 0.08
    assert reg["aurelius"]["refused_measured"] == 2
    assert reg["aurelius"]["refused_realized_gain_mean"] == pytest.approx(0.07)
    assert reg["aurelius"]["refused_better_within_sla"] == 1
    top = [r for r in s.plans.iter_rows(named=True) if r["policy"] == "aurelius"]
    assert [(r["label"], r["chosen"]) for r in top] == [("reference", 4), ("cheaper", 2)]
    assert "llama-3.1-70b/H100 8..16x4 fp8/fp8 b256 1500MHz" in top[0]["plan"]
    text = audit_summary.render(s)
    assert "PREDICTED, not measured" in text and "a live worker can only predict savings" in text


def test_live_log_says_savings_are_predicted_and_regret_unmeasured(tmp_path, capsys):
    log = _log(tmp_path / "live", [_rec(i, replay=False) for i in range(3)])
    csv_path = tmp_path / "summary.csv"
    assert main(["audit", "summary", "--audit-dir", str(log), "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "a live worker can only predict savings" in out and "a live worker cannot measure it" in out
    rows = list(csv.DictReader(csv_path.open()))
    assert set(rows[0]) == {"question", "policy", "item", "value", "unit", "note"}
    by = {(r["question"], r["item"]): r for r in rows}
    assert float(by[("predicted_savings", "cost_usd")]["value"]) == pytest.approx(6.0)
    assert "predict" in by[("predicted_savings", "cost_usd")]["note"]
    assert by[("realized_regret", "decisions_measured")]["value"] == "0"
    assert by[("decisions", "from_replay")]["value"] == "0"
    assert {r["question"] for r in rows} == {"decisions", "predicted_savings", "realized_regret", "top_plans"}


def test_summary_cli_errors_and_empty_log(tmp_path, capsys):
    assert main(["audit", "summary", "--audit-dir", str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["audit", "summary", "--audit-dir", str(tmp_path / "empty")]) == 0
    assert "(none)" in capsys.readouterr().out
