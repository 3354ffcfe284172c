"""Every Python block of README.md, CONTRIBUTING.md, docs/positions.md,
docs/attribution.md, docs/interventions.md and docs/interop.md runs on its own, in a
fresh interpreter, and prints what the text block right after it says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow

# a ```python block, and the ```text block after it when only a "prints" line (or
# nothing) stands between them
BLOCK = re.compile(
    r"```python\n(?P<code>.*?)```\n(?:\s*(?:prints:?)?\s*\n```text\n(?P<out>.*?)```)?",
    re.S,
)


# The pages of docs/ whose blocks run in CI's wide tier, not in the README's test
# command: each block starts a fresh interpreter (about 4 s of CPU importing torch,
# transformers and nnsight before it runs), the fifteen of them were a tenth of that
# command's time, and what they call has its own tests there (test_positions.py,
# test_attribution.py, test_mechanisms.py, test_interop_tl.py). README.md's and
# CONTRIBUTING.md's blocks stay in it.
WIDE_PAGES = (
    "docs/positions.md",
    "docs/attribution.md",
    "docs/interventions.md",
    "docs/interop.md",
)


def blocks() -> list[tuple[str, str, str | None]]:
    found = []
    for name in ("README.md", "CONTRIBUTING.md", *WIDE_PAGES):
        text = (REPO / name).read_text(encoding="utf-8")
        for i, match in enumerate(BLOCK.finditer(text)):
            found.append((f"{name}#{i + 1}", match["code"], match["out"]))
    return found


def _params() -> list[object]:
    return [
        pytest.param(
            *block,
            id=block[0],
            marks=[pytest.mark.wide] if block[0].split("#")[0] in WIDE_PAGES else [],
        )
        for block in blocks()
    ]


def test_the_readme_has_blocks_with_their_output() -> None:
    found = blocks()
    assert len(found) >= 3
    assert all(out is not None for _, _, out in found), "every block shows what it prints"


@pytest.mark.parametrize(("where", "code", "expected"), _params())
def test_a_block_runs_alone_and_prints_what_it_says(
    where: str, code: str, expected: str | None, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # nothing of the checkout's folders on the path but the install
        timeout=300,
    )
    assert done.returncode == 0, f"{where} fails on its own:\n{done.stderr}"
    assert "Loading weights" not in done.stderr and "INFO" not in done.stderr, done.stderr
    if expected is not None:
        got = [line.rstrip() for line in done.stdout.rstrip("\n").split("\n")]
        want = [line.rstrip() for line in expected.rstrip("\n").split("\n")]
        assert got == want, f"{where} prints otherwise than the text says"
