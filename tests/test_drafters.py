"""Models whose forward reads more than token ids (registry/tiny.yaml side_inputs):
the Gemma-4 speculative-decoding drafters. The side inputs have the shapes the row
reads from the config, the drafter's output depends on them and not on the token
ids (which is why input_ids and embeddings are refused on it), and the first block
receives pre_projection of the target's states."""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.generated.tiny import TINY_SIDE_INPUTS
from causalab_mini.tools import certify
from causalab_mini.tools.tiny import causal_lm_model_types, group_of, side_inputs, tiny_config

pytestmark = pytest.mark.slow

DRAFTERS = [
    pytest.param(
        t,
        marks=[]
        if t in causal_lm_model_types()
        else [pytest.mark.skip(reason=f"{t} is not in this transformers")],
    )
    for t in sorted(TINY_SIDE_INPUTS)
    # the drafters' inputs are made tensors; an encoder-decoder's decoder inputs are
    # the token batch's own (tests/test_seq2seq.py)
    if not any("from" in row for row in TINY_SIDE_INPUTS[t].values())
    # a multimodal model fed an image or audio (idefics, voxtral_realtime) belongs to
    # another group, not the drafters' (tests/test_audio.py feeds voxtral_realtime)
    and group_of(t) in (None, "causal_lm")
]


def test_the_registry_has_drafters() -> None:
    # the drafter test is parametrized from tiny.yaml: an empty list would run nothing
    assert {p.values[0] for p in DRAFTERS} >= {"gemma4_assistant"}


def test_side_inputs_follow_the_config() -> None:
    """Every per-layer-type input maps each distinct layer type to tensors of that
    type's own geometry (Gemma-4's full-attention layers have wider heads)."""
    assert side_inputs(tiny_config("llama"), 2, 5) == {}
    config = tiny_config("gemma4_assistant")
    text = config.text_config
    made = side_inputs(config, 2, 5)
    assert tuple(made["inputs_embeds"].shape) == (2, 1, 2 * config.backbone_hidden_size)
    assert set(made["shared_kv_states"]) == set(text.layer_types)
    for kind, (key, value) in made["shared_kv_states"].items():
        layer = text.per_layer_config[text.layer_types.index(kind)]
        assert tuple(key.shape) == (2, layer.num_key_value_heads, 5, layer.head_dim)
        assert key.shape == value.shape and not key.equal(value)
    widths = {kind: k.shape[-1] for kind, (k, _) in made["shared_kv_states"].items()}
    assert widths["full_attention"] != widths["sliding_attention"]
    # seeded: the same inputs every time, others for another seed
    again = side_inputs(config, 2, 5)
    assert again["inputs_embeds"].equal(made["inputs_embeds"])
    assert not side_inputs(config, 2, 5, seed=1)["inputs_embeds"].equal(made["inputs_embeds"])


def _loaded(spec: str) -> Any:
    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tools.tiny import resolve_model_spec

    return StandardizedTransformer(resolve_model_spec(spec), enable_attention_probs=True)


@pytest.mark.parametrize("model_type", DRAFTERS)
def test_a_drafter_reads_the_target_states_not_the_token_ids(model_type: str) -> None:
    import torch

    model = _loaded(f"tiny:{model_type}")
    inputs = certify.sample_inputs(model)
    assert set(TINY_SIDE_INPUTS[model_type]) <= set(inputs)
    # (a trace first: it dispatches the weights the plain forwards below use)
    values = certify.read_places(model, inputs, ["layers_input", "layers_output"])
    hf = model._model

    def logits(**change: Any) -> Any:
        with torch.no_grad():
            return hf(**{**inputs, **change}).logits

    base = logits()
    # other token ids: the same logits (the forward never reads them)
    assert torch.equal(logits(input_ids=torch.flip(inputs["input_ids"], (1,))), base)
    # other target states, or other shared keys and values: other logits
    other = side_inputs(hf.config, *inputs["input_ids"].shape, seed=1)
    assert not torch.allclose(logits(inputs_embeds=other["inputs_embeds"]), base)
    assert not torch.allclose(logits(shared_kv_states=other["shared_kv_states"]), base)

    # the first block receives pre_projection of the target's states, and the places
    # keep their identities (and transformers' hidden states) on the drafter
    with torch.no_grad():
        projected = hf.pre_projection(inputs["inputs_embeds"])
    assert certify.difference(values[("layers_input", 0)], projected)[0]
    everything = certify.read_places(model, inputs)
    checks = certify.identities(model, everything) + certify.hidden_state_oracle(
        model, inputs, everything
    )
    assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert any(c.description.startswith("hidden_states") for c in checks)
