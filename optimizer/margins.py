"""Per-lever Pareto margins, read from their recorded measurement.

A candidate that moves levers away from the reference plan must be predicted better than the reference by more
than the largest margin among the lever families it moves. A family's margin is the QUANTILE of the forward
model's error on plan differences (predicted minus realized gp/$ difference against the reference plan) for the
family's spread plans (optimizer/lever_spread.py), measured on ground-truth branches one week before each default
window (benchmarks/lever_error.py, recorded in benchmarks/results/lever_error_*.json, written here by its
`--write-margins`): a candidate clears it only when, had its error been drawn from that measurement, its
realized gain would have been positive at least QUANTILE of the time. The scorer with a horizon and the one
scoring one period have their own measurements (`kind`).

Deferral has a direction. The spread's move holds batch work against a reference that admits it; a release is the
reverse move (a candidate that admits what the reference holds), and its error is the error of the same pair of
branches read the other way (`with_releases`): the model that under-predicts what a hold loses under-predicts what
a release gains, so the hold's margin does not apply to it. A one-period hold is a small backlog; the release of a
long one is measured on its own, on a trunk that has held batch work all hour (lever_error.py `--trunk hold`,
labels RELEASE_AFTER_HOLD), and joins the release family.

A row whose plan moved nothing (predicted and realized differences both 0: the lever was a no-op that hour, e.g.
admitting at once what no pressure held) is no sample of the move's error and is left out (`_moved`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from schemas.plan import BatchAdmission, Plan

#: the recorded margins (written by benchmarks/lever_error.py --write-margins)
MARGINS_FILE = Path(__file__).with_name("lever_margins.json")
#: the error quantile a family's margin is (0-1)
QUANTILE = 0.8
#: the spread plan that holds batch work, and the name of its reverse move (admit what a reference holds)
HOLD, RELEASE = "defer-batch", "release-batch"
#: the measured releases of a long hold (lever_error.py --trunk hold): label -> the admission it releases to
RELEASE_AFTER_HOLD: dict[str, BatchAdmission] = {
    "release-after-hold": BatchAdmission.IMMEDIATE,
    "release-after-hold-pressure": BatchAdmission.PRESSURE,
}
_RELEASED_TO = {a: label for label, a in RELEASE_AFTER_HOLD.items()}  # admission -> its measured release's label
#: a difference this small in both predicted and realized is a plan that moved nothing (ratio)
NO_MOVE = 1e-12
#: lever families by spread label (optimizer/lever_spread.py); a label's family is the first whose prefix matches
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("capacity", ("hold-fleet", "scale-out", "ceiling", "static-live")),
    ("target", ("target",)),
    ("batch", ("batch",)),
    ("precision", ("fp8",)),
    ("clock", ("clock",)),
    ("deferral", (HOLD, "admit-batch")),
    ("release", ("release",)),
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


#: the plan-wide and the per-pool fields each lever family sets (a change of pool set is a capacity move)
FAMILY_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "capacity": (("autoscale",), ("replica_floor", "replica_ceiling")),
    "target": (("autoscale_target",), ()),
    "batch": ((), ("max_batch",)),
    "precision": ((), ("precision", "kv_dtype")),
    "clock": ((), ("sm_clock_mhz",)),
    "deferral": (("batch_admission",), ()),
    "tokens": ((), ("max_num_batched_tokens",)),
}


def families_moved(plan: Plan, reference: Plan) -> frozenset[str]:
    """The lever families in which `plan` differs from `reference` (pools compared by key)."""
    ref = {p.key: p for p in reference.pools}
    moved = {"capacity"} if {p.key for p in plan.pools} != set(ref) else set()
    for name, (wide, per_pool) in FAMILY_FIELDS.items():
        if any(getattr(plan, f) != getattr(reference, f) for f in wide) or any(
            getattr(p, f) != getattr(ref[p.key], f) for p in plan.pools if p.key in ref for f in per_pool
        ):
            moved.add(name)
    return frozenset(moved)


def directed_families(plan: Plan, reference: Plan) -> frozenset[str]:
    """`families_moved`, with deferral named "release" when `plan` admits batch work that `reference` holds.

    >>> from schemas.plan import PoolPlan
    >>> ref = Plan((PoolPlan("s", "m", "H100", 2, 8, 1, "bf16", 256, 1980),))
    >>> held = replace(ref, batch_admission=BatchAdmission.HOLD)
    >>> sorted(directed_families(held, ref)), sorted(directed_families(ref, held))
    (['deferral'], ['release'])
    """
    moved = families_moved(plan, reference)
    if "deferral" in moved and reference.batch_admission == BatchAdmission.HOLD:
        return (moved - {"deferral"}) | {"release"}
    return moved


def pin_families(plan: Plan, reference: Plan, families: frozenset[str]) -> Plan:
    """`plan` with the levers of `families` set as in `reference` (the planner's ablations: what it does
    without a lever family). Pinning capacity also keeps the reference's pools (a placement moves capacity).

    >>> from schemas.plan import PoolPlan
    >>> ref = Plan((PoolPlan("s", "m", "H100", 2, 8, 1, "bf16", 256, 1980),))
    >>> moved = Plan((PoolPlan("s", "m", "H100", 4, 8, 1, "fp8", 512, 1500),), autoscale_target=0.6)
    >>> sorted(families_moved(moved, ref)), sorted(families_moved(pin_families(moved, ref, frozenset(
    ...     {"capacity", "target", "clock"})), ref))
    (['batch', 'capacity', 'clock', 'precision', 'target'], ['batch', 'precision'])
    """
    if not families:
        return plan
    wide = {f: getattr(reference, f) for name in families for f in FAMILY_FIELDS[name][0]}
    per_pool = [f for name in families for f in FAMILY_FIELDS[name][1]]
    ref = {p.key: p for p in reference.pools}
    pools = [replace(p, **{f: getattr(ref[p.key], f) for f in per_pool}) if p.key in ref else p for p in plan.pools]
    if "capacity" in families:
        have = {p.key: p for p in pools}
        pools = [have.get(q.key, q) for q in reference.pools]
    return replace(plan, pools=tuple(pools), **wide)


@dataclass(frozen=True)
class LeverMargins:
    """Margins (ratio of gp/$) per spread plan (its label) and per lever family, and their source."""

    by_family: Mapping[str, float]
    by_label: Mapping[str, float]
    source: str

    def of(self, plan: Plan, reference: Plan) -> float:
        """The margin `plan` must clear against `reference` (ratio): a spread plan's own measured margin
        (label "<who>: <name>") where it moves the lever in the direction that was measured; else the largest of
        the families it moves (an unmeasured family: the largest measured margin), a release no less than the
        measured release of a held hour to its admission (the family's quantile pools it with the reversed
        one-period holds, small backlogs); 0 for a plan moving nothing."""
        moved = directed_families(plan, reference)
        if not moved:
            return 0.0
        name = plan.label.split(": ", 1)[-1]
        if name in self.by_label and family(name) in moved:
            return self.by_label[name]
        worst = max(self.by_family.values(), default=0.0)
        margin = max(self.by_family.get(f, worst) for f in moved)
        if "release" in moved:  # at least the measured release of a held hour's backlog to the same admission
            margin = max(margin, self.by_label.get(_RELEASED_TO.get(plan.batch_admission, ""), 0.0))
        return margin


def with_releases(rows: list[Mapping[str, object]]) -> list[Mapping[str, object]]:
    """`rows` and, for each hold (lever HOLD), its reverse move (lever RELEASE): the same two branches with the
    hold as the reference, so predicted and realized ratios are inverted (1 / (1 + d) - 1).

    >>> rows = with_releases([{"lever": "defer-batch", "predicted": -0.2, "realized": -0.5}])
    >>> [(r["lever"], round(float(r["predicted"]), 3), round(float(r["realized"]), 3)) for r in rows]
    [('defer-batch', -0.2, -0.5), ('release-batch', 0.25, 1.0)]
    """
    def inverse(d: object) -> float:
        return 1.0 / (1.0 + float(d)) - 1.0  # type: ignore[arg-type]

    rev = [{**r, "lever": RELEASE, "predicted": inverse(r["predicted"]), "realized": inverse(r["realized"])}
           for r in rows if r["lever"] == HOLD]
    return [*rows, *rev]


def _moved(r: Mapping[str, object]) -> bool:
    return abs(float(r["predicted"])) >= NO_MOVE or abs(float(r["realized"])) >= NO_MOVE  # type: ignore[arg-type]


def margins_from_rows(rows: list[Mapping[str, object]], key: str = "family",
                      quantile: float = QUANTILE) -> dict[str, float]:
    """Per family (key "family") or spread label (key "lever"), the `quantile` of predicted minus realized
    difference over the measured rows that moved something and the releases they imply (`with_releases`)
    (ratio, >= 0).

    >>> rows = [{"lever": "clock-0.85", "predicted": 0.02, "realized": 0.01},
    ...         {"lever": "clock-0.7", "predicted": 0.0, "realized": 0.05},
    ...         {"lever": "admit-batch", "predicted": 0.0, "realized": 0.0}]
    >>> margins_from_rows(rows, quantile=1.0), margins_from_rows(rows, "lever", quantile=1.0)
    ({'clock': 0.01}, {'clock-0.7': 0.0, 'clock-0.85': 0.01})
    """
    errs: dict[str, list[float]] = {}
    for r in with_releases([r for r in rows if _moved(r)]):
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
