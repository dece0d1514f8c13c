"""What installing compass puts on a user's path: one top-level package, ``compass``.

The repo keeps ``cli/`` and ``bench/`` at its root; they install as ``compass._cli`` and
``compass._bench`` (pyproject.toml ``package-dir``), so a user project with its own ``cli/`` or
``bench/`` never shadows ours, nor ours theirs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import compass

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "compass", "cli", "bench")
# no build isolation: the build uses this environment's setuptools, and needs no network
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q")


def _package_dirs(folder: Path, name: str) -> set[str]:
    """Dotted names of ``folder`` and every folder below it that holds Python modules."""
    found = {name}
    for path in folder.rglob("*.py"):
        parts = path.parent.relative_to(folder).parts
        if "__pycache__" not in parts:
            found.add(".".join((name, *parts)))
    return found


def test_pyproject_lists_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {"compass._cli": "cli", "compass._bench": "bench"}
    expected = (
        _package_dirs(ROOT / "compass", "compass")
        | _package_dirs(ROOT / "cli", "compass._cli")
        | _package_dirs(ROOT / "bench", "compass._bench")
    )
    assert set(config["packages"]) == expected
    assert all(name.split(".")[0] == "compass" for name in config["packages"])


def test_every_package_folder_is_a_regular_package() -> None:
    # a folder without __init__.py would be a namespace package: found by accident, typed
    # differently by mypy, and left out of a wheel when pyproject forgets it
    for folder in ("compass", "cli", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in path.parts:
                assert (path.parent / "__init__.py").exists(), path.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the sources (the build leaves nothing in the repo)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [*PIP_WHEEL, "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (built,) = out.glob("*.whl")
    return built


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    assert wheel.name.startswith(f"compass-{compass.__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(
            f"compass-{compass.__version__}.dist-info/entry_points.txt"
        ).decode()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"compass"}
    for path in (
        "compass/__main__.py",
        "compass/py.typed",
        "compass/_cli/main.py",
        "compass/_bench/e2e.py",
        "compass/_bench/workloads/paper.json",
    ):
        assert path in names
    packages = {name.rsplit("/", 1)[0].replace("/", ".") for name in names if name.endswith(".py")}
    assert packages >= _package_dirs(ROOT / "compass", "compass")
    assert "compass = compass._cli.main:main" in entry_points


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_installed_cli_ignores_a_user_projects_own_cli_and_bench(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    project = tmp_path / "project"  # a user's project, the current directory
    for name in ("cli", "bench"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text("raise SystemExit('the user module ran')\n")
        (project / name / "main.py").write_text("raise SystemExit('the user module ran')\n")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    version = subprocess.run(
        [sys.executable, "-m", "compass", "--version"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"compass {compass.__version__}\n"
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import compass, compass._cli.main as cli, compass._bench.e2e as e2e, pathlib;"
            "print(compass.__file__); print(cli.__file__);"
            "print(pathlib.Path(e2e.DEFAULT_WORKLOAD).is_file())",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.returncode == 0, where.stderr
    package, cli, workload_found = where.stdout.split()
    assert Path(package).is_relative_to(site) and Path(cli).is_relative_to(site)
    assert workload_found == "True"
