"""Every command: an example in --help, a --json flag, and shell completion."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from causalab_mini.tools.cli import main

COMMANDS = sorted(main.list_commands(None))  # type: ignore[arg-type]


def test_the_commands() -> None:
    assert {"lint", "gen", "model", "sweep", "new-family", "diagram"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_has_an_example_and_json(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0
    example = result.output.split("Example:", 1)
    assert len(example) == 2, f"`registry {name} --help` shows no example"
    assert f"registry {name}" in example[1]
    assert "--json" in result.output


def _registry() -> str:
    return shutil.which("registry") or str(Path(sys.executable).with_name("registry"))


def test_shell_completion() -> None:
    env = {**os.environ, "_REGISTRY_COMPLETE": "bash_source"}
    script = subprocess.run([_registry()], env=env, capture_output=True, text=True, check=True)
    assert "_registry_completion()" in script.stdout
    env = {
        **os.environ,
        "_REGISTRY_COMPLETE": "bash_complete",
        "COMP_WORDS": "registry model tiny:gpt_ne",
        "COMP_CWORD": "2",
    }
    done = subprocess.run([_registry()], env=env, capture_output=True, text=True, check=True)
    assert "plain,tiny:gpt_neox" in done.stdout.splitlines()
    env["COMP_WORDS"] = "registry ne"
    env["COMP_CWORD"] = "1"
    done = subprocess.run([_registry()], env=env, capture_output=True, text=True, check=True)
    assert "plain,new-family" in done.stdout.splitlines()
