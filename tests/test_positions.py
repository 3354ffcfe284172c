"""Positions in a content frame: ``{"index": 0}``, ``{"index": -1}`` and a span name the
same content token whatever the tokenizer adds (BOS, nothing, EOS, both) and whichever
side it pads on; reads return only those tokens, writes replace only them, and every
bad position is refused with a one-line reason."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import WriteRefused, locate
from causalab_mini import positions as P
from causalab_mini.plan import Plan
from causalab_mini.tools.tiny import BOS_ID, EOS_ID

TEXTS = ["The quick brown fox jumps", "Hello, world! The fox"]


def _tokenizer(adds: str, side: str) -> Any:
    """The tiny tokenizer, made to add what ``adds`` says (bos, none, eos, bos_eos)."""
    from tokenizers import processors

    from causalab_mini.tools.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    single = {"bos": "<s> $A", "none": "$A", "eos": "$A </s>", "bos_eos": "<s> $A </s>"}[adds]
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<s>", BOS_ID), ("</s>", EOS_ID)]
    )
    tok.padding_side = side
    return tok


KINDS = ["bos", "none", "eos", "bos_eos"]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("adds", KINDS)
def test_index_and_span_name_the_same_content_token_whatever_the_tokenizer_adds(
    adds: str, side: str
) -> None:
    tok = _tokenizer(adds, side)
    encoded = P.encode(tok, TEXTS)
    ids = encoded.inputs["input_ids"]
    first = P.resolve(tok, encoded, {"index": 0})
    last = P.resolve(tok, encoded, {"index": -1})
    span = P.resolve(tok, encoded, {"span": "fox", "index": -1})
    for row, text in enumerate(TEXTS):
        alone = tok(text, add_special_tokens=False)["input_ids"]  # the content, alone
        assert int(ids[row, first[row][0]]) == alone[0]
        assert int(ids[row, last[row][0]]) == alone[-1]
        assert tok.decode(ids[row, span[row][0]]) == "ox"  # the last token of "fox"
    anchors = P.resolve if "bos" in adds else None
    if anchors is not None:
        bos = P.resolve(tok, encoded, {"anchor": "bos"})
        assert all(int(ids[r, bos[r][0]]) == BOS_ID for r in range(len(TEXTS)))
    else:
        with pytest.raises(P.PositionError, match="added no BOS"):
            P.resolve(tok, encoded, {"anchor": "bos"})
    if "eos" in adds:
        eos = P.resolve(tok, encoded, {"anchor": "eos"})
        assert all(int(ids[r, eos[r][0]]) == EOS_ID for r in range(len(TEXTS)))
    else:
        with pytest.raises(P.PositionError, match="added no EOS"):
            P.resolve(tok, encoded, {"anchor": "eos"})
    # position ids count from each row's first real token, whatever the padding side
    mask = encoded.inputs["attention_mask"]
    pos = encoded.inputs["position_ids"]
    for row in range(len(TEXTS)):
        real = mask[row].nonzero().flatten()
        assert pos[row, real].tolist() == list(range(len(real)))


def test_a_position_is_pure_data() -> None:
    parsed = P.parse([{"span": "fox", "index": -1}, {"index": 0}, "all", {"anchor": "bos"}])
    assert pickle.loads(pickle.dumps(parsed)) == parsed
    assert sorted(parsed) == sorted(reversed(parsed))
    assert [p.spec() for p in parsed] == [
        {"span": "fox", "index": -1},
        {"index": 0},
        "all",
        {"anchor": "bos"},
    ]
    assert str(parsed[0]) == "{'span': 'fox', 'index': -1}"


@pytest.mark.parametrize(
    ("texts", "spec", "message"),
    [
        (TEXTS, {"index": 10}, r"\{'index': 10\} is outside row 1: .* has 10 content tokens"),
        (TEXTS, {"index": -11}, r"is outside row 1.*nothing is clamped"),
        (TEXTS, {"span": "dog"}, r"'dog' does not occur in row 0"),
        (["the fox and the dog"], {"span": "the"}, r"occurs 2 times in row 0"),
        (TEXTS, [{"index": 0}, {"index": 0}], r"names \{'index': 0\} twice"),
        (TEXTS, [{"index": 0}, {"index": -10}], r"names token 2 of row 1: .* twice"),
        (TEXTS, {"where": 1}, r"unknown keys \['where'\]"),
        (TEXTS, {"anchor": "cls"}, r"unknown anchor 'cls'"),
        (TEXTS, {"anchor": "bos", "index": 0}, r"an anchor stands alone"),
        (TEXTS, [], r"empty list of positions"),
        (TEXTS, "last", r"unknown position 'last'"),
        (TEXTS, {"index": 1.0}, r"an index is an int"),
        ([""], {"index": 0}, r"row 0 is the empty text"),
        ([], {"index": 0}, r"the input has no rows"),
    ],
)
def test_bad_positions_are_refused_in_one_line(texts: list[str], spec: Any, message: str) -> None:
    tok = _tokenizer("bos", "left")
    with pytest.raises(P.PositionError, match=message) as info:
        P.resolve(tok, texts, spec)
    assert "\n" not in str(info.value)


def test_a_span_split_by_an_added_token_is_refused() -> None:
    # the chat frame's content is the message; a span reaching into the scaffolding is
    # not inside it (here: a span of the plain text that the added EOS splits is not
    # possible, so the template's own text is the case)
    tok = _tokenizer("bos", "left")
    tok.chat_template = (
        "{% for m in messages %}<s>user: {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    encoded = P.encode(tok, ["The fox"], frame="chat")
    with pytest.raises(P.PositionError, match="does not occur"):
        P.resolve(tok, encoded, {"span": "user"})  # scaffolding, not content
    last = P.resolve(tok, encoded, {"index": -1})
    assert tok.decode(encoded.inputs["input_ids"][0, last[0][0]]) == "ox"
    first = P.resolve(tok, encoded, {"index": 0})
    assert tok.decode(encoded.inputs["input_ids"][0, first[0][0]]).strip() == "The"
    assert P.resolve(tok, encoded, {"anchor": "bos"}) == [[0]]


def test_rows_of_different_lengths_do_not_stack_under_all() -> None:
    tok = _tokenizer("bos", "left")
    indices = P.resolve(tok, TEXTS, "all")
    assert [len(r) for r in indices] == [
        len(tok(t, add_special_tokens=False)["input_ids"]) for t in TEXTS
    ]
    with pytest.raises(P.PositionError, match="different number of tokens in each row"):
        P.stacked(indices, "all")


def test_the_cli_prints_the_frame() -> None:
    from tests.conftest import cli

    result = cli("positions", "tiny:llama", "The quick brown fox", "--position", '{"index": -1}')
    assert result.exit_code == 0, result.output
    assert "anchor bos" in result.output
    assert "index   0 /   -9" in result.output
    assert "row 0: 9 'ox'" in result.output
    bad = cli("positions", "tiny:llama", "The fox", "--position", '{"span": "dog"}')
    assert bad.exit_code == 2
    assert "'dog' does not occur in row 0" in bad.output


def test_the_cli_prints_the_padding_side_the_model_runs() -> None:
    """`registry positions` pads as the loaded model does (`registry model` prints the
    same side): an encoder-decoder's tokenizer pads on the right once loaded, whatever
    its files say, and the frame printed is that batch."""
    from causalab_mini.model import StandardizedTransformer
    from tests.conftest import cli

    model = StandardizedTransformer("tiny:t5", remote=True)
    side = model.tokenizer.padding_side
    result = cli("positions", "tiny:t5", "The fox", "A lazy brown dog")
    assert result.exit_code == 0, result.output
    assert f"padding_side={side}" in result.output.splitlines()[0]
    rows = result.output.split("row 1")[0].splitlines()
    padded = [i for i, line in enumerate(rows) if line.endswith("padding")]
    assert padded and (padded[-1] == len(rows) - 1) == (side == "right")
    shown = cli("model", "tiny:t5")
    assert f"padding_side={side}" in shown.output


# ------------------------------------------------------------------ reads and writes


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_position_read_is_those_tokens_of_the_whole_read(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    at = locate(model, "block_output", 1, position=[{"index": 0}, {"index": -1}])
    whole = locate(model, "block_output", 1)
    got = Plan.of([at, whole]).run(model, TEXTS)
    index = P.stacked(P.resolve(model, TEXTS, at.position), at.position)
    assert got[at].shape == (2, 2, model.hidden_size)
    assert torch.equal(got[at], P.take(got[whole], index, 1))
    assert pickle.loads(pickle.dumps(at)) == at
    assert at != whole and "at [{'index': 0}, {'index': -1}]" in str(at)


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_left_padded_row_reads_as_it_would_alone(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    """position_ids: the short row of a padded batch, read at its last token, is what
    the row alone gives (GPT-2's positions are absolute)."""
    model = tiny_model(spec)
    at = locate(model, "block_output", 2, position={"index": -1})
    batch = Plan.of([at]).run(model, TEXTS)[at]
    for row, text in enumerate(TEXTS):
        alone = Plan.of([at]).run(model, [text])[at]
        torch.testing.assert_close(batch[row], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
@pytest.mark.parametrize("component", ["block_input", "block_mid", "attention_output"])
def test_a_position_write_replaces_that_token_only(
    spec: str, component: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    earlier = locate(model, "block_input", 0)
    at = locate(model, component, 1, position={"span": "fox", "index": 0})
    same = locate(model, component, 1)
    later = locate(model, "block_output", 1)
    clean = Plan.of([earlier, same, later]).run(model, TEXTS)
    index = P.stacked(P.resolve(model, TEXTS, at.position), at.position)
    value = torch.ones(2, 1, model.hidden_size)
    patched = Plan.of([earlier, same, later], [(at, value)]).run(model, TEXTS)
    # a read before the write keeps its value
    assert torch.equal(patched[earlier], clean[earlier])
    # the place reads back the written token, and its other tokens as computed
    expect = P.put(clean[same], index, 1, value)
    torch.testing.assert_close(patched[same], expect, atol=0, rtol=0)
    # what comes after moved at that token and after it, never at a real token before
    # (padding is no token of the text: a fully masked query's output is the kernel's)
    real = P.encode(model, TEXTS).inputs["attention_mask"].bool()
    moved = (patched[later] - clean[later]).abs().amax(-1)
    for row in range(2):
        p = int(index[row, 0])
        assert moved[row, :p][real[row, :p]].max() == 0
        assert moved[row, p] > 0


@pytest.mark.slow
@pytest.mark.semantic
@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_place_reads_and_writes_positions_in_a_hand_written_trace(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    """``model.internals[name][layer, index]`` (and ``model.<name>[layer, index]``): a
    read is those tokens of the whole read; a write replaces them only, keeps a read
    saved before, and moves what comes after; an in-place edit of the read is that
    write."""
    model = tiny_model(spec)
    encoded = P.encode(model, TEXTS)
    spec_ = {"span": "fox", "index": 0}
    index = P.stacked(P.resolve(model, encoded, spec_), spec_)
    inputs = P.trace_inputs(model, encoded)
    with model.trace(inputs):
        whole = model.layers_mid[1].save()
        at = model.internals["layers_mid"][1, index].save()
        clean_out = model.layers_output[1].save()
    assert at.shape == (2, 1, model.hidden_size)
    assert torch.equal(at, P.take(whole, index, 1))
    value = torch.ones(2, 1, model.hidden_size)
    with model.trace(inputs):
        before = model.layers_input[1].save()
        model.layers_mid[1, index] = value
        after = model.layers_mid[1].save()
        out = model.layers_output[1].save()
    with model.trace(inputs):
        edited = model.layers_mid[1, index]
        edited[...] = 1.0  # the same write, as an in-place edit of the read
        out_edit = model.layers_output[1].save()
    with model.trace(inputs):
        clean_in = model.layers_input[1].save()
    assert torch.equal(before, clean_in)  # read before the write: unchanged
    assert torch.equal(after, P.put(whole, index, 1, value))  # those tokens only
    assert not torch.equal(out, clean_out) and torch.equal(out_edit, out)


@pytest.mark.slow
def test_positions_on_a_place_are_refused_where_they_do_not_apply(
    tiny_model: Callable[..., Any],
) -> None:
    from causalab_mini.internals import PlaceUnavailable

    model = tiny_model("tiny:llama")
    index = torch.zeros(1, 1, dtype=torch.long)
    with pytest.raises(TypeError, match=r"\(batch, n\) integer tensor.*positions.stacked"):
        with model.trace("The fox"):
            model.layers_mid[1, 0]
    with pytest.raises(PlaceUnavailable, match=r"no component states which axis"):
        with model.trace("The fox"):
            model.internals["attentions"][1, index]
    with pytest.raises(WriteRefused, match="read-only"):
        with model.trace("The fox"):
            model.internals["logits"][None, index] = index


@pytest.mark.slow
def test_an_address_with_positions_outside_a_plan_says_how(
    tiny_model: Callable[..., Any],
) -> None:
    from causalab_mini.geometry import ComponentError
    from causalab_mini.plan import read

    model = tiny_model("tiny:llama")
    at = locate(model, "block_output", 0, position={"index": -1})
    with pytest.raises(ComponentError, match="resolved on the batch the trace runs"):
        with model.trace("The fox"):
            read(model, at)


# ------------------------------------------------------- the families' own tokenizers

FAMILY_TOKENIZERS = {
    "tiny:llama": ("bos", None),
    "tiny:gpt2": ("none", None),
    "tiny:pegasus": ("eos", None),
    "tiny:bart": ("bos_eos", None),
    "tiny:qwen2": ("none", "chat"),
}


@pytest.mark.slow
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("spec", sorted(FAMILY_TOKENIZERS))
def test_every_family_tokenizer_names_the_same_content_token(spec: str, side: str) -> None:
    """On each family's own tiny tokenizer (what its real one adds: BOS, nothing, EOS,
    both; a chat template), the first and last content tokens and a span are the text's
    own tokens, in the plain frame and, where there is a template, in the chat frame."""
    from causalab_mini.tools.positions import load_tokenizer

    adds, chat = FAMILY_TOKENIZERS[spec]
    tok = load_tokenizer(spec)
    tok.padding_side = side
    for frame in ("plain", *([chat] if chat else [])):
        encoded = P.encode(tok, TEXTS, frame=frame)
        ids = encoded.inputs["input_ids"]
        first = P.resolve(tok, encoded, {"index": 0})
        last = P.resolve(tok, encoded, {"index": -1})
        span = P.resolve(tok, encoded, {"span": "fox", "index": -1})
        for row, text in enumerate(TEXTS):
            assert text.startswith(tok.decode(ids[row, first[row][0]]).strip())
            assert text.endswith(tok.decode(ids[row, last[row][0]]).strip())
            assert tok.decode(ids[row, span[row][0]]) == "ox"
        if frame == "plain":
            has_bos = "bos" in adds
            has_eos = "eos" in adds
            for name, present in (("bos", has_bos), ("eos", has_eos)):
                if present:
                    assert all(len(r) == 1 for r in P.resolve(tok, encoded, {"anchor": name}))
                else:
                    with pytest.raises(P.PositionError, match=f"added no {name.upper()}"):
                        P.resolve(tok, encoded, {"anchor": name})


def test_the_frames_in_the_docs_are_what_the_command_prints() -> None:
    """docs/positions.md shows `registry positions` output: each block is rerun."""
    import re
    import shlex

    from tests.conftest import REPO, cli

    text = (REPO / "docs" / "positions.md").read_text()
    found = re.findall(r"<!-- positions: (.*?) -->\n```\n(.*?)```", text, re.S)
    assert len(found) >= 3
    for args, block in found:
        result = cli("positions", *shlex.split(args))
        assert result.exit_code == 0, result.output
        assert result.output == block, f"docs/positions.md: rerun `registry positions {args}`"
