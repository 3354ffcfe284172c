"""ruff and mypy --strict are part of the suite, so CI holds the code to them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO


def _tool(name: str) -> str:
    return shutil.which(name) or str(Path(sys.executable).with_name(name))


def test_ruff_check_and_format() -> None:
    for args in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run([_tool("ruff"), *args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.typecheck  # CI runs it after the README's command (and nox -s typecheck)
def test_mypy_strict() -> None:
    proc = subprocess.run(
        [
            _tool("mypy"),
            "--strict",
            "codegen",
            "generated",
            "runtime",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
