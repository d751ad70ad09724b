"""SIGKILL during ingestion or decisions loses, duplicates and changes no audit row (benchmarks/sigkill_trials.py;
its full run is 20 trials, here 2 small ones)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_killed_and_restarted_workers_keep_one_audit_row_per_decision(tmp_path):
    out = tmp_path / "trials.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sigkill_trials.py"), "--trials", "2",
                          "--records", "600", "--periods", "8", "--seed", "3", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    trials = json.loads(out.read_text())["trials"]
    assert len(trials) == 2
    for t in trials:
        assert (t["lost"], t["duplicated"], t["differing"], t["topic_missing"]) == (0, 0, 0, 0), t
