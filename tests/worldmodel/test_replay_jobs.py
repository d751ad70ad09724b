"""`aurelius replay --jobs 2` (lead-in, tuning and replay tasks spread over worker processes) writes the same
figures as one process running the jobs in order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compare_results import differences  # noqa: E402

pytestmark = pytest.mark.slow  # two `aurelius replay` subprocesses


def _replay(out: Path, jobs: int) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "streams.cli", "replay", "--markets", "PJM,ERCOT", "--periods", "1",
           "--policies", "production,production-tuned,naive", "--out", str(out), "--jobs", str(jobs)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), proc.stderr


def test_workers_write_the_same_figures_as_one_process(tmp_path: Path) -> None:
    one, _ = _replay(tmp_path / "one", 1)
    two, err = _replay(tmp_path / "two", 2)
    diffs = [d for d in differences(one, two) if d[0] not in ("/config/jobs", "/config/out")]
    assert diffs == []
    assert list(two["markets"]) == ["PJM", "ERCOT"]
    assert "production_tuned" in two["markets"]["ERCOT"]["window"]
    # one progress bar: the workers print no bars of their own, and each warning once
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    assert not any("period/s" in ln or " period" in ln.split("|")[0] for ln in lines)
    warnings = [ln for ln in lines if "missing hours" in ln]
    assert len(warnings) == len(set(warnings))
