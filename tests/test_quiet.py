"""Loading a model prints nothing but warnings that matter; verbose=True shows more."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LOAD = """
import logging
from causalab_mini import StandardizedTransformer
model = StandardizedTransformer("tiny:llama", verbose={verbose})
with model.trace("The quick brown fox"):  # the first trace loads the weights (dispatch)
    mid = model.layers_mid[1].save()
assert logging.getLogger("nnterp").level == logging.INFO  # put back as nnterp set it
print("loaded", model.internals.num_layers)
"""


def _run(code: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAUSALAB_MINI_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_a_first_build_and_a_load_print_nothing(tmp_path: Path) -> None:
    first = _run(LOAD.format(verbose=False), tmp_path)  # builds the checkpoint, then loads
    assert first.returncode == 0, first.stderr
    assert first.stdout == "loaded 3\n"
    for noise in ("INFO", "Loading weights", "Writing model shards", "it/s]"):
        assert noise not in first.stderr, first.stderr
    again = _run(LOAD.format(verbose=False), tmp_path)
    assert again.returncode == 0 and "INFO" not in again.stderr, again.stderr


def test_verbose_shows_the_libraries_own_lines(tmp_path: Path) -> None:
    done = _run(LOAD.format(verbose=True), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "INFO | nnterp | Updating default rename" in done.stderr


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_a_piped_sweep_prints_plain_lines_and_no_child_bars() -> None:
    """One line an architecture on stdout, and on stderr none of the bars or log lines
    the loads it starts would print (its own progress bar is transient)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from causalab_mini.tools.cli import main; main()",
            "sweep",
            "--only",
            "llama,gpt_neox",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("registry sweep: 2 architectures in ")
    assert lines[1].split()[:3] == ["gpt_neox", "parallel", "certified"]
    assert lines[2].split()[:3] == ["llama", "pre_norm", "certified"]
    assert not any(ch in done.stdout for ch in "┏━│┃└"), done.stdout
    assert "Loading weights" not in done.stderr and "INFO" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 0, done.stderr
