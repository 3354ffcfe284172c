"""Shared fixtures: copies of the registry to break, the CLI runner, and the tiny
models and certified sweep results, each made once per session."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result

from causalab_mini.codegen.lint import default_registry
from causalab_mini.tools.cli import main

if TYPE_CHECKING:
    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tools.sweep import Result as SweepResult

# One intra-op thread for torch, here and in the interpreters tests start: the tiny
# models gain nothing from a second, and on two busy cores OpenMP's spin-waits made the
# suite 2-4x slower (measured). An explicit OMP_NUM_THREADS is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): set it there too
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parent.parent
# A frozen snapshot of the registry: golden positions do not move when rows are added.
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "registry"
_IGNORE = shutil.ignore_patterns("*.py", "__pycache__")


@pytest.fixture
def registry_copy(tmp_path: Path) -> Path:
    """A copy of the frozen registry snapshot that a test may edit."""
    target = tmp_path / "registry"
    shutil.copytree(FIXTURE, target, ignore=_IGNORE)
    return target


@pytest.fixture
def package_registry_copy(tmp_path: Path) -> Path:
    """A copy of the package's own registry."""
    target = tmp_path / "registry"
    shutil.copytree(default_registry(), target, ignore=_IGNORE)
    return target


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., StandardizedTransformer]:
    """``tiny_model(spec, probs=False)``: the model ``spec`` names, loaded once per
    session for each (spec, enable_attention_probs). Tests share it: a test that
    changes a model (its modules, its rows) loads its own."""
    return load_model


_LOADED: dict[tuple[str, bool], Any] = {}


def load_model(spec: str, probs: bool = False) -> StandardizedTransformer:
    """The session's shared model for (spec, enable_attention_probs): what the
    ``tiny_model`` fixture hands out, for helpers that are not tests."""
    from causalab_mini.model import StandardizedTransformer

    if (spec, probs) not in _LOADED:
        _LOADED[(spec, probs)] = StandardizedTransformer(spec, enable_attention_probs=probs)
    return _LOADED[(spec, probs)]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def certified(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], SweepResult]:
    """``certified(spec)``: the sweep's result for ``spec`` (``run_one``: build, load,
    certify every component), computed once per run: the first worker to ask writes it
    as the sweep's workers send it (JSON), under a lock in the run's temporary folder
    that every xdist worker shares, and the others read it back (test_families.py and
    the sweep's check tests ask for many of the same models)."""
    import hashlib
    import json

    from filelock import FileLock

    from causalab_mini.tools.sweep import Result as Certified
    from causalab_mini.tools.sweep import run_one

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's basetemp is in the run's
        base = base.parent
    folder = base / "certified"
    folder.mkdir(exist_ok=True)
    results: dict[str, SweepResult] = {}

    def get(spec: str) -> SweepResult:
        if spec not in results:
            path = folder / f"{hashlib.sha256(spec.encode()).hexdigest()[:16]}.json"
            with FileLock(f"{path}.lock"):
                if not path.is_file():
                    path.write_text(json.dumps(run_one(spec).__dict__))
            results[spec] = Certified(**json.loads(path.read_text()))
        return results[spec]

    return get


def gpt2_with_a_moved_op() -> Any:
    """tiny:gpt2 whose attention_probabilities row names an op its attention function
    does not call (only a trace finds it missing), loaded eager."""
    import dataclasses

    from causalab_mini import RenameConfig
    from causalab_mini.generated import DEFAULT_ADDRESSES
    from causalab_mini.model import StandardizedTransformer

    moved = dataclasses.replace(
        DEFAULT_ADDRESSES["attention_probabilities"],
        source=("attention_interface(", "module.attn_dropout("),
    )
    model = StandardizedTransformer(
        "tiny:gpt2",
        attn_implementation="eager",
        rename_config=RenameConfig(addresses={"attention_probabilities": moved}),
    )
    model._attention_probs_enabled = True  # loaded eager, without nnterp's own check
    return model


def edit(path: Path, old: str, new: str) -> None:
    """Replace exactly one occurrence of ``old`` in ``path``."""
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {path}"
    path.write_text(text.replace(old, new))


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)
