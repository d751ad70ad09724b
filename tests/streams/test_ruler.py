"""The ruler's version follows its sources and constants; figures name their strongest reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from streams.replay import cli, ruler
from worldmodel.groundtruth.runtime import Physics


def test_ruler_version_follows_every_source_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copies = []
    for i, f in enumerate(ruler.RULER_FILES):
        d = tmp_path / str(i) / f.parent.name
        d.mkdir(parents=True)
        copies.append(Path(shutil.copy(f, d / f.name)))
    monkeypatch.setattr(ruler, "RULER_FILES", tuple(copies))
    before = ruler.ruler_version(Physics())
    assert before == ruler.ruler_version(Physics())
    scaler = next(p for p in copies if p.name == "scaler.py")
    scaler.write_bytes(scaler.read_bytes() + b"\n# one more line\n")
    assert ruler.ruler_version(Physics()) != before


def test_ruler_version_follows_the_constants() -> None:
    assert ruler.ruler_version(Physics()) != ruler.ruler_version(Physics(cold_start_s=60.0))
    rec = ruler.ruler_record(Physics())
    assert rec["version"] == ruler.ruler_version(Physics())
    assert "groundtruth/engine.py" in rec["files"] and "replay/metrics.py" in rec["files"]


def _pol(rented: float, owned: float) -> dict[str, float]:
    return {"gp_per_dollar": rented, "gp_per_dollar_owned": owned}


def test_strongest_reference_per_basis_from_references_only() -> None:
    market = {
        "policies": {
            "production": _pol(100.0, 50.0),
            "production-tuned": _pol(110.0, 45.0),
            "naive": _pol(90.0, 60.0),
            "aurelius": _pol(121.0, 66.0),
        }
    }
    cli._strongest_reference(market)
    assert market["strongest_reference"] == {"rented": "production-tuned", "owned": "naive"}
    assert market["gain_vs_strongest"]["aurelius"]["rented"] == pytest.approx(0.1)
    assert market["gain_vs_strongest"]["aurelius"]["owned"] == pytest.approx(0.1)
    assert set(market["gain_vs_strongest"]) == {"aurelius"}
