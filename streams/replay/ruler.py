"""The ruler's version: one hash over what decides a replay's figures, so figures from different rulers are
never compared.

The ruler is the ground-truth simulator and its physics (worldmodel/groundtruth, worldmodel/physics), the
replay's driver and accounting (streams/replay/driver.py, metrics.py), the contract they measure against
(schemas/cost.py, fleet.py, protocol.py, models.py, plan.py) and the run-time constants (the `Physics` knobs
and the cost configuration). The references' tuning is not part of it: a stronger reference is allowed under
one ruler.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import schemas
import worldmodel
from schemas.cost import CostConfig
from worldmodel.groundtruth.runtime import Physics

_ROOT_SCHEMAS = Path(schemas.__file__).parent
_ROOT_WORLD = Path(worldmodel.__file__).parent
_HERE = Path(__file__).parent

#: Every source file of the ruler, relative to the repository (sorted by `ruler_sources`).
RULER_FILES: tuple[Path, ...] = (
    *sorted((_ROOT_WORLD / "groundtruth").glob("*.py")),
    *sorted((_ROOT_WORLD / "physics").glob("*.py")),
    _HERE / "driver.py",
    _HERE / "metrics.py",
    *(_ROOT_SCHEMAS / f for f in ("cost.py", "fleet.py", "protocol.py", "models.py", "plan.py")),
)


def _plain(obj: Any) -> Any:
    """A JSON-able form of the constants (dataclasses as dicts, everything else as its string)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj if isinstance(obj, (int, float, str, bool)) or obj is None else str(obj)


def ruler_version(physics: Physics | None = None, cost: CostConfig | None = None) -> str:
    """sha256 (16 hex chars) over the ruler's sources (name and bytes, in path order) and its constants.

    Examples
    --------
    >>> a = ruler_version(Physics())
    >>> a == ruler_version(Physics()), a == ruler_version(Physics(fp8_speedup_scale=0.5))
    (True, False)
    """
    h = hashlib.sha256()
    for path in RULER_FILES:
        h.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    consts = {"physics": _plain(physics or Physics()), "cost": _plain(cost or CostConfig())}
    h.update(json.dumps(consts, sort_keys=True).encode())
    return h.hexdigest()[:16]


def ruler_record(physics: Physics | None = None, cost: CostConfig | None = None) -> dict[str, Any]:
    """results.json's `ruler`: the version, the files it covers and the constants it was taken with."""
    return {
        "version": ruler_version(physics, cost),
        "files": [f"{p.parent.name}/{p.name}" for p in RULER_FILES],
        "physics": _plain(physics or Physics()),
    }
