"""What ``pip install .`` installs: the ``costline`` namespace and nothing named ``rules``,
``streams`` or ``connectors`` (names other packages use too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FOLDERS = {"rules": "costline.rules", "connectors": "costline.connectors",
           "streams": "costline.streams"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a clean copy of the source: an editable install's ``*.egg-info`` (or an
    earlier ``build/``) beside the source lists every file, and the build would take the
    packages its own list leaves out from there, as a clean clone does not."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "--quiet", "-w", str(out), str(source)], check=True, timeout=300)
    [built] = out.glob("costline-*.whl")
    return built


def test_the_wheel_holds_only_the_costline_namespace(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        names = set(archive.namelist())
    assert {top for top in tops if not top.endswith(".dist-info")} == {"costline"}
    # the data the code reads at run time travels with it
    assert {"costline/connectors/apply_window.lua", "costline/rules/prices/example.yaml",
            "costline/rules/definitions/budgets.yaml",
            "costline/rules/definitions/tests/cluster_test.yaml",
            "costline/streams/api/dashboard/index.html",
            "costline/streams/demo/data/focus/focus_1.0_sample_1000.csv",
            "costline/streams/stack/apache-kafka/pom.xml"} <= names


def source_modules() -> list[str]:
    """Every module of the source tree, by the name it is imported as once installed."""
    names = []
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__main__":  # runs the command line when imported
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join((package, *parts)))
    return names


def test_the_wheel_holds_every_package_of_the_source_tree(wheel: Path) -> None:
    """A package the build's list leaves out is missing from every install but an editable
    one: the command line then fails where it imports it."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for folder, package in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.relative_to(ROOT / folder).as_posix()
            assert f"{package.replace('.', '/')}/{inside}" in names, inside


def test_costline_imports_from_a_fresh_environment_and_rules_does_not(
        wheel: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    [site] = (fresh / "lib").glob("python3*/site-packages")
    # the wheel, and this environment's dependencies, as plain folders on the path: no
    # editable install's import hook (a .pth of the dependencies' folder is not read)
    (site / "costline_under_test.pth").write_text(
        f"{unpacked}\n{sysconfig.get_paths()['purelib']}\n")
    python = fresh / "bin" / "python"
    probe = ("import importlib, importlib.util, sys\n"
             f"for name in {source_modules()!r}:\n"
             "    importlib.import_module(name)\n"
             "import costline.rules.events\n"
             "print(costline.rules.events.__file__)\n"
             "print([n for n in ('rules', 'streams', 'connectors') "
             "if importlib.util.find_spec(n) is not None])\n")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    where, bare = done.stdout.splitlines()
    assert where.startswith(str(unpacked))
    assert bare == "[]"
