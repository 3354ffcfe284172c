"""Image-text-to-text wrappers (families/vision_language.yaml) fed an image: tiny
vision towers, random pixel tensors given to the model classes directly (no image
processor: several need torchvision). The text places keep their identities and
transformers' own hidden states with the image in the input, and the image enters
the stream where the family's rows say: after embeddings_output (the placeholder
tokens' own embeddings), at the placeholders of layers_input[0].

The text-only certification of these types is the generic one (tests/test_families.py,
tests/test_internals.py, the sweep); this adds what only an image input shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.generated import FAMILY_LOADING, FAMILY_MATCH
from causalab_mini.positions import media_token_id
from causalab_mini.tools import certify

from .test_multimodal import _failed, _loaded, _with_media

pytestmark = [pytest.mark.slow, pytest.mark.semantic, pytest.mark.wide]

FAMILY = "vision_language"
# the ten most used (issue 24), fed an image here; the family's other types are
# certified on text
IMAGE_FED = (
    "llava",
    "llava_next",
    "llava_onevision",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "mistral3",
    "idefics3",
    "paligemma",
    "smolvlm",
)


def _pixels(model_type: str, config: Any, generator: Any) -> dict[str, Any]:
    """The pixel inputs of one random image, in the layout the model class takes
    (what its image processor would hand it)."""
    import torch

    vision = config.vision_config
    size = getattr(vision, "image_size", 32)
    if model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        # flattened patches (t * h * w, channels * temporal * patch * patch), a grid of
        # 1 x 4 x 4 patches that the merger pools 2 x 2
        t, h, w = 1, 2 * vision.spatial_merge_size, 2 * vision.spatial_merge_size
        width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        return {
            "pixel_values": torch.randn(t * h * w, width, generator=generator),
            "image_grid_thw": torch.tensor([[t, h, w]]),
        }
    if model_type in ("idefics3", "smolvlm"):  # (batch, images, channels, h, w)
        return {"pixel_values": torch.randn(1, 1, 3, size, size, generator=generator)}
    if model_type == "mistral3":
        return {
            "pixel_values": torch.randn(1, 3, size, size, generator=generator),
            "image_sizes": torch.tensor([[size, size]]),
        }
    if model_type in ("llava_next", "llava_onevision"):  # the base image and its tiles
        size = config.image_grid_pinpoints[0][0]
        tiles = 1 + (config.image_grid_pinpoints[0][0] // vision.image_size) * (
            config.image_grid_pinpoints[0][1] // vision.image_size
        )
        side = vision.image_size
        return {
            "pixel_values": torch.randn(1, tiles, 3, side, side, generator=generator),
            "image_sizes": torch.tensor([config.image_grid_pinpoints[0]]),
        }
    return {"pixel_values": torch.randn(1, 3, size, size, generator=generator)}


def _feature_rows(features: Any) -> int:
    """How many placeholder tokens the image's features fill: the rows of what
    get_image_features returns (a tensor, a list of them, or a model output)."""
    import torch

    if not isinstance(features, (torch.Tensor, list, tuple)):
        features = features.pooler_output
    if isinstance(features, (list, tuple)):
        return sum(_feature_rows(f) for f in features)
    return int(features.reshape(-1, features.shape[-1]).shape[0])


def _image_inputs(model: Any, seed: int) -> dict[str, Any]:
    """``<s>``, the image's placeholder tokens (as many as its features), the text."""
    import torch

    config = model._model.config
    pixels = _pixels(model.model_type, config, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        rows = _feature_rows(model._model.model.get_image_features(**pixels))
    image_id = media_token_id(model, "image")
    image = torch.full((1, rows), image_id)
    input_ids = _with_media(model, image)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), **pixels}
    if model.model_type == "paligemma":  # the image and the prompt are its prefix
        inputs["token_type_ids"] = torch.zeros_like(input_ids)
    if "image_grid_thw" in pixels:  # which tokens are the image's (multimodal rotary)
        inputs["mm_token_type_ids"] = (input_ids == image_id).long()
    return inputs


def _image_id(model: Any) -> int:
    config = model._model.config
    found = getattr(config, "image_token_id", None)
    return int(found if found is not None else config.image_token_index)


def test_the_image_fed_types_are_the_familys() -> None:
    assert set(IMAGE_FED) <= set(FAMILY_MATCH[FAMILY].model_types)


@pytest.mark.parametrize("model_type", IMAGE_FED)
def test_an_image_enters_at_the_placeholders_after_the_embeddings(model_type: str) -> None:
    """With an image in the input every identity and transformers' hidden states still
    hold; embeddings_output holds the placeholder tokens' own embeddings whatever the
    pixels, and other pixels change layers_input[0] at the image's positions only."""
    import torch

    model = _loaded(f"tiny:{model_type}")
    inputs = _image_inputs(model, seed=0)
    image = inputs["input_ids"][0] == _image_id(model)
    assert int(image.sum()) > 0
    values = certify.read_places(model, inputs)
    checks = certify.identities(model, values) + certify.hidden_state_oracle(model, inputs, values)
    assert checks and not _failed(checks)
    assert any(c.description.startswith("hidden_states") for c in checks)

    embedded = values[("embeddings_output", None)][0]
    merged = values[("layers_input", 0)][0]
    with torch.no_grad():
        placeholder = model._model.get_input_embeddings()(inputs["input_ids"])[0]
    assert certify.difference(embedded, placeholder)[0]  # the ids' own embeddings
    assert not certify.difference(merged[image], embedded[image])[0]  # the image is in

    other = certify.read_places(
        model, _image_inputs(model, seed=1), ["embeddings_output", "layers_input"]
    )
    assert torch.equal(other[("embeddings_output", None)][0], embedded)
    moved = (other[("layers_input", 0)][0] - merged).abs().amax(-1)
    assert bool((moved[~image] == 0).all())
    # every image row moves but the learned row LLaVA-NeXT puts at the end of each
    # line of tiles (image_newline, the same whatever the pixels)
    still = merged[image][moved[image] == 0]
    newline = getattr(model._model.model, "image_newline", None)
    if newline is None:
        assert not len(still)
    else:
        assert len(still) < int(image.sum()) // 2
        assert bool((still == newline.detach()).all())


def _feature_tensor(features: Any) -> Any:
    """What get_image_features returns (a tensor, a list of them, or a model output)
    as one (rows, width) tensor, in the order the rows fill the placeholders."""
    import torch

    if not isinstance(features, (torch.Tensor, list, tuple)):
        features = features.pooler_output
    if isinstance(features, (list, tuple)):
        return torch.cat([_feature_tensor(f) for f in features])
    return features.reshape(-1, features.shape[-1])


@pytest.mark.parametrize("model_type", ["llava", "mistral3"])
def test_the_image_anchor_is_where_the_image_tokens_sit(model_type: str) -> None:
    """{"anchor": "image"} names the positions of the image's placeholder tokens (the
    id the family's media_tokens field reads from the loaded config), the content
    frame keeps only the text's tokens, and a read of block_input[0] at the anchor is
    the image features the model put there."""
    import torch

    from causalab_mini import positions as P
    from causalab_mini.locator import locate
    from causalab_mini.plan import Plan

    model = _loaded(f"tiny:{model_type}")
    inputs = _image_inputs(model, seed=0)
    ids = inputs["input_ids"]
    image_id = _image_id(model)
    assert P.media_token_ids(model)[0] == {"image": image_id}
    where = [
        [i for i in range(ids.shape[1]) if int(ids[r, i]) == image_id] for r in range(len(ids))
    ]
    assert where[0]
    assert P.resolve(model, inputs, {"anchor": "image"}) == where
    # the text's first and last tokens, around the image (BOS, image, text)
    text = [i for i in range(1, ids.shape[1]) if i not in where[0]]
    assert P.resolve(model, inputs, {"index": 0}) == [[text[0]]]
    assert P.resolve(model, inputs, {"index": -1}) == [[text[-1]]]
    assert P.resolve(model, inputs, "all") == [text]

    at = locate(model, "block_input", 0, position={"anchor": "image"})
    whole = locate(model, "block_input", 0)
    got = Plan.of([at, whole]).run(model, inputs)
    pixels = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    pixels.pop("token_type_ids", None)
    with torch.no_grad():
        features = _feature_tensor(model._model.model.get_image_features(**pixels))
    assert got[at].shape == (1, len(where[0]), model.hidden_size)
    torch.testing.assert_close(got[at][0], features, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[at][0], got[whole][0, where[0]])


def test_the_image_anchor_is_refused_without_image_tokens() -> None:
    """A text input holds no image token, and a model whose family names no image
    placeholder has none: both refused, each with its one-line reason."""
    from causalab_mini import positions as P

    model = _loaded("tiny:llava")
    with pytest.raises(P.PositionError, match="holds no image token"):
        P.resolve(model, ["The quick brown fox"], {"anchor": "image"})
    text_only = _loaded("tiny:llama")
    with pytest.raises(P.PositionError, match="name no image placeholder"):
        P.resolve(text_only, ["The quick brown fox"], {"anchor": "image"})


# ------------------------------------------- BLIP-2, InstructBLIP: queries, not pixels


def _query_inputs(model: Any, seed: int) -> dict[str, Any]:
    """``<s>``, num_query_tokens image placeholders, the text; random pixels (and, for
    InstructBLIP, the Q-Former's instruction: the same ids, as its processor gives)."""
    import torch

    config = model._model.config
    size = config.vision_config.image_size
    generator = torch.Generator().manual_seed(seed)
    # InstructBLIP-Video: a video of 2 frames, each frame's queries at its placeholders
    frames = (2,) if model.model_type == "instructblipvideo" else ()
    image = torch.full((1, config.num_query_tokens * (frames or (1,))[0]), _query_id(model))
    input_ids = _with_media(model, image)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": torch.randn(1, *frames, 3, size, size, generator=generator),
    }
    if model.model_type in ("instructblip", "instructblipvideo"):
        inputs["qformer_input_ids"] = input_ids.clone()
        inputs["qformer_attention_mask"] = torch.ones_like(input_ids)
    return inputs


def _medium(model: Any) -> str:
    return "video" if model.model_type == "instructblipvideo" else "image"


def _query_id(model: Any) -> int:
    return media_token_id(model, _medium(model))


@pytest.mark.parametrize("model_type", ["blip-2", "instructblip", "instructblipvideo"])
def test_the_query_outputs_fill_the_placeholders_nothing_is_prepended(model_type: str) -> None:
    """BLIP-2 (transformers >= 5) writes the projected Q-Former query outputs over the
    image placeholders, num_query_tokens of them (InstructBLIP-Video's over the video
    placeholders, num_query_tokens per frame): the stream is as long as the token
    ids (no query prefix shifts the text), every identity and the language model's own
    hidden states (oracle_module) hold, the image (video) anchor is the placeholders,
    the content frame leaves them out, and other pixels move layers_input[0] at the placeholders only."""
    import torch

    from causalab_mini import positions as P

    model = _loaded(f"tiny:{model_type}")
    inputs = _query_inputs(model, seed=0)
    ids = inputs["input_ids"]
    image = ids[0] == _query_id(model)
    values = certify.read_places(model, inputs)
    checks = certify.identities(model, values) + certify.hidden_state_oracle(model, inputs, values)
    assert checks and not _failed(checks)
    assert any(c.description.startswith("hidden_states") for c in checks)
    merged = values[("layers_input", 0)][0]
    assert merged.shape[0] == ids.shape[1]  # one stream row per token id
    with torch.no_grad():
        placeholder = model._model.get_input_embeddings()(ids)[0]
    assert certify.difference(values[("embeddings_output", None)][0], placeholder)[0]
    assert P.resolve(model, inputs, {"anchor": _medium(model)}) == [
        [int(i) for i in image.nonzero().flatten()]
    ]
    text = [i for i in range(1, ids.shape[1]) if not image[i]]
    assert P.resolve(model, inputs, "all") == [text]  # the queries are not text
    other = certify.read_places(model, _query_inputs(model, seed=1), ["layers_input"])
    moved = (other[("layers_input", 0)][0] - merged).abs().amax(-1)
    assert bool((moved[~image] == 0).all()) and bool((moved[image] > 0).all())


def test_the_oracles_read_the_text_decoders_own_output() -> None:
    """BLIP's wrapper returns its vision tower's hidden states; the family's
    oracle_module makes the oracles read the text decoder's own, one entry per layer
    and the embeddings, of the text's shape, in the same forward as the logits."""
    import torch

    model = _loaded("tiny:blip")
    assert model.oracle_module == "text_decoder"
    inputs = certify.sample_inputs(model)
    with torch.no_grad():
        whole = model._model(**inputs, output_hidden_states=True)
    text = (*inputs["input_ids"].shape, model.hidden_size)
    assert tuple(whole.hidden_states[0].shape) != text  # the image's patches
    held = certify.oracle_outputs(model, inputs, output_hidden_states=True)
    assert len(held.hidden_states) == model.internals.num_layers + 1
    assert all(tuple(h.shape) == text for h in held.hidden_states)
    assert torch.equal(held.logits, whole.logits)
    values = certify.read_places(model, inputs)
    # a BERT-style stack: the entries are the embeddings' and each block's output, the
    # norm sits in the LM head (the sweep's final_norm check knows: stream_ends_at_block)
    checks = [
        c
        for c in certify.hidden_state_oracle(model, inputs, values)
        if c.description != "hidden_states[-1] == ln_final_output"
    ]
    last = model.internals.num_layers - 1
    checks.append(
        certify.compare(
            "hidden_states[-1] == layers_output[-1]",
            last,
            values[("layers_output", last)],
            held.hidden_states[-1],
        )
    )
    assert len(checks) > 2 and not _failed(checks)


def test_kosmos2_reads_an_empty_image_on_text() -> None:
    """Kosmos-2's text-only input is an image of no rows and a position mask of zeros
    (registry/tiny.yaml side_inputs, an axis of size 0): no token is overwritten, so
    the stream is the text's own."""
    from causalab_mini.tools.tiny import side_inputs

    model = _loaded("tiny:kosmos-2")
    fed = side_inputs(model._model.config, 2, 5)
    assert tuple(fed["image_embeds"].shape) == (2, 0, model.hidden_size)
    assert tuple(fed["image_embeds_position_mask"].shape) == (2, 5)
    assert not fed["image_embeds_position_mask"].any()


_META_BUILD_UNAVAILABLE = sorted(
    model_type
    for family, loading in FAMILY_LOADING.items()
    if loading.meta_build_unavailable
    for model_type in FAMILY_MATCH[family].model_types
)


@pytest.mark.parametrize("model_type", _META_BUILD_UNAVAILABLE)
def test_a_model_nnsight_cannot_build_on_meta_loads_with_its_weights(model_type: str) -> None:
    """A family whose construction computes from tensor values (meta_build_unavailable)
    loads with its weights at once, where nnsight's meta build would fail: the model is
    dispatched when the constructor returns, and its trace reads the model's own
    logits."""
    import torch

    from causalab_mini import StandardizedTransformer

    model = StandardizedTransformer(f"tiny:{model_type}")
    assert model.dispatched
    batch = model.tokenizer(["The quick brown fox"], return_tensors="pt")
    with model.trace(batch["input_ids"]):
        logits = model.logits.save()
    with torch.no_grad():
        want = model._model(input_ids=batch["input_ids"]).logits
    assert torch.equal(logits, want)


@pytest.mark.parametrize("model_type", _META_BUILD_UNAVAILABLE)
def test_meta_build_unavailable_says_what_nnsight_meets(model_type: str) -> None:
    """The fact is true: told to build on meta first (dispatch=False, which the loader
    leaves as the caller gives it), nnsight's meta build of the model fails on a tensor
    value."""
    from causalab_mini import StandardizedTransformer, compat

    if not compat.is_08():
        pytest.skip("measured with nnsight 0.8's meta build (every tensor made on meta)")
    with pytest.raises(RuntimeError, match="meta tensors"):
        StandardizedTransformer(f"tiny:{model_type}", dispatch=False)
