"""The chat frame (issue 32): a frame is never silently replaced by another, the
logits and "the next token" are read where the model predicts the next token (the end
of the chat prompt, generation prompt included), and ``{"index": -1}`` stays the last
token of the user's message. On tiny tokenizers built with real chat templates
(registry/tiny.yaml: chatml on Qwen2, llama3 on Llama)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import compat
from causalab_mini import positions as P
from causalab_mini.components import Plan, locate
from causalab_mini.interchange import interchange
from causalab_mini.model import StandardizedTransformer

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

FAMILIES = ("qwen2", "llama")
TEXTS = ["Where is the cat", "Hello"]

Load = Callable[..., StandardizedTransformer]


def _alone(model: Any, text: str) -> Any:
    """The chat prompt of ``text`` alone, rendered by the tokenizer itself."""
    rendered = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return model.tokenizer([rendered], add_special_tokens=False, return_tensors="pt")


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_run_in_the_chat_frame_runs_the_chat_prompt_without_positions(
    family: str, tiny_model: Load
) -> None:
    model = tiny_model(f"tiny:{family}")
    whole = locate(model, "block_output", 1)
    last = locate(model, "block_output", 1, position={"index": -1})
    chat = P.encode(model, TEXTS, frame="chat")
    width = chat.inputs["input_ids"].shape[1]
    plain_width = P.encode(model, TEXTS).inputs["input_ids"].shape[1]
    assert width > plain_width
    bare = Plan.of([whole]).run(model, TEXTS, frame="chat")[whole]
    positioned = Plan.of([whole, last]).run(model, TEXTS, frame="chat")[whole]
    assert bare.shape[1] == width
    assert torch.allclose(bare, positioned, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_frame_the_inputs_cannot_take_is_refused(family: str, tiny_model: Load) -> None:
    model = tiny_model(f"tiny:{family}")
    whole = locate(model, "block_output", 1)
    ids = dict(model.tokenizer(["Hello"], return_tensors="pt"))
    with pytest.raises(P.PositionError, match="frame='chat' renders text"):
        Plan.of([whole]).run(model, ids, frame="chat")
    with pytest.raises(P.PositionError, match="encoded in the plain frame"):
        Plan.of([whole]).run(model, P.encode(model, TEXTS), frame="chat")
    with pytest.raises(P.PositionError, match="unknown frame"):
        Plan.of([whole]).run(model, TEXTS, frame="chatml")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_last_index_is_the_message_and_the_last_anchor_the_prompt_end(
    family: str, tiny_model: Load
) -> None:
    model = tiny_model(f"tiny:{family}")
    chat = P.encode(model, TEXTS, frame="chat")
    content = P.resolve(model, chat, {"index": -1})
    end = P.resolve(model, chat, {"anchor": "last"})
    for row, text in enumerate(TEXTS):
        frame = chat.frames[row]
        assert content[row] == [frame.content[-1]]
        # the message's last token covers its last characters
        piece = model.tokenizer.convert_tokens_to_string([frame.tokens[content[row][0]]])
        assert text.endswith(piece.strip())
        assert end[row] == [frame.real[-1]] and end[row][0] > content[row][0]
        alone = _alone(model, text)["input_ids"][0]
        # the prompt as the model receives it ends with the generation prompt
        assert int(chat.inputs["input_ids"][row, end[row][0]]) == int(alone[-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_interchange_logits_are_the_chat_prompts_next_token_logits(
    family: str, tiny_model: Load
) -> None:
    model = tiny_model(f"tiny:{family}")
    patch = locate(model, "block_output", 0, position={"index": -1})
    result = interchange(
        model,
        [patch],
        ["Where is the cat"],
        ["Where is the dog"],
        frame="chat",
        return_sources=True,
    )
    for text, logits in (("Where is the dog", result.sources[0].logits),):
        with model.trace(dict(_alone(model, text))):
            expected = model.logits.save()
        assert torch.allclose(logits[0], expected[0, -1], atol=1e-5)
    # the last block's output at that token carries the source's logits into the base
    end = locate(model, "block_output", model.num_layers - 1, position={"anchor": "last"})
    moved = interchange(
        model, [end], ["Where is the cat"], ["Hello"], frame="chat", return_sources=True
    )
    assert torch.allclose(moved.logits, moved.sources[0].logits, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_in_the_chat_frame_predicts_from_the_end_of_the_prompt(
    family: str, tiny_model: Load
) -> None:
    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight>=0.8")
    model = tiny_model(f"tiny:{family}")
    nxt = locate(model, "logits", position={"anchor": "last"})
    word = locate(model, "logits", position={"index": -1})
    out = Plan.of([nxt, word]).generate(
        model, TEXTS, max_new_tokens=2, do_sample=False, frame="chat"
    )
    first = out.steps[0]
    # step 0: the logits at the end of the prompt give the first new token
    assert torch.equal(first[nxt][:, 0].argmax(-1), out.tokens[:, 0])
    # and {"index": -1} is still the message's last token, another token of the prompt
    assert not torch.allclose(first[word], first[nxt])
    # the rows start where the chat prompt ends: the sequences are the chat batch's
    chat = P.encode(model, TEXTS, frame="chat")
    width = chat.inputs["input_ids"].shape[1]
    assert torch.equal(out.sequences[:, :width], chat.inputs["input_ids"])
    # later steps: both spellings name the one token being generated
    assert torch.equal(out.steps[1][nxt], out.steps[1][word])


def test_a_patching_grid_reads_the_logits_where_interchange_does(tiny_model: Load) -> None:
    """In the chat frame the grid's logits, as interchange's, are the end of the chat
    prompt's (the cell equals the one-cell interchange)."""
    from causalab_mini.interchange import grid

    model = tiny_model("tiny:qwen2")
    bases, sources = ["Where is the cat"], ["Where is the dog"]
    result = grid(model, "block_output", [0], [{"index": -1}], bases, sources, frame="chat")
    patch = locate(model, "block_output", 0, position={"index": -1})
    one = interchange(model, [patch], bases, sources, frame="chat")
    assert torch.allclose(result.logits[0, 0, 0], one.logits[0], atol=1e-5)
