"""Rows whose place is a view of the tensor there: positions the forward puts before
the tokens (``leading_positions``, CPM-Ant's prompt), streams after them
(``trailing_streams``, ProphetNet's predicting streams), a time-major tensor
(``seq_first``, XLNet). A read is batch first and leaves the others out, so it lines
up with the input tokens and transformers' own hidden states; a write replaces the
tokens' positions and keeps the model's own others. The models come from the registry: every family with such a
row on layers_input, on its first model type."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from causalab_mini.generated import FAMILY_ADDRESSES
from causalab_mini.model import StandardizedTransformer

pytestmark = pytest.mark.slow


def _cases() -> list[str]:
    out = []
    for match, rows in FAMILY_ADDRESSES:
        row = rows.get("layers_input")
        if row is not None and row.views_tokens:
            out.append(f"tiny:{match.model_types[0]}")
    return sorted(set(out))


def test_the_registry_has_token_position_cases() -> None:
    # the test below is parametrized from the registry: an empty list would run nothing
    assert set(_cases()) >= {"tiny:cpmant", "tiny:prophetnet", "tiny:xlnet"}


@pytest.mark.parametrize("spec", _cases())
def test_reads_leave_the_other_positions_out_and_writes_keep_them(
    spec: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = tiny_model(spec)
    place = model.internals["layers_input"]
    address = place.address_at(1)
    ids = model.tokenizer("The quick brown fox", return_tensors="pt")["input_ids"]
    with model.trace(ids):
        read = place[1].save()
        whole = model.layers[1].inputs[0][0].clone().save()
    # the read is the tokens' positions of what the layer was given, and lines up
    # with the input (and transformers' own hidden states)
    assert tuple(read.shape[:2]) == tuple(ids.shape)
    others = torch.ones(whole.shape[:2], dtype=torch.bool)
    address.token_positions(others, model.internals.count)[...] = False
    assert torch.equal(read, address.token_positions(whole, model.internals.count))
    with torch.no_grad():
        out = model._model(ids, output_hidden_states=True)
    # an encoder-decoder's layers are its decoder's (FSMT): their oracle is the decoder's
    hidden = getattr(out, "decoder_hidden_states", None) or out.hidden_states
    assert torch.allclose(read, hidden[1], atol=1e-5)
    # a write reaches the tokens' positions only; the others stay the model's
    with model.trace(ids):
        kept = place[1].save()  # read before the write: must keep the clean value
        model.internals["layers_input"][1] = torch.zeros_like(read)
        after = model.layers[1].inputs[0][0].clone().save()
        back = place[1].save()
    assert torch.equal(after[others], whole[others])
    assert bool((address.token_positions(after, model.internals.count) == 0).all())
    assert bool((back == 0).all())
    assert torch.equal(kept, read)
