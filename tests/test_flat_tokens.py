"""flat_tokens rows: a tensor the block holds as (batch*seq, ...) reads as (batch, seq,
...) and takes writes through the same view. Every family row that says flat_tokens
is exercised (the model types come from the generated tables), besides the generic
family tests that certify their identities."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini.generated import FAMILY_ADDRESSES
from causalab_mini.internals import LayerTokens, PlaceUnavailable, WriteRefused
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

from .registry_cases import family_cases

Load = Callable[..., StandardizedTransformer]


def _marked(flag: str) -> list[Any]:
    """(family case, row) params for every family row whose address sets ``flag``."""
    return [
        case.param(case, row, id=f"{family}-{row}")
        for family, case in family_cases()
        for match, rows in FAMILY_ADDRESSES
        if match.model_types and case.model_type in match.model_types
        for row, address in rows.items()
        # a read-only row (the router's logits) takes no write, which these tests make
        if getattr(address, flag) and not address.read_only
    ]


# (family case, flat row) for every family row marked flat_tokens
FLAT = _marked("flat_tokens")


def _text_fed(params: list[Any]) -> list[Any]:
    """The params whose model a batch of text alone drives (no side inputs in
    registry/tiny.yaml: BLIP-2 with OPT's flat rows needs an image beside the text)."""
    from causalab_mini.generated.tiny import TINY_SIDE_INPUTS

    return [p for p in params if p.values[0].model_type not in TINY_SIDE_INPUTS]


pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def test_the_hook_remembers_the_batch_and_sequence_of_the_layer_input() -> None:
    hook = LayerTokens()
    hook(None, (torch.zeros(2, 5, 8),), {})
    assert hook.shape == (2, 5)
    hook(None, (), {"hidden_states": torch.zeros(3, 4, 8)})
    assert hook.shape == (3, 4)
    hook(None, (torch.zeros(7),), {})
    assert hook.shape is None


def test_every_flat_row_is_covered() -> None:
    assert {p.values[1] for p in FLAT} >= {"layers_mid", "mlps_output"}


def _flat_layer(model: StandardizedTransformer, row: str) -> int:
    for layer in range(model.internals.num_layers):
        if model.internals[row].unavailable_on(layer) is None:
            return layer
    pytest.skip(f"{row} is refused on every layer")


@pytest.mark.parametrize(("case", "row"), FLAT)
def test_a_flat_place_reads_as_batch_seq_and_writes_through_the_view(
    case: object, row: str, tiny_model: Load
) -> None:
    model = tiny_model(case.spec)  # type: ignore[attr-defined]
    inputs = c.sample_inputs(model)
    layer = _flat_layer(model, row)
    batch, seq = inputs["input_ids"].shape
    hidden = []
    with model.trace(inputs):
        before = model.internals[row][layer].save()
        model.internals[row][layer] = before * 0 + 1.5  # a write of the read's shape
        after = model.internals[row][layer].save()
        out = model.internals["layers_output"][layer].save()
        hidden.append(out)
    assert before.shape[:2] == (batch, seq)
    assert not torch.all(before == 1.5), "a saved read keeps what it was before the write"
    assert torch.all(after == 1.5)
    with model.trace(inputs):
        clean_before = model.internals[row][layer].save()
        clean = model.internals["layers_output"][layer].save()
    assert torch.equal(before, clean_before), "a saved read keeps its clean value"
    assert not torch.allclose(clean, hidden[0]), "the write reaches the block's output"


@pytest.mark.parametrize(("case", "row"), FLAT[:1])
def test_a_flat_place_reads_at_a_layer_counted_from_the_end(
    case: object, row: str, tiny_model: Load
) -> None:
    # the layer's tokens are looked up by its index, never by the negative one given
    model = tiny_model(case.spec)  # type: ignore[attr-defined]
    inputs = c.sample_inputs(model)
    last = model.internals.num_layers - 1
    if model.internals[row].unavailable_on(last) is not None:
        pytest.skip(f"{row} is refused on the last layer")
    with model.trace(inputs):
        counted = model.internals[row][last].save()
        from_end = model.internals[row][-1].save()
    assert from_end.shape[:2] == tuple(inputs["input_ids"].shape)
    assert torch.equal(from_end, counted)


@pytest.mark.parametrize(("case", "row"), FLAT)
def test_a_flat_place_refuses_a_write_of_the_flat_shape(
    case: object, row: str, tiny_model: Load
) -> None:
    model = tiny_model(case.spec)  # type: ignore[attr-defined]
    inputs = c.sample_inputs(model)
    layer = _flat_layer(model, row)
    refused: list[Exception] = []
    with model.trace(inputs):
        value = model.internals[row][layer]
        try:
            model.internals[row][layer] = value.flatten(0, 1)
        except WriteRefused as exc:
            refused.append(exc)
    assert refused and "nothing is broadcast" in str(refused[0])


def test_tokens_that_do_not_fit_the_layer_input_are_refused(tiny_model: Load) -> None:
    model = tiny_model("tiny:opt")
    held = model.internals._tokens[1][0]
    held.shape = (2, 3)
    with pytest.raises(PlaceUnavailable, match="do not multiply to its tokens"):
        model.internals.unflatten("layers_mid", 1, torch.zeros(7, 4))
    # a tensor that already leads with the batch and sequence is as it is
    same = torch.zeros(2, 3, 4)
    assert model.internals.unflatten("layers_mid", 1, same) is same
    assert model.internals.unflatten("layers_mid", 1, torch.zeros(6, 4)).shape == (2, 3, 4)


@pytest.mark.parametrize(("case", "row"), FLAT[:1])
def test_the_first_trace_after_loading_views_a_flat_place(case: object, row: str) -> None:
    # the real modules replace the meta ones when the first trace dispatches: the
    # layers are hooked then, before the forward, even where an earlier place of the
    # layer is read first
    model = StandardizedTransformer(case.spec)  # type: ignore[attr-defined]
    inputs = c.sample_inputs(model)
    layer = _flat_layer(model, row)
    with model.trace(inputs):
        first = model.internals["layers_input"][layer].save()
        flat = model.internals[row][layer].save()
    assert flat.shape[:2] == first.shape[:2] == tuple(inputs["input_ids"].shape)


@pytest.mark.parametrize(("case", "row"), _text_fed(FLAT)[:1])
def test_a_flat_place_is_refused_in_a_trace_of_several_invokes(
    case: object, row: str, tiny_model: Load
) -> None:
    from causalab_mini import compat

    model = tiny_model(case.spec)  # type: ignore[attr-defined]
    layer = _flat_layer(model, row)
    refused: list[Exception] = []
    seen: list[bool | None] = []
    with model.trace() as tracer:
        with tracer.invoke("The quick brown fox"):
            seen.append(compat.several_invokes(model))
            try:
                model.internals[row][layer].save()
            except PlaceUnavailable as exc:
                refused.append(exc)
        with tracer.invoke("jumps over"):
            model.internals["layers_output"][layer].save()
    assert seen == [True], "every supported nnsight (0.6-0.8) says the invokes are batched"
    assert refused and "several invokes" in str(refused[0])


# (family case, row) for every family row marked merged_heads: (batch*heads, ...) held
MERGED = _marked("merged_heads")


def test_every_merged_row_is_covered() -> None:
    assert {p.values[1] for p in MERGED} >= {"attention_probabilities"}


@pytest.mark.parametrize(("case", "row"), MERGED)
def test_a_merged_heads_place_reads_per_head_and_writes_through_the_view(
    case: object, row: str, tiny_model: Load
) -> None:
    from causalab_mini.geometry import num_heads

    model = tiny_model(case.spec, probs=True)  # type: ignore[attr-defined]
    inputs = c.sample_inputs(model)
    layer = _flat_layer(model, row)
    batch = inputs["input_ids"].shape[0]
    with model.trace(inputs):
        before = model.internals[row][layer].save()
        out = model.internals["layers_output"][layer].save()
    with model.trace(inputs):
        value = model.internals[row][layer]
        kept = value.save()  # read before the write: must keep the clean value
        model.internals[row][layer] = value * 0 + 0.25
        after = model.internals[row][layer].save()
        written = model.internals["layers_output"][layer].save()
    assert before.shape[:2] == (batch, num_heads(model, layer))
    assert torch.equal(kept, before), "a saved read keeps its clean value"
    assert torch.all(after == 0.25)
    assert not torch.allclose(written, out), "the write reaches the block's output"
