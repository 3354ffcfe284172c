"""Trained interventions against a known answer: labels made by the model itself under
a planted rank-1 interchange along a direction w at one place; distributed alignment
search with k = 1 there recovers w and its interchange-intervention accuracy, and
does worse at a place where w was not planted; the weights stay bit for bit; a seed
gives the same fit; both engines fit alike; bad input is refused before anything
runs."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import locate
from causalab_mini.featurizers import Identity, Subspace
from causalab_mini.interchange import interchange
from causalab_mini.tools.checks import positions as checks
from causalab_mini.training import TrainingRefused, train

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

PAIRS = list(itertools.permutations(list(checks.SENTENCES[:7]), 2))[:40]
BASES, SOURCES = [a for a, _ in PAIRS], [b for _, b in PAIRS]
LAST = {"index": -1}


def _planted(model: Any) -> tuple[Any, Any]:
    """A unit direction w, and the logits of every pair under its rank-1 interchange
    at block_output[1]'s last token (the labels)."""
    width = locate(model, "block_output", 1).width
    w = torch.randn(1, width, generator=torch.Generator().manual_seed(3))
    w = w / w.norm()
    place = locate(model, "block_output", 1, position=LAST, featurizer=Subspace(1, matrix=w))
    with torch.no_grad():
        labels = interchange(model, [place], BASES, SOURCES).logits.detach()
    return w, labels


def _fit(model: Any, position: Any, labels: Any, **kwargs: Any) -> tuple[Any, Any]:
    f = Subspace(1, seed=7)
    place = locate(model, "block_output", 1, position=position, featurizer=f)
    result = train(
        model,
        [place],
        BASES[:32],
        SOURCES[:32],
        labels[:32],
        objective="kl",
        batch_size=8,
        lr=0.05,
        eval=(BASES[32:], SOURCES[32:], labels[32:]),
        **kwargs,
    )
    return f, result


def test_das_recovers_a_planted_direction(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    w, labels = _planted(model)  # a run: the weights are loaded
    weights = [p.detach().clone() for p in model._model.parameters()]
    f, result = _fit(model, LAST, labels, epochs=30)
    assert float((f.matrix @ w.T).abs()) >= 0.95
    assert result.iia is not None and result.iia >= 0.95
    assert len(result.history) == 30 and result.history[0]["loss"] > result.history[-1]["loss"]
    # elsewhere (the first token, where nothing was planted) it does worse
    _, elsewhere = _fit(model, {"index": 0}, labels, epochs=6)
    assert elsewhere.iia is not None and elsewhere.iia < result.iia
    # nothing of the model moved, and no gradient is left on it
    after = list(model._model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(after, weights, strict=True))
    assert all(p.grad is None for p in after)


def test_a_seed_gives_the_same_fit_on_either_engine(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:gpt2")
    _, labels = _planted(model)
    fits = {}
    for engine in ("hooks", "nnsight", "hooks"):
        f, _ = _fit(model, LAST, labels, epochs=2, engine=engine)
        fits.setdefault(engine, []).append(f.matrix.detach().clone())
    assert torch.equal(fits["hooks"][0], fits["hooks"][1])
    torch.testing.assert_close(fits["nnsight"][0], fits["hooks"][0], rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused_before_anything_runs(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    fixed = locate(model, "block_output", 1, position=LAST, featurizer=Identity())
    bare = locate(model, "block_output", 1, position=LAST)
    fitted = locate(model, "block_output", 1, position=LAST, featurizer=Subspace(1))
    with pytest.raises(TrainingRefused, match="no trainable parameters"):
        train(model, [fixed], BASES[:2], SOURCES[:2], [1, 2])
    with pytest.raises(TrainingRefused, match="no featurizer"):
        train(model, [bare], BASES[:2], SOURCES[:2], [1, 2])
    with pytest.raises(TrainingRefused, match="one label per pair"):
        train(model, [fitted], BASES[:2], SOURCES[:2], [1, 2, 3])
    with pytest.raises(TrainingRefused, match="objective"):
        train(model, [fitted], BASES[:2], SOURCES[:2], [1, 2], objective="mse")
