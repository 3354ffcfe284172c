"""Encoder-decoders fed as users feed them (issue 32): pairs (source, decoder prefix),
positions counted in the decoder's input for the decoder's places and in the encoder's
for the encoder's, rows of different lengths each as alone, and a missing decoder input
refused with the library's own error, never transformers'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import compat
from causalab_mini import positions as P
from causalab_mini.components import Plan, locate
from causalab_mini.errors import CausalabError
from causalab_mini.interchange import interchange
from causalab_mini.model import StandardizedTransformer
from causalab_mini.seq2seq import DecoderInputMissing
from causalab_mini.tools.checks.ragged import RTOL, relative

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

Load = Callable[..., StandardizedTransformer]
SPECS = ("tiny:t5", "tiny:seq2seq/bart")
# the decoder prefixes are shorter and longer than their sources, and of other lengths
PAIRS = [("The cat sat on the mat by the door", "Le chat"), ("Hi", "Bonjour tout le monde")]


def test_the_tiny_t5_tokenizer_and_config_follow_t5s_rules(tiny_model: Load) -> None:
    model = tiny_model("tiny:t5")
    ids = model.tokenizer("hello world")["input_ids"]
    assert ids[-1] == model.tokenizer.eos_token_id
    assert model.tokenizer.bos_token_id not in ids  # T5 prepends nothing
    assert model._model.config.decoder_start_token_id == model._model.config.pad_token_id == 0


@pytest.mark.parametrize("spec", SPECS)
def test_a_missing_decoder_input_is_the_librarys_error(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec)
    whole = locate(model, "block_output", 0)
    last = locate(model, "block_output", 0, position={"index": -1})
    ids = dict(model.tokenizer(["Hello"], return_tensors="pt"))
    for given in ("Hello", ["Hello"], ids):
        with pytest.raises(DecoderInputMissing, match="pairs"):
            Plan.of([whole]).run(model, given)
    with pytest.raises(DecoderInputMissing):
        interchange(model, [last], ["Hello"], ["Bye"])
    if compat.is_08():
        with pytest.raises(DecoderInputMissing):
            Plan.of([last]).generate(model, ["Hello"], max_new_tokens=1)
    assert issubclass(DecoderInputMissing, CausalabError)


def _decoder_ids(model: Any, prefix: str) -> Any:
    start = model._model.config.decoder_start_token_id
    ids = model.tokenizer(prefix, add_special_tokens=False)["input_ids"]
    return torch.tensor([[start, *ids]])


@pytest.mark.parametrize("spec", SPECS)
def test_decoder_places_count_in_the_decoder_and_rows_are_as_alone(
    spec: str, tiny_model: Load
) -> None:
    model = tiny_model(spec)
    last = locate(model, "block_output", model.num_layers - 1, position={"index": -1})
    whole = locate(model, "block_output", model.num_layers - 1)
    encoded = P.encode(model, PAIRS)
    got = Plan.of([last, whole]).run(model, encoded)
    index = P.resolve(model, encoded, {"index": -1})
    for row, (source, prefix) in enumerate(PAIRS):
        dec = _decoder_ids(model, prefix)
        # {"index": -1} is the prefix's last token, in the decoder's input
        assert index[row] == [dec.shape[1] - 1]
        assert int(encoded.inputs["decoder_input_ids"][row, index[row][0]]) == int(dec[0, -1])
        alone = model.tokenizer([source], return_tensors="pt")
        with model.trace({**alone, "decoder_input_ids": dec}):
            held = model.layers_output[model.num_layers - 1].save()
        real = encoded.inputs["decoder_attention_mask"][row].bool()
        assert relative(got[whole][row][real], held[0]) <= RTOL
        assert relative(got[last][row, 0], held[0, -1]) <= RTOL


@pytest.mark.parametrize("spec", SPECS)
def test_encoder_places_count_in_the_encoder(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec)
    encoded = P.encode(model, PAIRS)
    index = P.stacked(P.resolve(model, encoded, {"index": -1}, stack="encoder"), {"index": -1})
    with model.trace(P.trace_inputs(model, encoded)):
        states = model.encoder_layers_output[0].save()
    for row, (source, _) in enumerate(PAIRS):
        alone = model.tokenizer([source], return_tensors="pt")
        words = model.tokenizer(source, add_special_tokens=False)["input_ids"]
        # the encoder's last content token: the source's last word, not the </s> after it
        at = int(index[row, 0])
        assert int(encoded.inputs["input_ids"][row, at]) == words[-1]
        with model.trace({**alone, "decoder_input_ids": _decoder_ids(model, "x")}):
            held = model.encoder_layers_output[0].save()
        n = alone["input_ids"].shape[1]
        assert relative(states[row, :n], held[0]) <= RTOL
    with pytest.raises(P.PositionError, match="stack"):
        P.resolve(model, P.encode(model, PAIRS), {"index": -1}, stack="middle")


@pytest.mark.parametrize("spec", SPECS)
def test_interchange_on_pairs_of_different_lengths(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec)
    end = locate(model, "block_output", model.num_layers - 1, position={"anchor": "last"})
    bases, sources = PAIRS, PAIRS[::-1]
    result = interchange(model, [end], bases, sources, return_sources=True)
    assert torch.allclose(result.logits, result.sources[0].logits, atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_generate_takes_a_decoder_prefix(spec: str, tiny_model: Load) -> None:
    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight>=0.8")
    model = tiny_model(spec)
    nxt = locate(model, "logits", position={"anchor": "last"})
    pairs = [("The cat sat on the mat", "Le"), ("Hi", "Bo")]
    if len({len(model.tokenizer(p, add_special_tokens=False)["input_ids"]) for _, p in pairs}) > 1:
        pytest.skip("the prefixes tokenize to different lengths here")
    out = Plan.of([nxt]).generate(model, pairs, max_new_tokens=3, do_sample=False)
    encoded = P.encode(model, pairs)
    reference = model._model.generate(
        input_ids=encoded.inputs["input_ids"],
        attention_mask=encoded.inputs["attention_mask"],
        decoder_input_ids=encoded.inputs["decoder_input_ids"],
        max_new_tokens=3,
        do_sample=False,
    )
    assert torch.equal(out.sequences, reference)
    assert torch.equal(out.steps[0][nxt][:, 0].argmax(-1), out.tokens[:, 0])


@pytest.mark.parametrize("spec", SPECS)
def test_the_sweep_check_of_ragged_pairs_holds(spec: str, tiny_model: Load) -> None:
    from causalab_mini.tools.checks import ragged_pairs
    from causalab_mini.tools.checks.base import Context

    model = tiny_model(spec)
    with model.trace(P.trace_inputs(model, P.encode(model, PAIRS))):
        held = model.layers_input[1].save()
    ctx = Context(
        model=model,
        inputs={},
        addresses={("block_output", model.num_layers - 1): object()},
        v={("block_input", 1): held},
    )
    found = {o.description: (o.ok, o.detail) for o in ragged_pairs.ragged_pairs(ctx)}
    names = {ragged_pairs.DECODER, ragged_pairs.ENCODER, ragged_pairs.SWAPPED, ragged_pairs.WRITE}
    assert set(found) == names and all(ok for ok, _ in found.values()), found


def test_an_encoder_place_takes_encoder_positions_in_a_trace(tiny_model: Load) -> None:
    model = tiny_model("tiny:t5")
    encoded = P.encode(model, PAIRS)
    spec = {"index": -1}
    index = P.stacked(P.resolve(model, encoded, spec, stack="encoder"), spec)
    with model.trace(P.trace_inputs(model, encoded)):
        whole = model.encoder_layers_output[0].save()
        at = model.encoder_layers_output[0, index].save()
    assert torch.equal(at, P.take(whole, index, 1))
    # a plan does not resolve encoder positions: refused, saying how to read them
    with pytest.raises(CausalabError, match="stack='encoder'"):
        locate(model, "encoder_layers_output", 0, position=spec)
