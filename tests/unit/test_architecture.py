"""The architecture as tests: frameworks through their public API only, imports pointing
inward, modules that fit on a few screens, one import namespace."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = ("rules", "connectors", "streams")
FRAMEWORKS = ("faust", "mode", "aiokafka")
# HTML pages and their templates are long by nature, not by design.
LONG_BY_NATURE = {"connectors/report_html.py"}
MOST_LINES = 500


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def own_private_names() -> set[str]:
    """Every ``_name`` costline itself defines: functions, classes, attributes it assigns,
    parameters and keywords."""
    names: set[str] = set()
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if name.startswith("_")}


OWN = own_private_names()


def uses_a_framework(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
                alias.name.split(".")[0] in FRAMEWORKS for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in FRAMEWORKS:
            return True
    return False


def private_uses(path: Path, own: set[str] = OWN) -> list[str]:
    """Private names of faust, mode or aiokafka a module imports or reads: an attribute
    starting with ``_`` that costline does not define itself belongs to someone else."""
    tree = ast.parse(path.read_text(), str(path))
    if not uses_a_framework(tree):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] in FRAMEWORKS:
            parts = node.module.split(".") + [alias.name for alias in node.names]
            found += [f"line {node.lineno}: from {node.module} import {name}"
                      for name in parts if name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__") and node.attr not in own:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_frameworks_are_used_through_their_public_api(path: Path) -> None:
    # A module that imports a framework reads no attribute whose name starts with "_": an
    # attribute of its own objects is named without one too, so nothing private of Faust,
    # mode or aiokafka can hide behind a name of ours.
    assert private_uses(path) == []


def test_private_use_is_found() -> None:
    tree = "import faust\napp.consumer._commit(x)\nfrom aiokafka.x import _y\n"
    path = ROOT / "build" / "private_probe.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(tree)
    try:
        assert private_uses(path) == ["line 3: from aiokafka.x import _y", "line 2: ._commit"]
        assert private_uses(path, own={"_commit"}) == ["line 3: from aiokafka.x import _y"]
    finally:
        path.unlink()


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_fit_on_a_few_screens(path: Path) -> None:
    name = str(path.relative_to(ROOT))
    if name not in LONG_BY_NATURE:
        assert len(path.read_text().splitlines()) <= MOST_LINES, name


def imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "connectors").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_connectors_never_import_the_composition_root(path: Path) -> None:
    assert not {n for n in imported(path) if n.startswith("costline.streams")}


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_imports_its_packages_by_the_costline_namespace(path: Path) -> None:
    bare = {n for n in imported(path) if n.split(".")[0] in PACKAGES}
    assert not bare, f"{path.relative_to(ROOT)} imports {sorted(bare)} outside costline.*"
