"""One import namespace: install into fresh virtual environments, editable and as a
wheel, and import the generated tables from outside the repository."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from causalab_mini.generated import COMPONENTS, DEFAULT_ADDRESSES

from .conftest import REPO

pytestmark = pytest.mark.venv

# prints where the tables come from, then their rows and components
PROBE = (
    "import importlib.util, json, sys\n"
    "import causalab_mini.generated as g\n"
    "assert 'torch' not in sys.modules\n"
    "for top in ('runtime', 'generated', 'codegen', 'registry', 'schema'):\n"
    "    assert importlib.util.find_spec(top) is None, top\n"
    "print(g.__file__)\n"
    "print(json.dumps([list(g.DEFAULT_ADDRESSES), list(g.COMPONENTS)]))\n"
)


def _probe(python: Path, cwd: Path) -> str:
    """Run PROBE: the installed tables are the checkout's (every row and component, in
    order); returns where they were imported from."""
    where, tables = _run(str(python), "-c", PROBE, cwd=cwd).strip().splitlines()
    assert json.loads(tables) == [list(DEFAULT_ADDRESSES), list(COMPONENTS)]
    return where


def _fresh(tmp: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(tmp)
    return tmp / "bin" / "python"


def _run(*args: str, cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_editable_install(tmp_path: Path) -> None:
    python = _fresh(tmp_path / "venv")
    _run(str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO), cwd=tmp_path)
    where = _probe(python, tmp_path)
    assert Path(where).resolve() == (REPO / "generated" / "__init__.py").resolve()


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_wheel_install(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "-w",
        str(dist),
        str(REPO),
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("causalab_mini-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "causalab_mini/__init__.py",
        "causalab_mini/address.py",
        "causalab_mini/generated/places.py",
        "causalab_mini/codegen/lint.py",
        "causalab_mini/codegen/rules/places.py",
        "causalab_mini/documents/run.py",
        "causalab_mini/tools/sweep/runner.py",
        "causalab_mini/tools/certify/common.py",
        "causalab_mini/tools/tiny/build.py",
        "causalab_mini/schema/document.schema.json",
        "causalab_mini/codegen/templates/places.py.j2",
        "causalab_mini/registry/places.yaml",
        "causalab_mini/registry/tiny.yaml",
        "causalab_mini/schema/common.schema.json",
        "causalab_mini/generated/tiny.py",
        "causalab_mini/registry/families/gpt2.yaml",
        "causalab_mini/schema/places.schema.json",
    ):
        assert needed in names, needed
    assert not any(n.split("/")[0] in ("runtime", "generated", "codegen") for n in names)
    python = _fresh(tmp_path / "venv")
    _run(str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel), cwd=tmp_path)
    where = _probe(python, tmp_path)
    assert "site-packages/causalab_mini/generated" in where
