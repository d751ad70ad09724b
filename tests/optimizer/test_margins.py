"""Per-lever Pareto margins (optimizer/margins.py): read from their recorded measurement, applied per candidate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from optimizer.aurelius import AureliusPolicy
from optimizer.margins import (
    MARGINS_FILE,
    QUANTILE,
    RELEASE_AFTER_HOLD,
    LeverMargins,
    families_moved,
    family,
    load_margins,
    margins_from_rows,
)
from schemas.plan import BatchAdmission
from tests.optimizer.test_gates import H100_70B, REF, set_pool

ROOT = Path(__file__).resolve().parents[2]


def test_margins_are_the_recorded_measurement() -> None:
    """optimizer/lever_margins.json holds, per scorer kind, the QUANTILE of predicted minus realized differences
    of the recorded benchmarks/lever_error.py files it names (the spread, and the releases after a held hour),
    per family and per spread plan."""
    data = json.loads(MARGINS_FILE.read_text())
    assert data["quantile"] == QUANTILE
    for kind in ("horizon", "one_period"):
        recs = [json.loads((ROOT / path).read_text()) for path in data[kind]["source"].split("+")]
        assert "+".join(r["commit"] for r in recs) == data[kind]["commit"]
        assert {r["config"]["arm"] for r in recs} == {data[kind]["arm"]}
        rows = [row for r in recs for row in r["rows"]]
        assert len(rows) >= 3 * 16 * 10 and set(RELEASE_AFTER_HOLD) <= {r["lever"] for r in rows}
        assert data[kind]["margins"] == margins_from_rows(rows)
        assert data[kind]["by_label"] == margins_from_rows(rows, "lever")
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


def test_a_label_margin_applies_only_in_the_direction_it_was_measured() -> None:
    """admit-batch was measured against a reference that admits under pressure; the same plan against a reference
    that holds is a release, and clears the release family's margin, not admit-batch's."""
    m = LeverMargins({"deferral": 0.47, "release": 0.3}, {"admit-batch": 0.0}, "test")
    admit = replace(REF, batch_admission=BatchAdmission.IMMEDIATE, label="spread: admit-batch")
    held = replace(REF, batch_admission=BatchAdmission.HOLD)
    assert m.of(admit, replace(REF, batch_admission=BatchAdmission.PRESSURE)) == 0.0
    assert m.of(admit, held) == 0.3


def test_a_release_clears_at_least_the_measured_release_of_a_held_hour() -> None:
    """The release family's quantile pools the reversed one-period holds with the releases of a held hour; a
    release clears no less than the latter's own margin for the admission it releases to."""
    m = LeverMargins({"release": 0.0, "clock": 0.02},
                     {"release-after-hold": 0.0125, "release-after-hold-pressure": 0.09}, "test")
    held = replace(REF, batch_admission=BatchAdmission.HOLD)
    assert m.of(replace(REF, batch_admission=BatchAdmission.IMMEDIATE, label="spread: admit-batch"), held) == 0.0125
    assert m.of(replace(REF, batch_admission=BatchAdmission.PRESSURE), held) == 0.09
    clocked = set_pool(replace(REF, batch_admission=BatchAdmission.IMMEDIATE), H100_70B, sm_clock_mhz=1500)
    assert m.of(clocked, held) == 0.02
    assert m.of(held, REF) == 0.02  # a hold is no release: the largest family margin (deferral unmeasured here)


def test_rows_that_moved_nothing_are_no_sample_of_a_levers_error() -> None:
    """A lever that was a no-op in a measured hour (predicted and realized differences 0) neither lowers its
    family's quantile nor gives its label a margin; the releases of a held hour join the release family."""
    rows = [{"lever": "ceiling-live", "predicted": 0.0, "realized": 0.0}] * 4
    rows += [{"lever": "scale-out-25", "predicted": 0.5, "realized": 0.25}, {"lever": "admit-batch", "predicted": 0.0,
             "realized": 0.0}]  # fmt: skip
    assert margins_from_rows(rows, quantile=0.5) == {"capacity": 0.25}
    assert "admit-batch" not in margins_from_rows(rows, "lever")
    assert {family(label) for label in RELEASE_AFTER_HOLD} == {"release"}
    after = [{"lever": "release-after-hold", "predicted": 0.25, "realized": -0.5}]
    assert margins_from_rows(after, quantile=1.0) == {"release": 0.75}
