"""The replay's preparation kept on disk between runs: the week-before search (`tuning.tune_static`) and the
lead-in fleet (`tuning.lead_in_fleet`) are deterministic in their inputs, so a run that repeats them loads what
an earlier run measured instead of serving the same past hours again.

An entry's key is a SHA-256 over its inputs (their reprs: market, window start, fleet, seed, physics, periods,
draws) and over every Python source of the packages and every bundled data file (path, size, modification
time): any edit to the code or the data makes a new key, so a stale entry is never read; old entries are left
for the operator to delete. Entries are JSON files under `$AURELIUS_CACHE_DIR`, else
`$XDG_CACHE_HOME/aurelius/replay` (`~/.cache/aurelius/replay`); `AURELIUS_CACHE_DIR=off` (the test suite's
setting) or `aurelius replay --no-cache` computes everything again. A file that cannot be read is recomputed
and rewritten, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from optimizer.baselines.tuned import StaticConfig
from optimizer.clock_price import ClockMeasurement, ClockPrices
from schemas.fleet import FleetSpec
from streams.datasets.paths import data_dir
from streams.replay.tuning import TUNE_DRAWS, Tuning, lead_in_fleet, tune_static
from worldmodel.groundtruth.runtime import Physics

T = TypeVar("T")
CACHE_ENV = "AURELIUS_CACHE_DIR"
#: the packages whose sources key every entry (module docstring)
PACKAGES = ("schemas", "forecasting", "worldmodel", "optimizer", "sinks", "streams")
_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path | None:
    """Where entries live (None: off)."""
    env = os.environ.get(CACHE_ENV)
    if env == "off":
        return None
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aurelius" / "replay"


@cache
def source_digest() -> str:
    """SHA-256 over the packages' Python sources (contents) and the data files (path, size, mtime ns)."""
    h = hashlib.sha256()
    for pkg in PACKAGES:
        for f in sorted((_ROOT / pkg).rglob("*.py")):
            h.update(str(f.relative_to(_ROOT)).encode())
            h.update(f.read_bytes())
    data = data_dir()
    for f in sorted(p for p in data.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(data)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def key(kind: str, **inputs: Any) -> str:
    """An entry's name: `kind` and a digest of the inputs' reprs and the sources (`source_digest`).

    >>> key("lead", market="PJM", seed=0) == key("lead", seed=0, market="PJM") != key("lead", market="PJM", seed=1)
    True
    """
    text = repr(sorted(inputs.items())) + source_digest()
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def remembered(name: str, compute: Callable[[], T], dump: Callable[[T], Any], load: Callable[[Any], T],
               where: Path | None = None) -> T:
    """`load` of the entry `name` when there is a readable one under `where` (default `cache_dir()`); else
    `compute()`, written there as `dump` makes it JSON (atomically: a reader never sees half a file)."""
    where = cache_dir() if where is None else where
    if where is None:
        return compute()
    path = where / f"{name}.json"
    try:
        return load(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(dump(value), f)
    os.replace(tmp, path)
    return value


def dump_tuning(t: Tuning) -> dict[str, Any]:
    """A `Tuning` as JSON (`load_tuning` reads it back equal)."""
    clock = None if t.clock is None else t.clock.as_dict()
    return {"config": t.config.as_dict(), "window_start": t.window_start.isoformat(), "table": list(t.table),
            "clock": clock}


def load_tuning(d: dict[str, Any]) -> Tuning:
    clock = None if d["clock"] is None else ClockPrices(tuple(
        ClockMeasurement(**{**r, "per_draw": tuple(tuple(x) for x in r.get("per_draw", ()))}) for r in d["clock"]))
    return Tuning(StaticConfig(**d["config"]), datetime.fromisoformat(d["window_start"]), tuple(d["table"]), clock)


def dump_fleet(fleet: dict[tuple[str, str, str], int]) -> list[list[Any]]:
    """Replicas per (site, model, gpu) as JSON rows (`load_fleet` reads them back equal).

    >>> load_fleet(dump_fleet({("s", "m", "H100"): 3})) == {("s", "m", "H100"): 3}
    True
    """
    return [[*k, n] for k, n in fleet.items()]


def load_fleet(rows: list[list[Any]]) -> dict[tuple[str, str, str], int]:
    return {(str(s), str(m), str(g)): int(n) for s, m, g, n in rows}


def tuning(market: str, window_start: datetime, fleet: FleetSpec, *, seed: int, physics: Physics,
           period_minutes: float = 5.0, draws: int = TUNE_DRAWS, all_sites: bool = False,
           cached: bool = True) -> Tuning:
    """The week-before search (`tuning.tune_static`), from its entry where an earlier run measured it (the key
    holds every argument; cached False: computed, nothing read or written)."""
    inputs = {"market": market, "window_start": window_start, "fleet": fleet, "seed": seed, "physics": physics,
              "period_minutes": period_minutes, "draws": draws, "all_sites": all_sites}
    if not cached:
        return tune_static(**inputs)
    return remembered(key("tune", **inputs), lambda: tune_static(**inputs), dump_tuning, load_tuning)


def lead_in(market: str, window_start: datetime, fleet: FleetSpec, *, seed: int, physics: Physics,
            all_sites: bool = False, cached: bool = True) -> dict[tuple[str, str, str], int]:
    """The fleet at the window's start (`tuning.lead_in_fleet`), from its entry where an earlier run measured it
    (as `tuning`)."""
    inputs = {"market": market, "window_start": window_start, "fleet": fleet, "seed": seed, "physics": physics,
              "all_sites": all_sites}
    if not cached:
        return lead_in_fleet(**inputs)
    return remembered(key("lead", **inputs), lambda: lead_in_fleet(**inputs), dump_fleet, load_fleet)
