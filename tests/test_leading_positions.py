"""Rows whose tensors carry positions the forward puts before the tokens
(``leading_positions``, CPM-Ant's prompt): a read leaves them out, so it lines up with
the input tokens and transformers' own outputs; a write replaces the tokens'
positions and keeps the model's own leading ones. The models come from the registry:
every family with such a row, on its first model type."""

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
        if any(row.leading_positions is not None for row in rows.values()):
            out.append(f"tiny:{match.model_types[0]}")
    return sorted(set(out))


@pytest.mark.parametrize("spec", _cases())
def test_reads_leave_the_leading_positions_out_and_writes_keep_them(
    spec: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = tiny_model(spec)
    place = model.internals["layers_input"]
    lead = place.address_at(1).leading_positions
    assert lead is not None, "the case's family marks layers_input"
    count = model.internals.count(lead.config)
    assert count > 0
    ids = model.tokenizer("The quick brown fox", return_tensors="pt")["input_ids"]
    with model.trace(ids):
        read = place[1].save()
        whole = model.layers[1].inputs[0][0].clone().save()
    # the read is the tokens' positions of what the layer was given, and lines up
    # with the input (and transformers' own hidden states)
    assert read.shape[1] == ids.shape[1]
    assert whole.shape[1] == ids.shape[1] + count
    assert torch.equal(read, whole[:, count:])
    with torch.no_grad():
        hidden = model._model(ids, output_hidden_states=True).hidden_states
    assert torch.allclose(read, hidden[1], atol=1e-5)
    # a write reaches the tokens' positions only; the prompt's stay the model's
    with model.trace(ids):
        model.internals["layers_input"][1] = torch.zeros_like(read)
        after = model.layers[1].inputs[0][0].clone().save()
        back = place[1].save()
    assert torch.equal(after[:, :count], whole[:, :count])
    assert bool((after[:, count:] == 0).all())
    assert bool((back == 0).all())
