"""The ground-truth serving simulator: the ruler every policy is measured with.

Nothing under optimizer/, forecasting/ or the planner's model (worldmodel.servingmodel, .forward, .snapshot,
.selfcal, .state) may import this package, and it imports only the contract (schemas/) and its physics: the
import-linter contracts in pyproject.toml, checked by tests/test_layers.py.
It has effects the planner must learn from telemetry: per-node step-time variation up to +-15%, a site
power-cap controller, compute-bound work held at the GPU's power-limited clock, activity-dependent power, and
output lengths unknown until done. (The earlier hidden thermal slowdown had no cited magnitude and is gone;
telemetry temperature is a display-only function of power.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: The simulator's sources: numba inlines functions across these modules and the physics.
SOURCES_DIRS = (Path(__file__).parent, Path(__file__).parent.parent / "physics")
STAMP = "numba-sources.sha256"


def sources_digest(dirs: tuple[Path, ...] = SOURCES_DIRS) -> str:
    """sha256 (16 hex chars) over the simulator's and the physics' Python sources, in path order."""
    h = hashlib.sha256()
    for path in sorted(p for d in dirs for p in d.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def invalidate_stale_cache(cache_dir: Path = Path(__file__).parent / "__pycache__") -> bool:
    """Drop numba's cached machine code when any simulator source changed; True when it did.

    numba keys a cached function on its own file's timestamp only, so an edit to a function it inlines from
    another module would leave stale code running. The stamp file keys the whole cache on `sources_digest`.
    A read-only install is left alone (numba then caches elsewhere).
    """
    digest = sources_digest()
    stamp = cache_dir / STAMP
    if stamp.is_file() and stamp.read_text() == digest:
        return False
    try:
        cache_dir.mkdir(exist_ok=True)
        for f in [*cache_dir.glob("*.nbi"), *cache_dir.glob("*.nbc")]:
            f.unlink(missing_ok=True)
        stamp.write_text(digest)
    except OSError:
        return False
    return True


invalidate_stale_cache()
