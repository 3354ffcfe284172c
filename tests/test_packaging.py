"""One import namespace: install into fresh virtual environments, editable and as a
wheel, and import the generated tables from outside the repository."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.venv

PROBE = (
    "import importlib.util, sys\n"
    "import causalab_mini.generated as g\n"
    "assert len(g.DEFAULT_ADDRESSES) == 20 and len(g.COMPONENTS) == 21\n"
    "assert 'torch' not in sys.modules\n"
    "for top in ('runtime', 'generated', 'codegen', 'registry', 'schema'):\n"
    "    assert importlib.util.find_spec(top) is None, top\n"
    "print(g.__file__)\n"
)


def _fresh(tmp: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(tmp)
    return tmp / "bin" / "python"


def _run(*args: str, cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_editable_install(tmp_path: Path) -> None:
    python = _fresh(tmp_path / "venv")
    _run(str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO), cwd=tmp_path)
    where = _run(str(python), "-c", PROBE, cwd=tmp_path).strip()
    assert Path(where).resolve() == (REPO / "generated" / "__init__.py").resolve()


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
    where = _run(str(python), "-c", PROBE, cwd=tmp_path).strip()
    assert "site-packages/causalab_mini/generated" in where
