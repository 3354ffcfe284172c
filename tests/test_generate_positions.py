"""Positions inside ``generate`` steps (issue 22, section 2): ``Plan.generate`` resolves
positions on the prompt at step 0 and, at every later step, ``{"index": -1}`` is the
token being generated; other positions are refused before anything runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import compat
from causalab_mini import generation as gen
from causalab_mini.components import Plan, locate
from causalab_mini.errors import RemoteRefused
from causalab_mini.generation import Generation, GenerationRefused
from causalab_mini.model import StandardizedTransformer
from causalab_mini.positions import PositionError

# Plan.generate steps with nnsight 0.8's tracer.iter; on 0.6/0.7 it is refused with the
# fix (install nnsight>=0.8), which test_what_generate_cannot_run_is_refused_with_the_fix
# checks on 0.8 by answering is_08 False
pytestmark = pytest.mark.skipif(not compat.is_08(), reason="Plan.generate needs nnsight 0.8")

FAMILIES = ("llama", "gpt2")  # a tokenizer that prepends BOS, and one that adds nothing
TEXTS = ["The quick brown fox jumps over", "Hello"]  # rows of different lengths
LAST = {"index": -1}
STEPS = 3


def _model(tiny_model: Callable[..., StandardizedTransformer], family: str) -> Any:
    model = tiny_model(f"tiny:{family}")
    assert model.tokenizer.padding_side == "left"
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_a_left_padded_batch_generates_and_reads_as_each_prompt_alone(
    family: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = _model(tiny_model, family)
    last = locate(model, "block_output", 1, position=LAST)
    whole = locate(model, "block_output", 1)
    plan = Plan.of([last, whole])
    both = plan.generate(model, TEXTS, max_new_tokens=STEPS, do_sample=False)
    assert isinstance(both, Generation) and len(both.steps) == STEPS
    assert tuple(both.tokens.shape) == (2, STEPS)
    width = both.sequences.shape[1] - STEPS
    assert torch.equal(both.sequences[:, width:], both.tokens)
    # the whole tensor: the prompt's at step 0, one token per row after
    assert both.steps[0][whole].shape[:2] == (2, width)
    assert all(s[whole].shape[:2] == (2, 1) for s in both.steps[1:])
    # step 0's forward is the prompt's: its reads are Plan.run's on the same batch
    ran = Plan.of([last]).run(model, TEXTS)
    torch.testing.assert_close(both.steps[0][last], ran[last], rtol=0, atol=1e-5)
    for k, step in enumerate(both.steps[1:], 1):
        assert torch.equal(step[last], step[whole][:, -1:]), f"step {k}"
    for row, text in enumerate(TEXTS):
        alone = plan.generate(model, text, max_new_tokens=STEPS, do_sample=False)
        assert torch.equal(alone.tokens[0], both.tokens[row]), f"row {row} generated otherwise"
        for k in range(STEPS):
            got, want = both.steps[k][last][row], alone.steps[k][last][0]
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"row {row} step {k}")
        # the row that needs no padding is the same forward as alone, bit for bit
        if both.sequences.shape[1] == alone.sequences.shape[1]:
            assert torch.equal(both.steps[0][last][row], alone.steps[0][last][0])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_last_token_of_a_step_is_the_newest_and_its_logits_give_the_next(
    family: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = _model(tiny_model, family)
    ids = locate(model, "input_ids", position=LAST)
    logits = locate(model, "logits", position=LAST)
    whole = locate(model, "logits")
    out = Plan.of([ids, logits, whole]).generate(
        model, TEXTS, max_new_tokens=STEPS, do_sample=False
    )
    width = out.sequences.shape[1] - STEPS
    # step 0: each row's last prompt token, with the prompt's logits (all of them)
    assert torch.equal(out.steps[0][ids][:, 0], out.sequences[:, width - 1])
    assert out.steps[0][whole].shape[1] == width
    ran = Plan.of([logits]).run(model, TEXTS)
    torch.testing.assert_close(out.steps[0][logits], ran[logits], rtol=0, atol=1e-5)
    for k, step in enumerate(out.steps):
        if k:  # the token generated at the step before
            assert torch.equal(step[ids][:, 0], out.tokens[:, k - 1]), f"step {k}"
        # greedy: its logits give the token this step generates
        assert torch.equal(step[logits][:, 0].argmax(-1), out.tokens[:, k]), f"step {k}"


def test_the_token_being_generated_is_the_last_one_without_a_cache(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    # without a key-value cache each step's forward runs the whole sequence, and
    # {"index": -1} is still the token being generated (not index 0 of the step)
    model = _model(tiny_model, "gpt2")
    last = locate(model, "block_output", 1, position=LAST)
    whole = locate(model, "block_output", 1)
    plan = Plan.of([last, whole])
    cached = plan.generate(model, TEXTS, max_new_tokens=STEPS, do_sample=False)
    full = plan.generate(model, TEXTS, max_new_tokens=STEPS, do_sample=False, use_cache=False)
    assert torch.equal(cached.tokens, full.tokens)
    width = full.sequences.shape[1] - STEPS
    for k in range(STEPS):
        assert full.steps[k][whole].shape[1] == width + k
        torch.testing.assert_close(full.steps[k][last], cached.steps[k][last], rtol=0, atol=1e-5)
        assert not torch.allclose(full.steps[k][last], full.steps[k][whole][:, :1])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_write_at_the_last_token_of_every_step_steers_generation(
    family: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = _model(tiny_model, family)
    top = model.num_layers - 1
    before = locate(model, "block_output", 0, position=LAST)
    at = locate(model, "block_output", top, position=LAST)
    clean = Plan.of([before, at]).generate(model, TEXTS, max_new_tokens=STEPS, do_sample=False)
    value = torch.randn(2, 1, model.hidden_size, generator=torch.Generator().manual_seed(0)) * 8
    steered = Plan.of([before, at], [(at, value)]).generate(
        model, TEXTS, max_new_tokens=STEPS, do_sample=False
    )
    # read before the write (an earlier layer, step 0): the clean value
    assert torch.equal(steered.steps[0][before], clean.steps[0][before])
    # read after it, at every step: the value written, which the clean run did not hold
    for k, step in enumerate(steered.steps):
        assert torch.equal(step[at], value), f"step {k}"
        assert not torch.allclose(clean.steps[k][at], value), f"step {k}"
    assert not torch.equal(steered.tokens, clean.tokens)


@pytest.mark.parametrize("family", FAMILIES)
def test_writing_back_the_value_read_leaves_the_tokens_as_they_were(
    family: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    # a write puts one value at every step, so the value read is written back in a
    # one-step generation (step 0, the prompt's last token of each row)
    model = _model(tiny_model, family)
    before = locate(model, "block_input", 1, position=LAST)
    at = locate(model, "block_output", 1, position=LAST)
    whole = locate(model, "block_output", 1)
    clean = Plan.of([before, at, whole]).generate(model, TEXTS, max_new_tokens=1)
    again = Plan.of([before, whole], [(at, clean.steps[0][at])]).generate(
        model, TEXTS, max_new_tokens=1
    )
    assert torch.equal(again.steps[0][before], clean.steps[0][before])
    assert torch.equal(again.steps[0][whole], clean.steps[0][whole])
    assert torch.equal(again.sequences, clean.sequences)


SPECS = [
    {"index": 0},
    {"index": -2},
    {"span": "fox"},
    {"span": "fox", "index": -1},
    {"anchor": "bos"},
    "all",
    [{"index": -1}, {"index": 0}],
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_a_position_a_later_step_lacks_is_refused_before_anything_runs(
    spec: Any, tiny_model: Callable[..., StandardizedTransformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny_model, "llama")

    def ran(*_: Any, **__: Any) -> Any:
        raise AssertionError("lowered: the refusal came after the plan started running")

    monkeypatch.setattr(gen, "lower", ran)
    address = locate(model, "block_output", 1, position=spec)
    with pytest.raises(PositionError, match=r"step 1 and after.*read it at step 0") as info:
        Plan.of([address]).generate(model, TEXTS, max_new_tokens=2)
    assert "\n" not in str(info.value) and str(address) in str(info.value)


def test_what_generate_cannot_run_is_refused_with_the_fix(
    tiny_model: Callable[..., StandardizedTransformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(tiny_model, "gpt2")
    last = locate(model, "block_output", 1, position=LAST)
    whole = locate(model, "block_output", 1)
    plan = Plan.of([last])
    with pytest.raises(RemoteRefused, match="local nnsight engine only"):
        plan.generate(model, TEXTS, max_new_tokens=2, remote=True)
    with pytest.raises(GenerationRefused, match=r"write at \{\"index\": -1\}"):
        Plan.of([], [(whole, torch.zeros(2, 8, model.hidden_size))]).generate(
            model, TEXTS, max_new_tokens=2
        )
    with pytest.raises(GenerationRefused, match="num_beams=2"):
        plan.generate(model, TEXTS, max_new_tokens=2, num_beams=2)
    with pytest.raises(GenerationRefused, match="positive int"):
        plan.generate(model, TEXTS, max_new_tokens=0)
    # text is padded on the left for generate whatever the tokenizer's side; a batch
    # encoded on the right is refused
    from causalab_mini.positions import encode

    right = encode(model, TEXTS, padding_side="right")
    with pytest.raises(GenerationRefused, match=r"right-padded.*rows \[1\].*padding_side"):
        plan.generate(model, right, max_new_tokens=2)
    monkeypatch.setattr(model.tokenizer, "padding_side", "right")
    assert plan.generate(model, TEXTS, max_new_tokens=1).tokens.shape == (2, 1)
    monkeypatch.undo()
    monkeypatch.setattr(compat, "is_08", lambda: False)
    with pytest.raises(GenerationRefused, match=r"install nnsight>=0\.8"):
        plan.generate(model, TEXTS, max_new_tokens=2)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_stops_where_transformers_generate_stops(
    family: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    """No min_new_tokens is added: with the first token generated as EOS, Plan.generate
    stops after one step, as transformers' generate does with the same arguments; with
    min_new_tokens=max_new_tokens it runs every step."""
    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight>=0.8")
    model = _model(tiny_model, family)
    last = locate(model, "block_output", 1, position=LAST)
    plan = Plan.of([last])
    free = plan.generate(model, ["Hello"], max_new_tokens=STEPS, do_sample=False)
    first = int(free.tokens[0, 0])
    stopped = plan.generate(
        model, ["Hello"], max_new_tokens=STEPS, do_sample=False, eos_token_id=first
    )
    ids = model.tokenizer(["Hello"], return_tensors="pt")
    reference = model._model.generate(
        **ids, max_new_tokens=STEPS, do_sample=False, eos_token_id=first
    )
    assert torch.equal(stopped.sequences, reference)
    assert tuple(stopped.tokens.shape) == (1, 1) and len(stopped.steps) == 1
    assert torch.equal(stopped.steps[0][last], free.steps[0][last])
    held = plan.generate(
        model,
        ["Hello"],
        max_new_tokens=STEPS,
        do_sample=False,
        eos_token_id=first,
        min_new_tokens=STEPS,
    )
    assert tuple(held.tokens.shape) == (1, STEPS) and len(held.steps) == STEPS
