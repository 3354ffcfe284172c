"""Interchange interventions, held to their identities: every content token of the
first block's input moved from the source reproduces the source's logits; the last
block's output at the last token reproduces the source's last-token logits; a patch at
one token changes nothing before it; the source rows are never changed; and the
batch size changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import locate
from causalab_mini.interchange import Patch, interchange
from causalab_mini.model import StandardizedTransformer
from causalab_mini.plan import Plan
from causalab_mini.positions import PositionError, resolve
from causalab_mini.tools.checks import positions as checks

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

FAMILIES = ["tiny:llama", "tiny:gpt2", "tiny:gemma2", "tiny:gpt_neox"]
# the sweep's sentences (ten of them) and its pairing of sentences of as many tokens
SENTENCES = list(checks.SENTENCES[:10])


def same_length_pairs(model: Any) -> tuple[list[str], list[str]]:
    """Pairs of sentences with as many content tokens under the model's tokenizer."""
    pairs = checks.equal_length_pairs(model, SENTENCES)
    assert pairs is not None, "no two sentences tokenize to as many tokens: add sentences"
    return pairs


@pytest.mark.parametrize("spec", FAMILIES)
def test_every_token_of_the_first_block_input_reproduces_the_source(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    bases, sources = same_length_pairs(model)
    patch = locate(model, "block_input", 0, position="all")
    before = locate(model, "embeddings", position="all")  # read before the patch
    result = interchange(model, [patch], bases, sources, reads=[before], return_sources=True)
    torch.testing.assert_close(result.logits, result.sources[0].logits, atol=1e-5, rtol=1e-5)
    # the read saved before the patch keeps the base's own value (as many tokens in
    # every row: bases patched from themselves pad alike)
    clean = interchange(model, [patch], bases, bases, reads=[before])
    assert torch.equal(result.reads[before], clean.reads[before])
    clean_base = interchange(
        model, [locate(model, "block_input", 0, position={"index": 0})], bases, bases
    )
    assert not torch.allclose(result.logits, clean_base.logits)  # the patch did something


@pytest.mark.parametrize("spec", FAMILIES)
def test_the_last_block_output_at_the_last_token_reproduces_the_source_there(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    last = model.internals.num_layers - 1
    bases = SENTENCES[:4]
    sources = SENTENCES[4:8]  # of other lengths: each row resolves its own last token
    patch = locate(model, "block_output", last, position={"index": -1})
    before = locate(model, "block_input", last, position={"index": -1})  # read before it
    result = interchange(model, [patch], bases, sources, reads=[before], return_sources=True)
    torch.testing.assert_close(result.logits, result.sources[0].logits, atol=1e-5, rtol=1e-5)
    for i, text in enumerate(bases):  # the read before the patch is the base's own
        alone = Plan.of([before]).run(model, [text])[before][0]
        torch.testing.assert_close(result.reads[before][i], alone, atol=1e-5, rtol=1e-5)
    # the sources ran clean: their logits are a plain run's
    logits = locate(model, "logits", position={"index": -1})
    for i, text in enumerate(sources):
        alone = Plan.of([logits]).run(model, [text])[logits][0, 0]
        torch.testing.assert_close(result.sources[0].logits[i], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("spec", FAMILIES)
def test_a_patch_at_one_token_changes_nothing_before_it(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    # as many tokens in every row: the patched and the clean batch pad alike, so the
    # tokens before the patch are bitwise the clean run's
    bases, sources = same_length_pairs(model)
    at = {"index": 2}
    patch = locate(model, "block_mid" if "neox" not in spec else "attention_output", 1, position=at)
    out = locate(model, "block_output", 1, position="all")
    earlier = locate(model, "block_input", 1, position="all")
    patched = interchange(model, [patch], bases, sources, reads=[earlier, out])
    clean = interchange(model, [patch], bases, bases, reads=[earlier, out])  # itself: no change
    for i, text in enumerate(bases):
        n = len(resolve(model, [text], "all")[0])
        assert torch.equal(patched.reads[earlier][i], clean.reads[earlier][i])  # read before
        moved = (patched.reads[out][i] - clean.reads[out][i]).abs().amax(-1)
        assert moved.shape[0] == n
        assert moved[:2].max() == 0
        assert moved[2] > 0


def test_the_batch_size_changes_nothing(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    patch = locate(model, "block_output", 1, position={"index": -1})
    read = locate(model, "block_output", 2, position={"index": -1})
    whole = interchange(model, [patch], SENTENCES[:5], SENTENCES[5:], reads=[read])
    chunked = interchange(model, [patch], SENTENCES[:5], SENTENCES[5:], reads=[read], batch_size=2)
    torch.testing.assert_close(whole.logits, chunked.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(whole.reads[read], chunked.reads[read], atol=1e-5, rtol=1e-5)
    assert whole.logits.shape == (5, model.vocab_size)


def test_several_sources_a_patch_each(tiny_model: Callable[..., Any]) -> None:
    """Two patches from two sources: the first block from source 0 everywhere and the
    last token of the last block from source 1 give source 1's last-token logits."""
    model = tiny_model("tiny:llama")
    bases, sources = same_length_pairs(model)
    last = model.internals.num_layers - 1
    patches = [
        Patch(locate(model, "block_input", 0, position="all"), source=0),
        Patch(locate(model, "block_output", last, position={"index": -1}), source=1),
    ]
    pairs = [(s, b) for b, s in zip(bases, sources, strict=True)]
    result = interchange(model, patches, bases, pairs, return_sources=True)
    torch.testing.assert_close(result.logits, result.sources[1].logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("patches", "bases", "sources", "message"),
    [
        (lambda m: [locate(m, "block_output", 0)], ["a b"], ["c d"], "names no position"),
        (
            lambda m: [locate(m, "block_output", 0, position="all")],
            ["The cat sat on the mat"],
            ["A dog"],
            "names 10 tokens in base",
        ),
        (
            lambda m: [locate(m, "block_output", 0, position={"index": 0})],
            ["a", "b"],
            ["c"],
            "2 bases and 1 sources",
        ),
        (
            lambda m: [
                locate(m, "block_output", 0, position={"index": 0}),
                locate(m, "block_output", 0, position={"index": 1}),
            ],
            ["a b"],
            ["c d"],
            "two patches at one place",
        ),
        (
            lambda m: [Patch(locate(m, "block_output", 0, position={"index": 0}), source=1)],
            ["a b"],
            ["c d"],
            "takes source 1, and each pair has 1 source",
        ),
        (
            lambda m: [locate(m, "block_output", 0, position={"span": "fox"})],
            ["the fox"],
            ["the dog"],
            "'fox' does not occur in row 1",
        ),
    ],
)
def test_bad_interchanges_are_refused(
    patches: Callable[[Any], list[Any]],
    bases: list[str],
    sources: list[str],
    message: str,
    tiny_model: Callable[..., Any],
) -> None:
    from causalab_mini.geometry import ComponentError

    model = tiny_model("tiny:llama")
    with pytest.raises((ComponentError, PositionError), match=message):
        interchange(model, patches(model), bases, sources)


def test_the_sweep_check_notices_a_place_that_is_not_the_stream() -> None:
    """block_input read where the first norm writes (what attention reads, not the
    residual the block carries): moving every token there leaves the residual the
    base's, and the sweep's interchange identity fails on it."""
    import dataclasses

    from causalab_mini import RenameConfig, StandardizedTransformer
    from causalab_mini.address import IOType
    from causalab_mini.generated import DEFAULT_ADDRESSES
    from causalab_mini.tools import certify
    from causalab_mini.tools.checks import Context

    def outcomes(model: Any) -> dict[str, bool]:
        inputs = certify.sample_inputs(model)
        addresses = {("block_input", 0): locate(model, "block_input", 0)}
        ctx = Context(model, inputs, addresses, {})
        return {o.description: o.ok for o in checks.interchange_identities(ctx)}

    good = outcomes(StandardizedTransformer("tiny:llama"))
    assert good[checks.ALL_TOKENS] and good[checks.LAST_TOKEN]
    norm = dataclasses.replace(
        DEFAULT_ADDRESSES["layers_input"], module="input_layernorm", io=IOType.OUTPUT
    )
    wrong = StandardizedTransformer(
        "tiny:llama", rename_config=RenameConfig(addresses={"layers_input": norm})
    )
    assert not outcomes(wrong)[checks.ALL_TOKENS]


def test_a_media_batch_is_refused_with_a_message_about_media(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    """A processor's batch (ids with media placeholders, pixel values beside them) as the
    bases or the sources is refused before anything runs, saying it is media that
    interchange does not join, and how to patch it instead."""
    model = tiny_model("tiny:llama")
    address = locate(model, "block_output", 0, position={"index": -1})
    ids = model.tokenizer(["The fox"], return_tensors="pt")
    batch = {**ids, "pixel_values": torch.zeros(1, 3, 8, 8)}
    for bases, sources in ((batch, ["A dog"]), (["A dog"], [batch])):
        with pytest.raises(PositionError, match="pixel_values") as refused:
            interchange(model, [address], bases=bases, sources=sources)
        assert "media" in str(refused.value) and "Plan.of" in str(refused.value)
