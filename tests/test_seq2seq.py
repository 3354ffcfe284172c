"""Encoder-decoder models loaded whole (registry/tiny.yaml group seq2seq): the decoder's
blocks are of a structure of their own (pre_norm_cross: T5; post_ln_cross: BART;
sandwich_norm_cross: T5Gemma),
whose cross-attention's contribution and the stream around it are places with
identities, and the encoder's blocks are places of their own (encoder_layers_*),
distinct from the decoder's, ranked before them, held to transformers' own
encoder_hidden_states and writable.

One tiny T5 (pre-norm, relative position bias, sublayers that add the residual
themselves), one tiny BART (post-LN) and one tiny T5Gemma (sandwich norms) in the
README tier; the rest of the group
under the wide marker."""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.tools import certify as cert

pytestmark = [pytest.mark.semantic]

# the two shapes: pre-norm T5 with relative bias, post-LN BART (the whole model: its
# decoder alone, BartForCausalLM, is tiny:bart in the causal_lm group)
SHAPES = {
    "tiny:t5": ("pre_norm_cross", "layers_mid_cross"),
    "tiny:seq2seq/bart": ("post_ln_cross", "layers_mid_cross_prenorm"),
    # sandwich norms around all three sublayers, one embedding table per stack
    "tiny:t5gemma": ("sandwich_norm_cross", "layers_mid_cross"),
}


def _read(model: Any, names: list[str], inputs: dict[str, Any]) -> dict[tuple[str, Any], Any]:
    values: dict[tuple[str, Any], Any] = cert.read_places(model, inputs, names)
    return values


def _outputs(model: Any, inputs: dict[str, Any], **flags: bool) -> Any:
    import torch

    given = cert.forward_inputs(model, inputs)  # a trace first: the weights are loaded
    with torch.no_grad():
        return model._model(**given, **flags)


def test_group_takes_the_whole_models() -> None:
    """T5 is in the seq2seq group; BART is in both, as two members: its decoder alone
    (causal_lm, bart) and the whole model (seq2seq, seq2seq/bart), built with their own
    auto classes."""
    from causalab_mini.tools import tiny

    groups = tiny.group_model_types()
    assert "t5" in groups["seq2seq"] and "seq2seq/bart" in groups["seq2seq"]
    assert "bart" in groups["causal_lm"] and "bart" not in groups["seq2seq"]
    assert "t5" not in groups["causal_lm"]
    assert tiny.group_of("seq2seq/bart") == "seq2seq" and tiny.group_of("bart") == "causal_lm"
    assert tiny.build_class("seq2seq/bart") == "AutoModelForSeq2SeqLM"
    assert tiny.build_class("t5") == "AutoModelForSeq2SeqLM"
    assert tiny.build_class("bart") == "AutoModelForCausalLM"
    with pytest.raises(tiny.TinyBuildError, match="write tiny:t5"):
        tiny.build_tiny("seq2seq/t5")  # t5 is a plain member: no second spelling


@pytest.mark.parametrize("spec", list(SHAPES))
def test_cross_attention_identity(tiny_model: Any, spec: str) -> None:
    """The stream after the cross-attention's add is the stream before it plus the
    cross-attention's contribution, on every layer, and that contribution is neither
    zero nor the self-attention's (the identity could fail)."""
    import torch

    model = tiny_model(spec)
    structure, after = SHAPES[spec]
    assert model.block_structure == structure
    assert model._model.config.is_encoder_decoder
    inputs = cert.sample_inputs(model)
    rows = {r for text in cert.structure_identities(model) for r in cert.identity_rows(text)}
    names = sorted(rows | {"layers_mid", "cross_attentions_output", after, "attentions_output"})
    v = _read(model, names, inputs)
    for layer in range(model.internals.num_layers):
        mid, cross = v[("layers_mid", layer)], v[("cross_attentions_output", layer)]
        assert torch.allclose(v[(after, layer)], mid + cross, atol=1e-5, rtol=1e-4)
        assert cross.abs().max() > 1e-3
        assert not torch.allclose(cross, v[("attentions_output", layer)], atol=1e-3)
    checks = cert.identities(model, v)
    cross_identity = f"{after} == layers_mid + cross_attentions_output"
    assert {c.description for c in checks} >= {cross_identity}
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]


@pytest.mark.parametrize("spec", list(SHAPES))
def test_encoder_and_decoder_places_are_distinct(tiny_model: Any, spec: str) -> None:
    """encoder_layers_input[i] is transformers' encoder_hidden_states[i], layers_input[i]
    its decoder_hidden_states[i]; the encoder's outputs are not the decoder's; the
    encoder's places rank before every decoder place and read in one trace with them."""
    import torch

    model = tiny_model(spec)
    inputs = cert.sample_inputs(model)
    n = model.internals.num_layers
    out = _outputs(model, inputs, output_hidden_states=True)
    names = ["encoder_layers_input", "encoder_layers_output", "layers_input", "layers_output"]
    v = _read(model, names, inputs)
    for i in range(n):
        assert torch.allclose(
            v[("encoder_layers_input", i)], out.encoder_hidden_states[i], atol=1e-5
        )
        assert torch.allclose(v[("layers_input", i)], out.decoder_hidden_states[i], atol=1e-5)
        assert not torch.allclose(
            v[("encoder_layers_output", i)], v[("layers_output", i)], atol=1e-3
        )
        if i + 1 < n:
            assert torch.allclose(
                v[("encoder_layers_output", i)], v[("encoder_layers_input", i + 1)], atol=1e-6
            )
    internals = model.internals
    assert internals.rank("encoder_layers_output", n - 1) < internals.rank("embeddings_output")
    assert internals.rank("embeddings_output") < internals.rank("layers_input", 0)


@pytest.mark.parametrize("spec", list(SHAPES))
def test_encoder_write_reaches_the_decoder(tiny_model: Any, spec: str) -> None:
    """A write at the encoder's last block output: the value read before it keeps its
    clean value, the value read after it is the written one, and the decoder's
    cross-attention (which reads the encoder's states) changes while the decoder's
    self-attention on layer 0 does not."""
    import torch

    model = tiny_model(spec)
    inputs = cert.sample_inputs(model)
    internals = model.internals
    last = internals.num_layers - 1
    clean = _read(
        model, ["encoder_layers_output", "attentions_output", "cross_attentions_output"], inputs
    )
    box: dict[str, Any] = {}
    torch.manual_seed(0)
    with model.trace(inputs):
        before = internals["encoder_layers_output"][last]
        box["before"] = before.clone().save()
        delta = torch.randn_like(before) * 0.5
        box["written"] = (before + delta).clone().save()
        internals["encoder_layers_output"][last] = before + delta
        box["after"] = internals["encoder_layers_output"][last].save()
        box["self"] = internals["attentions_output"][0].save()
        box["cross"] = internals["cross_attentions_output"][0].save()
    value = {k: getattr(t, "value", t) for k, t in box.items()}
    assert torch.allclose(value["before"], clean[("encoder_layers_output", last)], atol=1e-6)
    assert torch.allclose(value["after"], value["written"], atol=1e-6)
    assert not torch.allclose(value["after"], value["before"], atol=1e-3)
    assert torch.allclose(value["self"], clean[("attentions_output", 0)], atol=1e-5)
    assert not torch.allclose(value["cross"], clean[("cross_attentions_output", 0)], atol=1e-4)


@pytest.mark.parametrize("spec", list(SHAPES))
def test_sweep_certifies_the_decoder(certified: Any, spec: str) -> None:
    """The sweep certifies the decoder with the causal LMs' checks; the cross-attention
    identities are among the ones that covered block_mid."""
    result = certified(spec)
    assert result.outcome == "certified", result.reason
    assert result.group == "seq2seq"
    broken = {k: v for k, v in result.components.items() if v["state"] == "broken"}
    assert not broken
    checks = result.components["block_mid"]["checks"]
    assert any("cross_attentions_output" in c for c in checks)
    assert any("with a written layers_mid" in c for c in checks)


@pytest.mark.parametrize("spec", list(SHAPES))
def test_cross_attention_probabilities_oracle(tiny_model: Any, spec: str) -> None:
    """transformers' own cross_attentions (eager) are the cross_attention_probabilities
    place on every layer, and its decoder_attentions the self-attention's (the two are
    distinct tensors: encoder keys vs decoder keys), and softmax of nothing else: each
    row of the cross-attention's probabilities sums to one over the encoder's keys."""
    import torch

    model = tiny_model(spec, probs=True)
    inputs = cert.sample_inputs(model)
    out = _outputs(model, inputs, output_attentions=True)
    v = _read(model, ["cross_attention_probabilities", "attention_probabilities"], inputs)
    for layer in range(model.internals.num_layers):
        cross = v[("cross_attention_probabilities", layer)]
        assert torch.allclose(cross, out.cross_attentions[layer], atol=1e-6)
        own = v[("attention_probabilities", layer)]
        assert torch.allclose(own, out.decoder_attentions[layer], atol=1e-6)
        assert torch.allclose(cross.sum(-1), torch.ones_like(cross.sum(-1)), atol=1e-5)
        assert not torch.allclose(cross, own, atol=1e-3)


def test_cross_attention_probabilities_need_eager(tiny_model: Any) -> None:
    """Without enable_attention_probs the cross-attention's probabilities are refused
    with the reason and what to write instead."""
    from causalab_mini.internals import PlaceUnavailable

    model = tiny_model("tiny:t5")
    with pytest.raises(PlaceUnavailable, match="enable_attention_probs=True"):
        with model.trace(cert.sample_inputs(model)):
            model.internals["cross_attention_probabilities"][0].save()


def test_embeddings_oracle_is_the_decoders_table(tiny_model: Any) -> None:
    """On an encoder-decoder whose stacks have a table each (T5Gemma), the sweep's
    embeddings oracle is the decoder's table (get_decoder().get_input_embeddings()),
    which the place matches, not get_input_embeddings(), the encoder's, which it
    does not."""
    import torch

    from causalab_mini.tools import checks

    model = tiny_model("tiny:t5gemma")
    inputs = cert.sample_inputs(model)
    v = _read(model, ["embeddings_output"], inputs)  # a trace first: the weights loaded
    hf = model._model
    table = checks.input_embeddings(hf)
    assert table is hf.get_decoder().get_input_embeddings()
    assert table is not hf.get_input_embeddings()
    ids = inputs["input_ids"]
    with torch.no_grad():
        assert torch.allclose(v[("embeddings_output", None)], table(ids), atol=1e-6)
        assert not torch.allclose(
            v[("embeddings_output", None)], hf.get_input_embeddings()(ids), atol=1e-3
        )


def test_text_config_name_gives_the_decoders_config(tiny_model: Any) -> None:
    """T5GemmaConfig nests its stacks' configs (encoder, decoder) and has no widths of
    its own: the family's text_config_name makes the decoder's config the model's text
    config, and its widths and head count the model's (nnterp finds none at the top)."""
    model = tiny_model("tiny:t5gemma")
    decoder = model._model.config.decoder
    assert model.text_config is decoder
    assert getattr(model._model.config, "hidden_size", None) is None
    assert model.hidden_size == decoder.hidden_size
    assert model.num_heads == decoder.num_attention_heads
    assert model.vocab_size == decoder.vocab_size


def test_fsmt_decoder_table_is_the_embeddings_oracle(tiny_model: Any) -> None:
    """FSMT keeps a table per stack, its decoder is a plain module (no
    get_input_embeddings) and its get_output_embeddings() names the decoder's table
    (the head is tied to it): that table is the embeddings oracle, the encoder's
    (get_input_embeddings()) is not, and the place matches the one, not the other."""
    import torch

    from causalab_mini.tools import checks

    model = tiny_model("tiny:fsmt")
    inputs = cert.sample_inputs(model)
    v = _read(model, ["embeddings_output", "layers_input"], inputs)  # the weights loaded
    hf = model._model
    table = checks.input_embeddings(hf)
    assert isinstance(hf.get_output_embeddings(), torch.nn.Embedding)
    assert table is hf.get_output_embeddings() and table is not hf.get_input_embeddings()
    ids = inputs["input_ids"]
    with torch.no_grad():
        assert torch.allclose(v[("embeddings_output", None)], table(ids), atol=1e-6)
        assert not torch.allclose(
            v[("embeddings_output", None)], hf.get_input_embeddings()(ids), atol=1e-3
        )
    # time-major inside the stack, read batch first (seq_first)
    assert v[("layers_input", 0)].shape[:2] == ids.shape


# the group's members with rows (registry/block_structures.yaml pre_norm_cross and
# post_ln_cross rules), beyond the two above
WIDE = (
    "mt5",
    "umt5",
    "longt5",
    "switch_transformers",
    "m2m_100",
    "pegasus_x",
    "led",
    "seq2seq/mbart",
    "seq2seq/pegasus",
    "seq2seq/blenderbot",
    "seq2seq/bigbird_pegasus",
    "seq2seq/marian",
    "seq2seq/plbart",
    "seq2seq/mvp",
    "seq2seq/blenderbot-small",
    "seq2seq/prophetnet",
    "nllb-moe",
    "fsmt",
    "seamless_m4t",
    "seamless_m4t_v2",
    "encoder-decoder",
)


@pytest.mark.wide
@pytest.mark.slow
@pytest.mark.parametrize("member", WIDE)
def test_group_member_certified(member: str) -> None:
    """Each member with rows: certified by the sweep with nothing broken, of a cross
    structure, its cross-attention identity among the checks that held."""
    from causalab_mini.tools.sweep import run_one

    result = run_one(f"tiny:{member}")
    assert result.outcome == "certified", result.reason
    assert result.group == "seq2seq"
    assert result.structure in ("pre_norm_cross", "post_ln_cross", "sandwich_norm_cross")
    assert not [k for k, v in result.components.items() if v["state"] == "broken"]
    assert any("cross_attentions_output" in c for c in result.components["block_mid"]["checks"])


# encoder-decoders of the image_text_to_text group whose decoder blocks hold a
# cross-attention: fed an image (or flattened patches, or bounding boxes) and the
# decoder's tokens as data (registry/tiny.yaml side_inputs)
IMAGE_WIDE = ("pix2struct", "udop", "vision-encoder-decoder", "pp_formulanet", "florence2")


@pytest.mark.wide
@pytest.mark.slow
@pytest.mark.parametrize("member", IMAGE_WIDE)
def test_image_encoder_decoder_certified(member: str) -> None:
    """Each image encoder-decoder: certified with nothing broken, of a cross structure,
    its cross-attention identity among the checks that held."""
    from causalab_mini.tools.sweep import run_one

    result = run_one(f"tiny:{member}")
    assert result.outcome == "certified", result.reason
    assert result.group == "image_text_to_text"
    assert result.structure in ("pre_norm_cross", "post_ln_cross")
    assert not [k for k, v in result.components.items() if v["state"] == "broken"]
    assert any("cross_attentions_output" in c for c in result.components["block_mid"]["checks"])


@pytest.mark.wide
@pytest.mark.slow
def test_merged_cross_attention_probabilities() -> None:
    """T5Gemma 2's decoder attention is self- and cross-attention in one softmax: its
    probabilities are certified against transformers' decoder_attentions and
    cross_attentions side by side (families/t5gemma2.yaml merged_cross_attention)."""
    from causalab_mini.tools.sweep import run_one

    result = run_one("tiny:t5gemma2")
    assert result.outcome == "certified", result.reason
    assert not [k for k, v in result.components.items() if v["state"] == "broken"]
    checks = result.components["attention_probs"]["checks"]
    assert "cat(decoder_attentions, cross_attentions) == attention_probs" in checks


def test_side_inputs_absent_uniform_plus() -> None:
    """A side input may be absent (the token mask not handed to an image encoder), a
    seeded uniform range (Pix2Struct's patch rows and columns, UDOP's boxes), and a
    config width plus a constant (the patch's row and column before its pixels); the
    decoder's inputs are the token batch's own."""
    import torch

    from causalab_mini.tools.tiny import side_inputs, tiny_config

    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    tokens = {"input_ids": ids, "attention_mask": (ids > 0).long()}
    config = tiny_config("pix2struct")
    made = side_inputs(config, 2, 3, tokens=tokens)
    assert made["attention_mask"] is None
    assert made["decoder_input_ids"].equal(ids)
    assert made["decoder_attention_mask"].equal(tokens["attention_mask"])
    patches = made["flattened_patches"]
    width = config.vision_config.patch_embed_hidden_size + 2
    assert tuple(patches.shape) == (2, 16, width)
    assert patches.min() >= 0.0 and patches.max() < 4.0
    assert patches[..., :2].long().max() < config.vision_config.seq_len
    boxes = side_inputs(tiny_config("udop"), 2, 3, tokens=tokens)["bbox"]
    assert tuple(boxes.shape) == (2, 3, 4) and boxes.min() >= 0.0 and boxes.max() < 1.0
    assert side_inputs(tiny_config("udop"), 2, 3, tokens=tokens)["bbox"].equal(boxes)


def test_composite_sub_configs_are_shrunk() -> None:
    """A sub-config that is itself composite and holds a text config (T5Gemma 2's
    encoder: its text and vision configs) is shrunk as a whole config, so its text
    stack is as wide as the decoder (T5Gemma2Config refuses an imbalanced pair)."""
    from causalab_mini.tools.tiny import tiny_config

    config = tiny_config("t5gemma2")
    encoder = config.encoder
    assert encoder.text_config.hidden_size == config.decoder.hidden_size == 64
    assert encoder.vision_config.hidden_size == 64
    assert encoder.vision_config.num_hidden_layers == 3


def test_an_encoder_decoders_text_config_is_its_decoders() -> None:
    """Where an encoder-decoder keeps its decoder's config apart (no text_config), its
    family names the decoder's as the places' text config (text_config_name): its head
    count and width, which nnterp does not find at the top; a family may load a model whose
    constructor cannot run on the meta device with its weights (meta_build_unavailable)."""
    from causalab_mini.generated.families import FAMILY_CHECKS, FAMILY_LOADING
    from causalab_mini.model import _text_config
    from causalab_mini.tools.tiny import tiny_config

    for model_type, family in (
        ("vision-encoder-decoder", "bert_cross"),
        ("encoder-decoder", "bert_cross"),
        ("t5gemma2", "t5gemma2"),
    ):
        config = tiny_config(model_type)
        name = FAMILY_LOADING[family].text_config_name
        assert _text_config(config, name) is config.decoder
    t5 = tiny_config("t5")
    assert _text_config(t5) is t5
    assert FAMILY_LOADING["florence2"].meta_build_unavailable
    assert FAMILY_CHECKS["t5gemma2"].merged_cross_attention
