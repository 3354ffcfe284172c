"""Language models inside multimodal wrappers, fed an image too (tiny vision towers,
random pixels): the text places keep their identities and transformers' own
hidden states, and the image enters the stream where the family file says.

The text-only checks of these families are the generic ones (tests/registry_cases.py
derives them from the family files); these add what only an image input shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.tools import certify

pytestmark = [pytest.mark.slow, pytest.mark.semantic, pytest.mark.wide]


TEXT = "The quick brown fox"


def _text_ids(model: Any) -> Any:
    return model.tokenizer([TEXT], return_tensors="pt")["input_ids"]


def _with_media(model: Any, media: Any) -> Any:
    """The text's ids with the placeholder ids ``media`` (1, n) before its first content
    token: after whatever the tokenizer puts first (the content frame says where)."""
    import torch

    from causalab_mini import positions

    ids = _text_ids(model)
    first = positions.resolve(model, TEXT, {"index": 0})[0][0]
    return torch.cat([ids[:, :first], media, ids[:, first:]], dim=1)


def _loaded(spec: str) -> Any:
    """A model of its own (the test changes its weights), with every parameter its
    init left at zero filled with random values: the tiny checkpoints keep the
    zero-initialised image projections and cross-attention gates a fresh model has,
    which would hide the image from the text stream."""
    import torch

    from causalab_mini import StandardizedTransformer

    model = StandardizedTransformer(spec)
    if not model.dispatched:
        model.dispatch()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model._model.parameters():
            if parameter.numel() and not parameter.any():
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return model


def _failed(checks: list[certify.CheckResult]) -> list[tuple[str, int | None, float | None]]:
    return [(c.description, c.layer, c.max_error) for c in checks if not c.ok]


def _gemma3_inputs(model: Any, seed: int) -> dict[str, Any]:
    """``<s>``, the image's placeholder tokens, the text; random pixels."""
    import torch

    config = model._model.config
    image = torch.full((1, config.mm_tokens_per_image), config.image_token_id)
    input_ids = _with_media(model, image)
    generator = torch.Generator().manual_seed(seed)
    size = config.vision_config.image_size
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "token_type_ids": (input_ids == config.image_token_id).long(),
        "pixel_values": torch.randn(1, 3, size, size, generator=generator),
    }


def test_gemma3_image_enters_after_the_embeddings() -> None:
    """Gemma-3: with an image, every identity and transformers' hidden states still
    hold; embeddings_output holds the placeholder tokens' own embeddings, and
    layers_input[0] the merged sequence: the projected image features at the
    placeholders, the token embeddings elsewhere."""
    import torch

    model = _loaded("tiny:gemma3")
    inputs = _gemma3_inputs(model, seed=0)
    values = certify.read_places(model, inputs)
    checks = certify.identities(model, values) + certify.hidden_state_oracle(model, inputs, values)
    assert checks and not _failed(checks)
    assert any(c.description.startswith("hidden_states") for c in checks)

    image = inputs["input_ids"][0] == model._model.config.image_token_id
    embedded = values[("embeddings_output", None)][0]
    merged = values[("layers_input", 0)][0]
    with torch.no_grad():
        features = model._model.model.get_image_features(pixel_values=inputs["pixel_values"])
        placeholder = model._model.get_input_embeddings()(inputs["input_ids"])[0]
    assert certify.difference(embedded, placeholder)[0]  # the ids' own embeddings
    assert certify.difference(merged[~image], embedded[~image])[0]
    assert certify.difference(merged[image], features.pooler_output[0])[0]
    assert not certify.difference(merged[image], embedded[image])[0]

    # other pixels change the stream at the image's positions only
    other = certify.read_places(
        model, _gemma3_inputs(model, seed=1), ["embeddings_output", "layers_input"]
    )
    assert torch.equal(other[("embeddings_output", None)][0], embedded)
    moved = (other[("layers_input", 0)][0] - merged).abs().amax(-1)
    assert bool((moved[image] > 0).all()) and bool((moved[~image] == 0).all())


def _mllama_inputs(model: Any, seed: int) -> dict[str, Any]:
    """``<s>``, the image token, the text; one tile of random pixels, which every
    token may attend to."""
    import torch

    config = model._model.config
    vision = config.vision_config
    image = torch.full((1, 1), config.image_token_id)
    input_ids = _with_media(model, image)
    tiles, size = vision.max_num_tiles, vision.image_size
    generator = torch.Generator().manual_seed(seed)
    tile_mask = torch.zeros(1, 1, tiles, dtype=torch.long)
    tile_mask[..., 0] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": torch.randn(1, 1, tiles, 3, size, size, generator=generator),
        "aspect_ratio_ids": torch.ones(1, 1, dtype=torch.long),  # 1 x 1 tiles
        "aspect_ratio_mask": tile_mask,
        "cross_attention_mask": tile_mask[:, None].expand(1, input_ids.shape[1], 1, tiles),
    }


def test_mllama_image_enters_at_the_cross_attention_layers() -> None:
    """Mllama: with an image, the cross-attention layer runs (its places stay refused,
    with the reason), the self-attention layers keep every identity and match
    transformers' hidden states, which now list every layer; the image enters
    between layers_output of the layer before the cross-attention layer (the same
    whatever the pixels) and layers_input of the layer after it (not)."""
    import torch

    model = _loaded("tiny:mllama")
    cross = [
        i
        for i in range(model.internals.num_layers)
        if i not in model.internals.layers_run_on_text()
    ]
    assert cross, "the tiny Mllama has a cross-attention layer"
    layer = cross[0]
    assert 0 < layer < model.internals.num_layers - 1
    assert "image" in (model.internals["layers_output"].unavailable_on(layer) or "")

    inputs = _mllama_inputs(model, seed=0)
    values = certify.read_places(model, inputs)
    assert certify.identities(model, values) and not _failed(certify.identities(model, values))
    with torch.no_grad():
        out = model._model(**certify.forward_inputs(model, inputs), output_hidden_states=True)
    hidden = out.hidden_states
    assert len(hidden) == model.internals.num_layers + 1  # every layer ran
    for i in range(model.internals.num_layers):
        if ("layers_input", i) in values:
            assert certify.difference(values[("layers_input", i)], hidden[i])[0], i
    assert certify.difference(values[("logits", None)], out.logits)[0]

    other = certify.read_places(
        model, _mllama_inputs(model, seed=1), ["layers_input", "layers_output"]
    )
    before, after = ("layers_output", layer - 1), ("layers_input", layer + 1)
    assert torch.equal(other[before], values[before])
    assert not certify.difference(other[after], values[after])[0]
    # on text only the layer is skipped: the stream passes it unchanged
    text = {"input_ids": _text_ids(model)}
    text["attention_mask"] = torch.ones_like(text["input_ids"])
    plain = certify.read_places(model, text, ["layers_input", "layers_output"])
    assert torch.equal(plain[("layers_input", layer + 1)], plain[before])
