"""The sweep's certify: what it makes of a needle that resolves only in a trace, and
its query/key checks on attention functions whose mask is more than causal."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from causalab_mini import RenameConfig
from causalab_mini.generated import DEFAULT_ADDRESSES
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c
from causalab_mini.tools.checks import engines, positions, ragged
from causalab_mini.tools.sweep import Result, certify

from .conftest import gpt2_with_a_moved_op

pytestmark = pytest.mark.slow

# the sweep check in_place_edits (tests/test_noops.py), on every writable place
IN_PLACE = "an in-place edit of a read is the place's write, and keeps earlier reads"


def _values(checks: list[str]) -> list[str]:
    """A component's checks of its values: without the engines' comparison
    (checks.engines), which holds the hooks engine to the nnsight engine's tensors, and
    without the checks of the verbs at the place (mechanisms, featurizers, gradients:
    checks.interventions, checks.gradients), which hold on every family alike."""
    from causalab_mini.tools.checks import gradients, interventions

    verbs = {
        getattr(module, name)
        for module in (interventions, gradients)
        for name in dir(module)
        if name.isupper() and isinstance(getattr(module, name), str)
    }
    return [
        c
        for c in checks
        if not c.startswith("engine='hooks'") and not any(c.startswith(v) for v in verbs)
    ]


def test_a_nested_needle_that_names_no_operation_is_refused_not_a_crash() -> None:
    # the second needle is looked up inside the function attention_interface
    # dispatches to, so only the trace finds it missing
    model = gpt2_with_a_moved_op()
    result = certify(model, c.sample_inputs(model))
    probs = result["attention_probs"]
    assert probs["state"] == "refused"
    assert probs["reason"].startswith(
        "component 'attention_probs': attention_probabilities: the forward of "
        "layers.0.self_attn.attention_interface_"
    )
    assert "has no operation called as 'module.attn_dropout('" in probs["reason"]
    assert "Its operations are" in probs["reason"]
    # the rest is read and checked as before
    assert result["attention_z"]["state"] == "ok"
    assert result["block_output"]["state"] == "ok"


def test_query_and_key_are_checked_through_the_probabilities_when_scores_are_refused(
    certified: Callable[[str], Result],
) -> None:
    # MiMo-V2-Flash's attention function calls F.softmax over the scores less the row
    # max, a sink column appended on its sliding-window layers: the scores are refused
    # (its family file says why), and q and k are checked against the probabilities
    result = certified("tiny:mimo_v2_flash")
    assert result.outcome == "certified", result.reason
    scores = result.components["attention_scores"]
    assert scores["state"] == "refused"
    assert "not offered on MiMo-V2-Flash" in scores["reason"] and "sink" in scores["reason"]
    for name in ("attention_query", "attention_key"):
        item = result.components[name]
        assert item["state"] == "ok", item
        assert _values(item["checks"]) == [
            "log attention_probs == q·kᵀ·scaling + mask + a constant per query"
        ]


def test_scores_are_checked_against_the_mask_the_attention_function_is_given(
    certified: Callable[[str], Result],
) -> None:
    # Doge's attention adds a dynamic mask computed from the values, nonzero on the
    # keys a query sees: the scores are q·kᵀ·scaling plus that mask, not plus 0
    result = certified("tiny:doge")
    for name in ("attention_query", "attention_key", "attention_scores"):
        assert result.components[name]["state"] == "ok", result.components[name]


@pytest.mark.parametrize("with_scores", [True, False])
def test_a_wrong_query_fails_the_query_key_check(
    with_scores: bool, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    from causalab_mini.components import Plan, locate
    from causalab_mini.tools.checks import recompute

    model = tiny_model("tiny:llama", probs=True)
    inputs = c.sample_inputs(model)
    names = ["attention_query", "attention_key", "attention_probs"]
    if with_scores:
        names.append("attention_scores")
    addresses = {(n, 1): locate(model, n, 1) for n in names}
    out = Plan.of(reads=addresses.values()).run(model, inputs)
    values = {key: out[a] for key, a in addresses.items()}
    raw = recompute.raw_outputs_of(model, inputs, addresses)
    for factor, holds in ((1.0, True), (1.1, False)):
        tampered = {**values, ("attention_query", 1): values[("attention_query", 1)] * factor}
        outcomes = list(recompute.interior_checks(model, tampered, raw, 1))
        assert [o.ok for o in outcomes if "attention_query" in o.components] == [holds]


def test_the_unembedding_is_checked_on_what_it_reads(certified: Callable[[str], Result]) -> None:
    # MiniCPM3 divides the final norm's output by logits_scaling before lm_head: the
    # norm's output is still output_hidden_states[-1], and lm_head is checked on the
    # input it was given; where that input is ln_final (Llama) the check says so
    cpm = certified("tiny:minicpm3").components
    assert cpm["ln_final"]["state"] == "ok"
    assert "output_hidden_states[-1] == ln_final" in cpm["ln_final"]["checks"]
    assert cpm["lm_head"]["state"] == "ok"
    assert "lm_head == get_output_embeddings()(the unembedding's input)" in cpm["lm_head"]["checks"]
    llama = certified("tiny:llama").components
    assert "lm_head == get_output_embeddings()(ln_final)" in llama["lm_head"]["checks"]


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_the_mlp_is_called_with_the_other_arguments_it_was_given(
    certified: Callable[[str], Result],
) -> None:
    # Zaya's MLP takes the router state of the layer before; MPT's the residual
    for model_type in ("zaya", "mpt"):
        item = certified(f"tiny:{model_type}").components["mlp_input"]
        assert item["state"] == "ok", item
        assert "mlp(mlp_input, its other arguments) == the MLP's output" in item["checks"]


def test_a_whole_model_place_that_depends_on_the_trace_is_broken() -> None:
    # Dory's model.norm runs 2 + n_recurrent_loops times: ln_final read with the
    # layers' places is the final call, read alone the first; the sweep says so. (Its
    # family reads ln_final at the unembedding's input and refuses the layers' places
    # while the loops repeat; here the default rows are put back.)
    rows = ("ln_final_output", "layers_input", "layers_output")
    model = StandardizedTransformer(
        "tiny:dory",
        enable_attention_probs=True,
        rename_config=RenameConfig(addresses={row: DEFAULT_ADDRESSES[row] for row in rows}),
    )
    components = certify(model, c.sample_inputs(model))
    ln_final = components["ln_final"]
    assert ln_final["state"] == "broken"
    assert ln_final["reason"].startswith("read alone == read with the layers' places")
    assert "the base model's last_hidden_state == ln_final" in ln_final["checks"]
    assert components["logits"]["state"] == "ok"


def test_the_mlp_is_called_with_a_copy_of_the_state_it_was_given(
    certified: Callable[[str], Result],
) -> None:
    # RWKV's feed-forward takes the model's state, a list of tensors the model updates
    # in place after the call: the check calls it again with the state as it was
    item = certified("tiny:rwkv").components["mlp_input"]
    assert item["state"] == "ok", item
    assert "mlp(mlp_input, its other arguments) == the MLP's output" in item["checks"]


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_hidden_states_that_are_block_outputs_are_checked_as_such(
    certified: Callable[[str], Result],
) -> None:
    # Mamba's output_hidden_states lists each block's output (no embeddings entry),
    # as mamba.yaml says: the boundaries are checked against those entries
    components = certified("tiny:mamba").components
    assert components["block_input"]["state"] == "ok"
    assert _values(components["block_input"]["checks"]) == sorted(
        [
            IN_PLACE,
            "output_hidden_states[i-1] == block_input[i]",
            positions.WRITE,
            positions.ALL_TOKENS,
            *(ragged.WRITES.format(side=side) for side in ragged.SIDES),
        ]
    )
    assert _values(components["block_output"]["checks"]) == sorted(
        [
            IN_PLACE,
            "output_hidden_states[i] == block_output[i]",
            positions.READ,
            positions.LAST_TOKEN,
            *(
                n.format(side=side)
                for n in (ragged.MEASURED, ragged.READS)
                for side in ragged.SIDES
            ),
            ragged.SWAPPED,
            engines.GRID,
        ]
    )
    # without the declaration the inputs' convention does not hold on Mamba ...
    undeclared = StandardizedTransformer(
        "tiny:mamba", rename_config=RenameConfig.of(hidden_states_are_block_outputs=False)
    )
    result = certify(undeclared, c.sample_inputs(undeclared))
    assert result["block_input"]["state"] == "broken"
    assert result["block_output"]["state"] == "broken"
    # ... and a wrong declaration on Llama is broken, not taken on trust
    wrong = StandardizedTransformer(
        "tiny:llama", rename_config=RenameConfig.of(hidden_states_are_block_outputs=True)
    )
    result = certify(wrong, c.sample_inputs(wrong))
    assert result["block_input"]["state"] == "broken"
    assert result["block_output"]["state"] == "broken"


@pytest.mark.wide  # (the slowest of the tier: CI runs it with the wide tier)
def test_oracles_that_count_every_layer_call_are_read_from_the_end(
    certified: Callable[[str], Result],
) -> None:
    # HRM-Text (hrm_text.yaml) runs its L stack's layers, of the same class, before its
    # H stack's (the registry's layers): output_hidden_states and output_attentions
    # hold every call, the H stack's last, and the oracles read those
    spec = "tiny:hrm_text?H_cycles=1"
    components = certified(spec).components
    assert components["block_output"]["state"] == "ok"
    assert "output_hidden_states[i+1] == block_output[i]" in components["block_output"]["checks"]
    assert components["attention_probs"]["state"] == "ok"
    assert "output_attentions == attention_probs" in components["attention_probs"]["checks"]
    # without the declaration the first entries (the L stack's calls) are compared
    undeclared = StandardizedTransformer(
        spec, rename_config=RenameConfig.of(oracles_from_last_calls=False)
    )
    result = certify(undeclared, c.sample_inputs(undeclared))
    assert result["block_input"]["state"] == "broken"


def test_a_head_that_transforms_ln_final_is_checked_on_its_unembedding(
    certified: Callable[[str], Result],
) -> None:
    # RoBERTa-PreLayerNorm's lm_head module reads the final norm's output
    # (output_hidden_states[-1]) and runs dense, gelu and layer_norm before its
    # decoder: the decoder is checked on its own input; RoBERTa, whose ln_final is the
    # head's layer_norm, keeps the check on ln_final
    pre = certified("tiny:roberta-prelayernorm").components
    assert pre["ln_final"]["state"] == "ok"
    assert "output_hidden_states[-1] == ln_final" in pre["ln_final"]["checks"]
    assert pre["lm_head"]["state"] == "ok"
    assert (
        "lm_head == get_output_embeddings()(its input inside lm_head), lm_head reading ln_final"
        in pre["lm_head"]["checks"]
    )
    roberta = certified("tiny:roberta").components
    assert "lm_head == get_output_embeddings()(ln_final)" in roberta["lm_head"]["checks"]


def test_neurons_with_no_mlp_output_are_held_to_the_activation(
    certified: Callable[[str], Result],
) -> None:
    # X-MOD's feed-forward ends in a language adapter, so mlps_output is refused: the
    # neurons are checked against the activation instead; where the MLP's output
    # exists (BERT) the activation check covers the activation alone
    xmod = certified("tiny:xmod").components
    assert xmod["mlp_output"]["state"] == "refused"
    assert xmod["mlp_neuron_output"]["state"] == "ok"
    assert _values(xmod["mlp_neuron_output"]["checks"]) == [
        IN_PLACE,
        "mlp_neuron_output == mlp_activation (x a gate)",
    ]
    bert = certified("tiny:bert").components
    assert _values(bert["mlp_neuron_output"]["checks"]) == [
        IN_PLACE,
        "down projection(mlp_neuron_output) == the MLP's output",
    ]


def test_layers_mid_is_checked_through_its_norm_where_no_contribution_is_read(
    certified: Callable[[str], Result],
) -> None:
    # MiniCPM3 refuses both contribution rows (scaled by scale_depth /
    # sqrt(num_hidden_layers)), so no identity names layers_mid: it is checked as the
    # input of the norm whose output is mlps_norm_output
    mid = certified("tiny:minicpm3").components["block_mid"]
    assert mid["state"] == "ok", mid
    assert _values(mid["checks"]) == [
        "a write keeps every earlier read, reads back, and reaches the stream",
        IN_PLACE,
        "the MLP's norm(layers_mid) == mlps_norm_output",
    ]
    llama = certified("tiny:llama").components["block_mid"]
    assert "the MLP's norm(layers_mid) == mlps_norm_output" not in llama["checks"]


def test_a_wrong_head_size_is_broken_by_the_layout_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # the config's head_dim of a latent-attention model is the rope part (8), not the
    # q/k (16) or value (16) head size: a per-head component stating it is broken
    from causalab_mini import locator as locate

    model = StandardizedTransformer("tiny:deepseek_v3", enable_attention_probs=True)
    assert model.text_config.head_dim == 8
    monkeypatch.setattr(locate, "head_size", lambda m, layer, kind: m.text_config.head_dim)
    result = certify(model, c.sample_inputs(model))
    for name in ("attention_query", "attention_key", "attention_z", "attention_premix"):
        item = result[name]
        assert item["state"] == "broken", (name, item)
        assert item["reason"].startswith(
            "the heads and head size stated == the tensor's, heads x head size == its width"
        )
    assert "holds heads of size 16" in result["attention_query"]["reason"]
    assert "states 4 heads x 8 = 32" in result["attention_premix"]["reason"]
    # the values themselves are right: the rest certifies
    for name in ("attention_scores", "attention_probs", "block_output"):
        assert result[name]["state"] == "ok", result[name]


def test_a_family_no_block_structure_applies_to_certifies_what_it_keeps(
    certified: Callable[[str], Result],
) -> None:
    # Dory: no block structure applies (structure_unknown_reason), and the layers'
    # places are refused while its loops repeat; the rest certifies, nothing broken
    result = certified("tiny:dory")
    assert result.outcome == "certified" and result.structure is None
    assert result.counts()["broken"] == 0, result.components
    for name in ("ln_final", "lm_head", "logits", "embeddings"):
        assert result.components[name]["state"] == "ok", result.components[name]
    for name in ("block_mid", "attention_output", "mlp_neuron_output", "attention_premix"):
        item = result.components[name]
        assert item["state"] == "refused"
        assert (
            "is refused on Dory: it is one of the places a block structure defines"
            in (item["reason"])
        )


def test_the_position_checks_take_only_a_text_batch() -> None:
    """The position and interchange checks feed the model text: they apply where the
    sample batch is the tokenizer's own, (batch, seq) ids and a mask, and say nothing
    where the forward reads more (a side input) or ids of another shape (Kyutai-STT's
    text token and audio codes per position, (batch, seq, 1 + codebooks))."""
    from types import SimpleNamespace

    import torch

    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    assert positions.text_fed(SimpleNamespace(inputs={"input_ids": ids, "attention_mask": mask}))
    coded = torch.ones(2, 5, 3, dtype=torch.long)
    fed = {"input_ids": coded, "attention_mask": mask}
    assert not positions.text_fed(SimpleNamespace(inputs=fed))
    side = {"input_ids": ids, "attention_mask": mask, "pixel_values": torch.zeros(2, 3)}
    assert not positions.text_fed(SimpleNamespace(inputs=side))
