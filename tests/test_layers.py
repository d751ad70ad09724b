"""The import-layer contract of DESIGN.md "Layers" ([tool.importlinter] in pyproject.toml), and proof that it
can fail: a copy of the packages with one import against the order is reported broken."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "forecasting", "worldmodel", "optimizer", "sinks", "streams")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_layer_contracts_are_kept():
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "4 kept, 0 broken" in res.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("schemas/plan.py", "import streams.cli", "Layers"),  # the contract reaching the application
        ("worldmodel/forward.py", "import optimizer.objective", "Layers"),  # knowledge reaching decisions
        ("forecasting/pool.py", "import worldmodel.snapshot", "Layers"),  # siblings of one layer
        ("optimizer/objective.py", "import worldmodel.groundtruth.engine", "never imports the ground-truth"),
        ("worldmodel/groundtruth/engine.py", "import worldmodel.forward", "import only the contract"),
        ("streams/workload/window.py", "import streams.workload.builder", "No import cycles"),
    ],
)
def test_an_import_against_the_order_is_reported(tmp_path, module, line, contract):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # noqa\n")
    res = _lint(tmp_path)
    assert res.returncode != 0
    broken = [s for s in res.stdout.split("\n\n") if "BROKEN" in s or "broken" in s]
    assert any(contract in s for s in broken), res.stdout


def test_every_planner_module_of_worldmodel_is_named_in_the_ground_truth_contracts():
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    planner = {
        f"worldmodel.{p.stem}" for p in (ROOT / "worldmodel").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    } - {"worldmodel.groundtruth", "worldmodel.physics"}
    forbidden = [c for c in contracts if c["type"] == "forbidden"]
    assert len(forbidden) == 2
    assert planner <= set(forbidden[0]["source_modules"])  # the planner never imports the ground truth
    assert planner <= set(forbidden[1]["forbidden_modules"])  # the ground truth never imports the planner
