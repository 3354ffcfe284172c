"""Audio-language wrappers (registry/tiny.yaml group audio_text_to_text, families
audio_language.yaml, granite_speech.yaml, nemotron_h.yaml's Nemotron-3.5-Transcribe,
and voxtral_realtime.yaml, whose audio is a side input added to every text position
rather than placeholder tokens) fed audio: a tiny audio tower, seeded
random mel features given to the model class directly (no feature extractor). The text
places keep their identities and transformers' own hidden states with the audio in the
input, and the audio enters the stream where the family's row says: after
embeddings_output (the placeholder tokens' own embeddings), at the tokens whose id is
the config attribute the family names (media_tokens: audio), in layers_input[0].

The text-only certification of these types is the generic one (the sweep, with
``--group audio_text_to_text``); this adds what only an audio input shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.errors import PlaceUnavailable
from causalab_mini.generated import FAMILIES, FAMILY_MATCH
from causalab_mini.generated.tiny import TINY_GROUPS, TINY_NOT_BUILDABLE, TINY_SIDE_INPUTS
from causalab_mini.positions import media_token_id
from causalab_mini.tools import certify
from causalab_mini.tools.tiny import group_model_types

from .registry_cases import skip_unless_installed
from .test_multimodal import _failed, _loaded, _with_media

GROUP = "audio_text_to_text"
AUDIO_FAMILIES = ("audio_language", "granite_speech", "nemotron_h", "omni")
# audio added to every text position (no placeholder tokens), fed by side_inputs
ALIGNED_FAMILIES = ("voxtral_realtime",)
# audio codes beside each text token in the ids themselves, (batch, seq, 1 + codebooks):
# the token batch's ids are channel 0 of a side input named input_ids (channels)
CODED_FAMILIES = ("kyutai_speech_to_text",)
# the most used, fed audio here; the group's other types are certified on text
AUDIO_FED = ("qwen2_audio",)


def test_the_audio_group_takes_the_audio_lms_and_leaves_the_speech_seq2seq_models() -> None:
    """The group is the multimodal-LM table's rest after the earlier groups: the
    decoder-only audio LMs, not the encoder-decoder speech models (whisper's kind)."""
    from transformers.models.auto import modeling_auto

    assert TINY_GROUPS[GROUP][0] == "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES"
    types = group_model_types()[GROUP]
    assert "qwen2_audio" in types and "voxtral" in types
    speech = set(modeling_auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)
    assert "whisper" in speech and "whisper" not in types
    assert not {"moonshine", "speech_to_text", "whisper"} & set(types)


def test_every_audio_type_has_a_family_or_a_reason() -> None:
    """Each type of the group is matched by an audio family whose row says where the
    audio enters, or is refused tiny with a reason of its own."""
    families = AUDIO_FAMILIES + ALIGNED_FAMILIES + CODED_FAMILIES
    matched = {t for f in families for t in FAMILY_MATCH[f].model_types}
    for family in AUDIO_FAMILIES:
        assert FAMILIES[family].media_tokens["audio"]
    for family in ALIGNED_FAMILIES:  # no placeholder: the audio is a side input
        assert not FAMILIES[family].media_tokens
        assert all(t in TINY_SIDE_INPUTS for t in FAMILY_MATCH[family].model_types)
    for family in CODED_FAMILIES:  # no placeholder: the codes are channels of the ids
        assert not FAMILIES[family].media_tokens
        for model_type in FAMILY_MATCH[family].model_types:
            row = TINY_SIDE_INPUTS[model_type]["input_ids"]
            assert row["from"] == "input_ids" and "channels" in row
    for model_type in group_model_types()[GROUP]:
        reason = TINY_NOT_BUILDABLE.get(model_type)
        assert (model_type in matched) != (reason is not None), model_type
        assert reason is None or len(reason) > 60


def _audio_inputs(model: Any, seed: int) -> dict[str, Any]:
    """``<s>``, the audio's placeholder tokens (as many as the tower gives features),
    the text; seeded random mel features of the tower's full window."""
    import torch

    config = model._model.config
    audio = config.audio_config
    frames = 2 * audio.max_source_positions  # the encoder's window (two strided convs)
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(1, audio.num_mel_bins, frames, generator=generator)
    feature_mask = torch.ones(1, frames, dtype=torch.long)
    tower = model._model.model.audio_tower
    _, lengths = tower._get_feat_extract_output_lengths(feature_mask.sum(-1))
    placeholders = torch.full((1, int(lengths[0])), media_token_id(model, "audio"))
    input_ids = _with_media(model, placeholders)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "input_features": features,
        "feature_attention_mask": feature_mask,
    }


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.wide
@pytest.mark.parametrize("model_type", [*AUDIO_FED, "nemo_speechlm"])
def test_the_audio_placeholder_is_the_rows_config_value(model_type: str) -> None:
    """media_token_id reads the attribute the family row names on the loaded config;
    a model whose families name none is refused with the row to write."""
    skip_unless_installed(model_type)
    model = _loaded(f"tiny:{model_type}")
    keys = [k for f in model.resolution.matched for k in f.media_tokens.get("audio", ())]
    config = model._model.config
    found = [getattr(config, k) for k in keys if getattr(config, k, None) is not None]
    assert found and media_token_id(model, "audio") == found[0]
    assert found[0] < config.text_config.vocab_size
    with pytest.raises(ValueError, match="unknown medium 'depth'"):
        media_token_id(model, "depth")
    # a medium the positions know (InstructBLIP-Video's) that this family names none of
    with pytest.raises(PlaceUnavailable, match="name no video placeholder token"):
        media_token_id(model, "video")


def test_a_text_model_has_no_audio_placeholder(tiny_model: Any) -> None:
    with pytest.raises(PlaceUnavailable, match="name no audio placeholder token"):
        media_token_id(tiny_model("tiny:llama"), "audio")


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.wide
@pytest.mark.parametrize("model_type", AUDIO_FED)
def test_audio_enters_at_the_placeholders_after_the_embeddings(model_type: str) -> None:
    """With audio in the input every identity and transformers' hidden states still
    hold; embeddings_output holds the placeholder tokens' own embeddings whatever the
    audio, and other audio moves layers_input[0] at every audio position and nowhere
    else."""
    import torch

    model = _loaded(f"tiny:{model_type}")
    inputs = _audio_inputs(model, seed=0)
    audio = inputs["input_ids"][0] == media_token_id(model, "audio")
    assert int(audio.sum()) > 1 and int((~audio).sum()) > 1
    from causalab_mini import positions

    # the audio anchor names those tokens; the content frame is the text around them
    anchored = positions.resolve(model, inputs, {"anchor": "audio"})[0]
    assert anchored == [int(i) for i in audio.nonzero().flatten()]
    content = positions.resolve(model, inputs, "all")[0]
    assert content and not set(content) & set(anchored)
    values = certify.read_places(model, inputs)
    checks = certify.identities(model, values) + certify.hidden_state_oracle(model, inputs, values)
    assert checks and not _failed(checks)
    assert any(c.description.startswith("hidden_states") for c in checks)
    assert {c.layer for c in checks if c.layer is not None} == set(range(len(model.layers)))

    embedded = values[("embeddings_output", None)][0]
    merged = values[("layers_input", 0)][0]
    with torch.no_grad():
        placeholder = model._model.get_input_embeddings()(inputs["input_ids"])[0]
    assert certify.difference(embedded, placeholder)[0]  # the ids' own embeddings
    assert certify.difference(merged[~audio], embedded[~audio])[0]  # text rows: as embedded
    assert not certify.difference(merged[audio], embedded[audio])[0]  # the audio is in

    other = certify.read_places(
        model, _audio_inputs(model, seed=1), ["embeddings_output", "layers_input"]
    )
    assert torch.equal(other[("embeddings_output", None)][0], embedded)
    moved = (other[("layers_input", 0)][0] - merged).abs().amax(-1)
    assert bool((moved[~audio] == 0).all())
    assert bool((moved[audio] > 0).all())


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.wide
@pytest.mark.parametrize(
    "model_type", [t for f in ALIGNED_FAMILIES for t in FAMILY_MATCH[f].model_types]
)
def test_time_aligned_audio_enters_every_position_after_the_embeddings(model_type: str) -> None:
    """Voxtral-Realtime adds one projected audio embedding to every text position, in
    place into the embedding module's output: embeddings_output keeps the tokens' own
    embeddings whatever the audio (the row's snapshot), layers_input[0] is text + audio,
    and other audio (side_inputs of another seed) moves layers_input[0] at every
    position; the identities and transformers' hidden states hold with the audio in."""
    import torch

    from causalab_mini.tools.tiny import side_inputs

    model = _loaded(f"tiny:{model_type}")
    inputs = certify.sample_inputs(model)
    assert set(TINY_SIDE_INPUTS[model_type]) <= set(inputs)
    values = certify.read_places(model, inputs)
    checks = certify.identities(model, values) + certify.hidden_state_oracle(model, inputs, values)
    assert checks and not _failed(checks)
    assert any(c.description.startswith("hidden_states") for c in checks)

    embedded = values[("embeddings_output", None)]
    with torch.no_grad():
        own = model._model.get_input_embeddings()(inputs["input_ids"])
    assert certify.difference(embedded, own)[0]  # the ids' own embeddings, no audio
    assert not certify.difference(values[("layers_input", 0)], embedded)[0]

    hf = model._model
    other = {**inputs, **side_inputs(hf.config, *inputs["input_ids"].shape, seed=1)}
    again = certify.read_places(model, other, ["embeddings_output", "layers_input"])
    assert torch.equal(again[("embeddings_output", None)], embedded)
    moved = (again[("layers_input", 0)] - values[("layers_input", 0)]).abs().amax(-1)
    assert bool((moved > 0).all())


def test_a_side_input_dimension_may_be_a_multiple_of_the_token_batch() -> None:
    """A side_inputs dimension {seq: true, config: path, times: n} is the token batch's
    seq times the config value times n: Voxtral-Realtime's log-mel frames, 2 *
    downsample_factor per text position."""
    from causalab_mini.tools.tiny import side_inputs, tiny_config

    config = tiny_config("voxtral_realtime")
    features = side_inputs(config, 2, 5)["input_features"]
    frames = 5 * 2 * config.downsample_factor
    assert tuple(features.shape) == (2, config.audio_config.num_mel_bins, frames)
    assert tuple(side_inputs(config, 1, 3)["input_features"].shape)[-1] == frames * 3 // 5


def test_a_side_input_may_carry_code_channels_beside_the_token_ids() -> None:
    """A side input with from and channels is the token batch's tensor as channel 0 of
    a new last axis, then that many channels of seeded codes below the row's bound:
    Kyutai-STT's input_ids, each position's text token and its frame's audio codes
    (one per codebook, below the codec's codebook size), replacing the token batch's."""
    import torch

    from causalab_mini.tools.tiny import side_inputs, tiny_config

    config = tiny_config("kyutai_speech_to_text")
    ids = torch.arange(10).reshape(2, 5) + 3
    tokens = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    made = side_inputs(config, 2, 5, tokens=tokens)
    assert set(made) == {"input_ids"}
    coded = made["input_ids"]
    assert tuple(coded.shape) == (2, 5, 1 + config.num_codebooks)
    assert coded.dtype == ids.dtype and torch.equal(coded[..., 0], ids)
    codes = coded[..., 1:]
    assert int(codes.min()) >= 0 and int(codes.max()) < config.codec_config.codebook_size
    assert torch.equal(side_inputs(config, 2, 5, tokens=tokens)["input_ids"], coded)
    other = side_inputs(config, 2, 5, seed=1, tokens=tokens)["input_ids"]
    assert torch.equal(other[..., 0], ids) and not torch.equal(other, coded)


@pytest.mark.semantic
@pytest.mark.parametrize(
    "model_type", [t for f in CODED_FAMILIES for t in FAMILY_MATCH[f].model_types]
)
def test_audio_codes_enter_through_the_ids_and_their_embeddings_sum(model_type: str) -> None:
    """Kyutai-STT reads each position as a text token and its audio codes: a batch of
    text ids alone fails in its embedding; fed the sweep's ids (text, then seeded
    codes), embeddings_input holds them whole, embeddings_output is the sum of the
    table rows of the text id and of each code offset into its codebook's range (by
    hand, from the config: vocab_size + k * codebook_vocab_size), which is
    layers_input[0]; other codes move it at every position; the identities and
    transformers' hidden states hold."""
    import torch

    model = _loaded(f"tiny:{model_type}")
    hf, inputs = model._model, certify.sample_inputs(model)
    config, ids = hf.config, inputs["input_ids"]
    assert tuple(ids.shape)[2:] == (1 + config.num_codebooks,)
    text = {"input_ids": ids[..., 0], "attention_mask": inputs["attention_mask"]}
    with pytest.raises(RuntimeError), torch.no_grad():
        hf(**text)

    values = certify.read_places(model, inputs)
    checks = certify.identities(model, values) + certify.hidden_state_oracle(model, inputs, values)
    assert checks and not _failed(checks)
    assert any(c.description.startswith("hidden_states") for c in checks)
    assert torch.equal(values[("embeddings_input", None)], ids)
    offsets = [0] + [
        config.vocab_size + k * config.codebook_vocab_size for k in range(ids.shape[2] - 1)
    ]
    rows = ids + torch.tensor(offsets)
    rows = torch.where(ids == config.audio_pad_token_id, ids, rows)
    table = hf.model.embed_tokens.embed_tokens.weight
    embedded = values[("embeddings_output", None)]
    assert certify.difference(embedded, table[rows].sum(2))[0]
    assert certify.difference(values[("layers_input", 0)], embedded)[0]

    other = ids.clone()
    other[..., 1:] = (ids[..., 1:] + 1) % config.codec_config.codebook_size
    again = certify.read_places(model, {**inputs, "input_ids": other}, ["embeddings_output"])
    moved = (again[("embeddings_output", None)] - embedded).abs().amax(-1)
    assert bool((moved > 0).all())
