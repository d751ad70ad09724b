"""The planner never reaches the ground truth: walk the import graph of the planner's modules (DESIGN.md)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANNER = [
    "optimizer",
    "forecasting",
    "worldmodel/servingmodel.py",
    "worldmodel/forward.py",
    "worldmodel/snapshot.py",
    "worldmodel/selfcal.py",
    "worldmodel/state",
]
FORBIDDEN = ("worldmodel.groundtruth", "worldmodel.physics")


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    return _imports_src(path.read_text(), _module_name(path), path.name == "__init__.py")


def _imports_src(src: str, module: str, is_package: bool) -> set[str]:
    """Absolute names imported by a module (relative imports resolved), incl. `from a import b` as a.b."""
    tree = ast.parse(src)
    pkg = module.split(".")
    if not is_package:
        pkg = pkg[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _closure(start: list[Path]) -> dict[str, list[str]]:
    """Every local module reached from `start`, with one import chain to it."""
    seen: dict[str, list[str]] = {}
    stack = [(p, [_module_name(p)]) for p in start]
    while stack:
        path, chain = stack.pop()
        name = _module_name(path)
        if name in seen:
            continue
        seen[name] = chain
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__
            parent = _module_file(".".join(parts[:i]))
            if parent is not None:
                stack.append((parent, [*chain, _module_name(parent)]))
        for imp in _imports(path):
            f = _module_file(imp)
            if f is not None:
                stack.append((f, [*chain, imp]))
    return seen


def _planner_files() -> list[Path]:
    files = []
    for entry in PLANNER:
        p = ROOT / entry
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return files


def test_planner_never_imports_ground_truth():
    reached = _closure(_planner_files())
    bad = {m: " -> ".join(chain) for m, chain in reached.items() if m.startswith(FORBIDDEN)}
    assert not bad, f"planner reaches the ground truth: {bad}"
    assert "worldmodel.servingmodel" in reached and "worldmodel.forward" in reached


def test_the_walker_resolves_relative_and_from_imports():
    src = "from ..physics import tables\nimport worldmodel.groundtruth.engine as e\nfrom . import store\n"
    names = _imports_src(src, "worldmodel.state.probe", is_package=False)
    assert {"worldmodel.physics.tables", "worldmodel.groundtruth.engine", "worldmodel.state.store"} <= names
