"""The chat frame on a trained chat model (the `real` tier: SmolLM2-135M-Instruct,
tests/real_model.py): the chat prompt runs whether or not a step names positions, the
logits are read at the end of the generation prompt (where the model answers), and
Plan.generate stops where transformers' generate stops."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from causalab_mini import positions as P
from causalab_mini.components import Plan, locate
from causalab_mini.interchange import interchange

from .real_model import cache_dir, smollm2

pytestmark = [pytest.mark.real, pytest.mark.slow]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def model() -> Any:
    if not (cache_dir() / "config.json").is_file():
        pytest.importorskip(
            "gguf", reason="the real tier reads a GGUF file: pip install -e '.[real]'"
        )
    from causalab_mini.model import StandardizedTransformer

    torch.set_num_threads(1)
    return StandardizedTransformer(str(smollm2()))


def _prompt(model: Any, text: str) -> Any:
    rendered = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return model.tokenizer([rendered], add_special_tokens=False, return_tensors="pt")


def test_the_chat_frame_runs_the_chat_prompt_and_reads_its_end(model: Any) -> None:
    whole = locate(model, "block_output", 0)
    prompt = _prompt(model, QUESTION)
    got = Plan.of([whole]).run(model, [QUESTION], frame="chat")[whole]
    assert got.shape[1] == prompt["input_ids"].shape[1]  # not the plain text's length
    patch = locate(model, "block_output", 3, position={"index": -1})
    result = interchange(model, [patch], [QUESTION], [QUESTION], frame="chat")
    with model.trace(dict(prompt)):
        logits = model.logits.save()
    assert torch.allclose(result.logits[0], logits[0, -1], atol=1e-4)
    # where the model answers, not the message's last token (whose top-1 closes the turn)
    top = model.tokenizer.convert_ids_to_tokens(int(result.logits[0].argmax()))
    assert top != "<|im_end|>"
    end = P.resolve(model, P.encode(model, [QUESTION], frame="chat"), {"anchor": "last"})
    assert end == [[prompt["input_ids"].shape[1] - 1]]


def test_generate_in_the_chat_frame_answers_as_transformers_does(model: Any) -> None:
    from causalab_mini import compat

    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight>=0.8")
    nxt = locate(model, "logits", position={"anchor": "last"})
    out = Plan.of([nxt]).generate(
        model, [QUESTION], max_new_tokens=40, do_sample=False, frame="chat"
    )
    prompt = _prompt(model, QUESTION)
    reference = model._model.generate(**prompt, max_new_tokens=40, do_sample=False)
    assert torch.equal(out.sequences, reference)
    assert torch.equal(out.steps[0][nxt][:, 0].argmax(-1), out.tokens[:, 0])
    assert "Paris" in model.tokenizer.decode(out.tokens[0])
