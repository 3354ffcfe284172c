"""``model.lens``: the model's own head on the last block's output (issue 20, item 5).

nnterp's ``project_on_vocab`` (final norm, then the unembedding) skips what a family
applies after the head: Gemma-2 soft-caps its logits. ``model.lens`` applies the
family's lens rows, inside a trace and outside one, and gives the model's logits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini.generated import FAMILIES

# a cap that bites on a tiny model's logits (the default, 30, moves them by 1e-4)
CAPPED = "tiny:gemma2?final_logit_softcapping=0.05"


def _read(model: Any) -> tuple[Any, Any, Any, Any]:
    last = model.internals.num_layers - 1
    with model.trace("The quick brown fox jumps over"):
        hidden = model.layers_output[last].save()
        inside = model.lens(hidden).save()
        nnterp_lens = model.project_on_vocab(hidden).save()
        logits = model.logits.save()
    return hidden, inside, nnterp_lens, logits


@pytest.mark.parametrize("spec", [CAPPED, "tiny:llama"])
def test_lens_of_the_last_block_output_is_the_logits(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    hidden, inside, nnterp_lens, logits = _read(model)
    outside = model.lens(hidden)  # a plain tensor, after the trace
    assert torch.allclose(inside, logits, atol=1e-6, rtol=0), (inside - logits).abs().max()
    assert torch.allclose(outside, logits, atol=1e-6, rtol=0), (outside - logits).abs().max()
    if spec == CAPPED:  # nnterp's lens is off by the soft-capping the model applies
        assert float(logits.detach().abs().max()) <= 0.05 + 1e-6
        assert float((nnterp_lens - logits).detach().abs().max()) > 1e-2


def test_a_family_whose_head_reads_more_than_the_stream_is_refused(
    tiny_model: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from causalab_mini.address import Lens
    from causalab_mini.logit_lens import LensRefused

    model = tiny_model("tiny:llama")
    reason = "its head also reads the per-layer inputs (a test family)"
    said = dataclasses.replace(FAMILIES["llama"], lens=Lens(unavailable=reason))
    monkeypatch.setattr(model, "resolution", dataclasses.replace(model.resolution, matched=(said,)))
    with pytest.raises(LensRefused) as refused:
        model.lens(torch.zeros(1, 2, model.hidden_size))
    text = str(refused.value)
    assert reason in text and "llama" in text and "model.logits" in text, text


def test_the_sweep_certifies_the_lens_identity(certified: Callable[[str], Any]) -> None:
    from causalab_mini.tools.checks import LENS_IDENTITY

    result = certified("tiny:gemma2")
    logits = result.components["logits"]
    assert LENS_IDENTITY in logits["checks"], logits
    assert logits["lens"].startswith("ok: max error"), logits
