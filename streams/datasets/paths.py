"""Where the bundled data lives (a source checkout, an installed wheel, or an override)."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

ENV_VAR = "AURELIUS_DATA_DIR"


def data_dir() -> Path:
    """The bundled data directory.

    Resolution order: ``$AURELIUS_DATA_DIR``; ``<repo>/data`` next to the packages (source checkout or
    editable install); the ``aurelius_data`` folder that the wheel force-includes.

    Returns
    -------
    Path
        Directory holding ``prices/``, ``traces/``, ``servegen/`` and ``calibration/``.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / "data"
    if repo.is_dir():
        return repo
    try:
        return Path(str(importlib.resources.files("aurelius_data")))
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"bundled data not found: set ${ENV_VAR}, or install the wheel that ships aurelius_data"
        ) from None
