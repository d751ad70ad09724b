"""Per-lever Pareto margins, read from their recorded measurement.

A candidate that moves levers away from the reference plan must be predicted better than the reference by more
than the largest margin among the lever families it moves. A family's margin is the QUANTILE of the forward
model's error on plan differences (predicted minus realized gp/$ difference against the reference plan) for the
family's spread plans (optimizer/lever_spread.py), measured on ground-truth branches one week before each default
window (benchmarks/lever_error.py, recorded in benchmarks/results/lever_error_*.json, written here by its
`--write-margins`): a candidate clears it only when, had its error been drawn from that measurement, its
realized gain would have been positive at least QUANTILE of the time. The scorer with a horizon and the one
scoring one period have their own measurements (`kind`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from schemas.plan import Plan

#: the recorded margins (written by benchmarks/lever_error.py --write-margins)
MARGINS_FILE = Path(__file__).with_name("lever_margins.json")
#: the error quantile a family's margin is (0-1)
QUANTILE = 0.8
#: lever families by spread label (optimizer/lever_spread.py); a label's family is the first whose prefix matches
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("capacity", ("hold-fleet", "scale-out", "ceiling", "static-live")),
    ("target", ("target",)),
    ("batch", ("batch",)),
    ("precision", ("fp8",)),
    ("clock", ("clock",)),
    ("deferral", ("defer-batch", "admit-batch")),
    ("tokens", ("tokens",)),
)


def family(label: str) -> str | None:
    """The lever family of a spread label.

    >>> family("scale-out-25"), family("clock-0.85"), family("fp8-kv-fp8"), family("ref:production")
    ('capacity', 'clock', 'precision', None)
    """
    for name, prefixes in FAMILIES:
        if label.startswith(prefixes):
            return name
    return None


def families_moved(plan: Plan, reference: Plan) -> frozenset[str]:
    """The lever families in which `plan` differs from `reference` (pools compared by key)."""
    moved: set[str] = set()
    if plan.batch_admission != reference.batch_admission:
        moved.add("deferral")
    if plan.autoscale_target != reference.autoscale_target:
        moved.add("target")
    if plan.autoscale != reference.autoscale:
        moved.add("capacity")
    ref = {p.key: p for p in reference.pools}
    for p in plan.pools:
        q = ref.get(p.key)
        if q is None:
            moved.add("capacity")
            continue
        if (p.replica_floor, p.replica_ceiling) != (q.replica_floor, q.replica_ceiling):
            moved.add("capacity")
        if p.max_batch != q.max_batch:
            moved.add("batch")
        if (p.precision, p.kv_dtype) != (q.precision, q.kv_dtype):
            moved.add("precision")
        if p.sm_clock_mhz != q.sm_clock_mhz:
            moved.add("clock")
        if p.max_num_batched_tokens != q.max_num_batched_tokens:
            moved.add("tokens")
    if {p.key for p in plan.pools} != set(ref):
        moved.add("capacity")
    return frozenset(moved)


@dataclass(frozen=True)
class LeverMargins:
    """Margins (ratio of gp/$) per spread plan (its label) and per lever family, and their source."""

    by_family: Mapping[str, float]
    by_label: Mapping[str, float]
    source: str

    def of(self, plan: Plan, reference: Plan) -> float:
        """The margin `plan` must clear against `reference` (ratio): a spread plan's own measured margin
        (label "<who>: <name>"); else the largest of the families it moves (an unmeasured family: the largest
        measured margin); 0 for a plan moving nothing."""
        moved = families_moved(plan, reference)
        if not moved:
            return 0.0
        name = plan.label.split(": ", 1)[-1]
        if name in self.by_label:
            return self.by_label[name]
        worst = max(self.by_family.values(), default=0.0)
        return max(self.by_family.get(f, worst) for f in moved)


def margins_from_rows(rows: list[Mapping[str, object]], key: str = "family",
                      quantile: float = QUANTILE) -> dict[str, float]:
    """Per family (key "family") or spread label (key "lever"), the `quantile` of predicted minus realized
    difference over the measured rows (ratio, >= 0).

    >>> rows = [{"lever": "clock-0.85", "predicted": 0.02, "realized": 0.01},
    ...         {"lever": "clock-0.7", "predicted": 0.0, "realized": 0.05}]
    >>> margins_from_rows(rows, quantile=1.0), margins_from_rows(rows, "lever", quantile=1.0)
    ({'clock': 0.01}, {'clock-0.7': 0.0, 'clock-0.85': 0.01})
    """
    errs: dict[str, list[float]] = {}
    for r in rows:
        name = family(str(r["lever"])) if key == "family" else str(r["lever"])
        if name is not None:
            errs.setdefault(name, []).append(float(r["predicted"]) - float(r["realized"]))  # type: ignore[arg-type]
    out = {}
    for name, e in errs.items():
        e.sort()
        pos = quantile * (len(e) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(e) - 1)
        out[name] = max(e[lo] + (e[hi] - e[lo]) * (pos - lo), 0.0)  # numpy's "linear" quantile
    return dict(sorted(out.items()))


def load_margins(kind: str, path: Path = MARGINS_FILE) -> LeverMargins:
    """The recorded margins of `kind` ("horizon" or "one_period")."""
    data = json.loads(path.read_text())
    entry = data[kind]
    return LeverMargins(dict(entry["margins"]), dict(entry["by_label"]), str(entry["source"]))
