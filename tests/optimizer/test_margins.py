"""Per-lever Pareto margins (optimizer/margins.py): read from their recorded measurement, applied per candidate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from optimizer.aurelius import AureliusPolicy
from optimizer.margins import MARGINS_FILE, QUANTILE, LeverMargins, families_moved, load_margins, margins_from_rows
from schemas.plan import BatchAdmission
from tests.optimizer.test_gates import H100_70B, REF, set_pool

ROOT = Path(__file__).resolve().parents[2]


def test_margins_are_the_recorded_measurement() -> None:
    """optimizer/lever_margins.json holds, per scorer kind, the QUANTILE of predicted minus realized differences
    of the recorded benchmarks/lever_error.py file it names, per family and per spread plan."""
    data = json.loads(MARGINS_FILE.read_text())
    assert data["quantile"] == QUANTILE
    for kind in ("horizon", "one_period"):
        rec = json.loads((ROOT / data[kind]["source"]).read_text())
        assert rec["commit"] == data[kind]["commit"] and len(rec["rows"]) >= 3 * 16 * 10
        assert data[kind]["margins"] == margins_from_rows(rec["rows"])
        assert data[kind]["by_label"] == margins_from_rows(rec["rows"], "lever")
        assert load_margins(kind).by_family == data[kind]["margins"]
    assert AureliusPolicy().margins.source == data["one_period"]["source"]


def test_a_candidate_clears_the_margin_of_the_levers_it_moves() -> None:
    m = LeverMargins({"capacity": 0.1, "clock": 0.02}, {"ceiling-live": 0.03}, "test")
    clock = set_pool(REF, H100_70B, sm_clock_mhz=1500)
    both = set_pool(clock, H100_70B, replica_ceiling=2)
    assert families_moved(clock, REF) == {"clock"} and m.of(clock, REF) == 0.02
    assert m.of(both, REF) == 0.1  # the largest of the families moved
    assert m.of(replace(both, label="spread: ceiling-live"), REF) == 0.03  # a spread plan's own measurement
    held = replace(REF, batch_admission=BatchAdmission.HOLD)
    assert m.of(held, REF) == 0.1  # an unmeasured family: the largest measured margin


def test_a_release_clears_the_release_margin_not_the_holds() -> None:
    """Admitting batch work that the reference holds is the hold's reverse move, with its own margin; holding
    against a reference that admits keeps the hold's."""
    m = LeverMargins({"deferral": 0.47, "release": 0.01, "clock": 0.02}, {}, "test")
    held = replace(REF, batch_admission=BatchAdmission.HOLD)
    assert m.of(held, REF) == 0.47 and m.of(REF, held) == 0.01
    clocked = set_pool(REF, H100_70B, sm_clock_mhz=1500)
    assert m.of(clocked, held) == 0.02  # a release with the clock moved: the larger of the two


def test_the_release_margin_is_the_holds_measurement_read_the_other_way() -> None:
    """The recorded holds imply the releases' errors: where the model under-predicts what a hold loses it
    under-predicts what the release gains, so the release margin is below the hold's."""
    rows = [{"lever": "defer-batch", "predicted": -0.1, "realized": q} for q in (-0.6, -0.5, -0.4, 0.05, -0.3)]
    got = margins_from_rows(rows, quantile=1.0)
    assert got["release"] < got["deferral"] == 0.5
    inv = sorted((1 / 0.9 - 1) - (1 / (1 + q) - 1) for q in (-0.6, -0.5, -0.4, 0.05, -0.3))
    assert abs(got["release"] - max(inv[-1], 0.0)) < 1e-12
