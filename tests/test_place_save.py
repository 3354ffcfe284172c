"""Every spelling of a whole-model place gives a tensor or refuses: ``model.<place>.save()``
saves the tensor as ``model.logits.save()`` does, never the place object itself."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from causalab_mini.errors import CausalabError
from causalab_mini.model import StandardizedTransformer

pytestmark = [pytest.mark.slow]


def test_whole_model_place_save_is_its_tensor(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model("tiny:llama")
    with model.trace("The quick brown fox"):
        final = model.ln_final_output.save()
        called = model.ln_final_output().save()
        logits = model.logits.save()
    final = getattr(final, "value", final)
    assert isinstance(final, torch.Tensor), type(final)
    assert torch.equal(final, called)
    assert final.shape[:2] == logits.shape[:2]
    # the lens of the last block output is the logits; the final norm's output feeds it
    assert torch.allclose(model._model.lm_head(final), logits, atol=1e-5)


def test_per_layer_place_save_refuses(tiny_model: Callable[..., StandardizedTransformer]) -> None:
    model = tiny_model("tiny:llama")
    with pytest.raises(CausalabError, match=r"model\.layers_mid\[layer\]\.save\(\)"):
        model.layers_mid.save()
