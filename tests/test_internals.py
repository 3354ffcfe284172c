"""model.internals on every block structure: the names mean what they say on real
tensors (the registry's identities, transformers' own outputs as oracles), writes
reach the stream, and availability is decided without running the model."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from causalab_mini import Address, FirstIfTuple, Index, IOType, RenameConfig
from causalab_mini.generated import (
    BLOCK_STRUCTURES,
    DEFAULT_ADDRESSES,
    FAMILY_ADDRESSES,
    FAMILY_LOADING,
    FAMILY_MATCH,
)
from causalab_mini.internals import PlaceUnavailable, RenameError
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

from .registry_cases import Case, rule_cases

Load = Callable[..., StandardizedTransformer]

# The block structures whose every layer is attention and an MLP on one residual
# stream, as transformers' hidden states and nnterp's accessors describe it: the
# oracles of this file apply there. Models of other structures (and of none) are
# certified by tests/test_families.py with their families' declarations.
ATTENTION_AND_MLP = {"pre_norm", "sandwich_norm", "post_norm", "parallel", "residual_inside"}

# Every model type the block-structure rules name whose rules all give one of those
# structures, with the config values the rules and family matches decide by and the
# attributes rows scale by (tests/registry_cases.py): the representatives run in the
# README's test command, the rest in CI (marker `wide`).
CASES = [case for case in rule_cases() if case.structures and case.structures <= ATTENTION_AND_MLP]
FAMILIES = [case.param(case) for case in CASES]

# Granite with every multiplier away from 1 (the residual's, the embeddings', the
# logits'): the rows state residual_multiplier, and the identities see whether it is applied.
GRANITE = "tiny:granite?residual_multiplier=0.37&embedding_multiplier=3.0&logits_scaling=2.0"

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def _available(
    model: StandardizedTransformer, rows: tuple[str, ...] | list[str], layer: int
) -> bool:
    return all(model.internals[row].unavailable_on(layer) is None for row in rows)


def _replaced(model: StandardizedTransformer) -> set[str]:
    """The rows the model's family files replace, other than by where they are
    available (a family row that only adds reasons, as on Mllama's cross-attention
    layers, reads what the default row and nnterp's accessor read)."""
    matches = [FAMILY_MATCH[family] for family in model.families]
    return {
        name
        for match, rows in FAMILY_ADDRESSES
        if match in matches
        for name, row in rows.items()
        if name not in DEFAULT_ADDRESSES
        or replace(row, unavailable=DEFAULT_ADDRESSES[name].unavailable) != DEFAULT_ADDRESSES[name]
    }


def _skips_nnterp_checks(model: StandardizedTransformer) -> str | None:
    for family in model.families:
        if FAMILY_LOADING[family].skip_nnterp_checks:
            return f"family {family} skips nnterp's checks: nnterp's accessors do not apply"
    return None


def _identities_and_oracles(model: StandardizedTransformer, structure: str | None) -> list[Any]:
    """Every identity on every layer where its places are available, the hidden-state
    oracle, and the write to the mid-stream wherever a block has one."""
    assert model.block_structure == structure
    # a layer the oracles leave out (skipped on text-only input) has no places there
    for layer in set(range(model.internals.num_layers)) - set(model.internals.layers_run_on_text()):
        assert model.internals["layers_input"].unavailable_on(layer) is not None, layer
    inputs = c.sample_inputs(model)
    # padded on the side the model's tokenizer pads (nnsight 0.8 pads a causal LM's
    # batch on the left, an encoder-decoder's on the right: T5Gemma 2's decoder, whose
    # blocks are of an attention-and-MLP structure; 0.6/0.7 pad every batch on the left)
    side = 0 if model.tokenizer.padding_side == "left" else -1
    assert inputs["attention_mask"][0, side] == 0, "the batch must be padded"
    values = c.read_places(model, inputs)
    checks = c.identities(model, values)
    expected_identities = sum(
        _available(model, c.identity_rows(text), layer)
        for text in BLOCK_STRUCTURES[model.block_structure].identities
        for layer in range(model.internals.num_layers)
    )
    assert expected_identities > 0 or model.internals.status()["layers_mid"] is not None
    assert len(checks) == expected_identities, "every identity is checked on every layer"
    checks += c.hidden_state_oracle(model, inputs, values)
    write = c.write_reaches_stream(model, inputs)
    if write is None:  # only where a place the write needs is refused
        needs = ["layers_mid", "mlps_output", c.mid_write_target(model) or "layers_output"]
        if model.block_structure == "parallel":
            needs = ["attentions_output", "layers_output"]
        assert not _available(model, needs, 0), "the write to the stream was not checked"
    else:
        checks.append(write)
    return checks


@pytest.mark.parametrize("case", FAMILIES)
def test_identities_oracles_and_write(case: Case, tiny_model: Load) -> None:
    model = tiny_model(case.spec)
    checks = _identities_and_oracles(model, case.expected_structure())
    failed = [check for check in checks if not check.ok]
    assert not failed, failed


@pytest.mark.parametrize("case", FAMILIES)
def test_attention_probabilities_match_output_attentions(case: Case, tiny_model: Load) -> None:
    model = tiny_model(case.spec, probs=True)
    place = model.internals["attention_probabilities"]
    layers = [i for i in range(model.internals.num_layers) if place.unavailable_on(i) is None]
    if not layers:  # refused (on this model, or this transformers), with the reason
        pytest.skip(model.internals.status()["attention_probabilities"])
    inputs = c.sample_inputs(model)
    model.dispatch()  # the oracle runs the module itself: real weights, not meta ones
    if len(layers) == model.internals.num_layers:
        checks = c.attention_oracle(model, inputs)
    else:  # a hybrid: output_attentions has an entry for each attention layer only
        with torch.no_grad():
            out = model._model(**c.forward_inputs(model, inputs), output_attentions=True)
        theirs = [a for a in out.attentions if a is not None]
        assert len(theirs) == len(layers), (len(theirs), layers)
        values = c.read_places(model, inputs, ["attention_probabilities"])
        checks = [
            c.compare(
                "output_attentions == attention_probabilities",
                layer,
                values[("attention_probabilities", layer)],
                want,
            )
            for layer, want in zip(layers, theirs, strict=True)
        ]
    assert [check.layer for check in checks] == layers  # every layer that has attention
    assert all(check.ok for check in checks), checks


@pytest.mark.parametrize("case", FAMILIES)
def test_nnterp_accessors_agree_where_they_name_the_same_tensor(
    case: Case, tiny_model: Load
) -> None:
    import nnterp

    model = tiny_model(case.spec)
    skip = _skips_nnterp_checks(model)
    if skip:
        pytest.skip(skip)
    inputs = c.sample_inputs(model)
    values = c.read_places(
        model, inputs, ["layers_input", "layers_output", "attentions_output", "mlps_output"]
    )
    theirs: list[Any] = []
    names = ["layers_input", "layers_output"]
    if model.block_structure in ("pre_norm", "parallel"):
        names += ["attentions_output", "mlps_output"]
    # where a family file replaces a row, nnterp's accessor (the module's output) is
    # not the sublayer's contribution: our row differs on purpose
    names = [n for n in names if n not in _replaced(model)]
    with model.trace(inputs):
        for layer in range(model.num_layers):
            for name in sorted(names, key=lambda n: DEFAULT_ADDRESSES[n].order):
                if (name, layer) not in values:  # refused on this layer
                    continue
                accessor = getattr(nnterp.StandardizedTransformer, "__dict__", {}).get(name)
                assert accessor is None  # nnterp's accessors are instance attributes
                theirs.append((name, layer, _nnterp_read(model, name, layer).save()))
    assert theirs, "nothing was compared"
    for name, layer, tensor in theirs:
        got = c.compare(name, layer, values[(name, layer)], getattr(tensor, "value", tensor))
        assert got.ok, got


def _nnterp_read(model: StandardizedTransformer, name: str, layer: int) -> Any:
    from nnterp.rename_utils import IOType as NIO
    from nnterp.rename_utils import LayerAccessor

    attr = {"layers": None, "attentions": "self_attn", "mlps": "mlp"}[name.split("_")[0]]
    io = NIO.INPUT if name.endswith("input") else NIO.OUTPUT
    return LayerAccessor(model, attr, io)[layer]


def test_a_wrong_row_fails_its_identity() -> None:
    """The checks can fail: on a sandwich block the attention module's own output is
    a plausible neighbour of the contribution (same shape), and the identity refuses it."""
    wrong = RenameConfig(addresses={"attentions_output": DEFAULT_ADDRESSES["attentions_output"]})
    model = StandardizedTransformer("tiny:gemma2", rename_config=wrong)
    inputs = c.sample_inputs(model)
    checks = c.identities(model, c.read_places(model, inputs))
    assert any(not check.ok for check in checks if "attentions_output" in check.description)


def test_an_unscaled_contribution_fails_its_identity(tiny_model: Load) -> None:
    """Granite's rows state residual_multiplier: with them the identities and oracles
    hold (every multiplier away from 1), without it the identity refuses."""
    checks = _identities_and_oracles(tiny_model(GRANITE), "pre_norm")
    assert checks and all(check.ok for check in checks), checks
    unscaled = RenameConfig(addresses={"attentions_output": DEFAULT_ADDRESSES["attentions_output"]})
    model = StandardizedTransformer(GRANITE, rename_config=unscaled)
    checks = c.identities(model, c.read_places(model, c.sample_inputs(model)))
    assert any(not check.ok for check in checks if "attentions_output" in check.description)


def test_at_a_glance_one_name_two_spellings(tiny_model: Load) -> None:
    llama, gpt2 = tiny_model("tiny:llama"), tiny_model("tiny:gpt2")
    for model, module in ((llama, "post_attention_layernorm"), (gpt2, "ln_2")):
        row = model.internals["layers_mid"].address
        assert (model.block_structure, row.module, row.io) == ("pre_norm", module, IOType.INPUT)
    assert llama.internals["attentions_premix"].address.module == "self_attn.o_proj"
    assert gpt2.internals["attentions_premix"].address.module == "self_attn.c_proj"


DEFAULT_ROWS = list(DEFAULT_ADDRESSES)
# the spec's twenty names and the four places the anchors add (each head's term of
# the output projection, a gated MLP's halves, a non-gated MLP's input projection), in
# forward order: what a pre-norm Llama or GPT-2 has
DEFAULT_NAMES = [
    "embeddings_input",
    "embeddings_output",
    "layers_input",
    "attentions_norm_output",
    "attentions",
    "attentions_input",
    "attention_probabilities",
    "attentions_premix",
    "attentions_head_output",
    "attentions_output",
    "layers_mid",
    "mlps_norm_output",
    "mlps",
    "mlps_input",
    "mlps_gate",
    "routers_logits",
    "routers_weights",
    "routers_indices",
    "mlps_expert_output",
    "mlps_shared_expert",
    "mlps_pre",
    "mlps_activation",
    "mlps_up",
    "mlps_neurons",
    "mlps_output",
    "layers_output",
    "ln_final_output",
    "lm_head_output",
    "logits",
]
POST_LN_ONLY = ["layers_mid_prenorm", "layers_output_prenorm"]
# a dense MLP (no experts) refuses the router's and the experts' places, in this order
DENSE_MLP = [
    "routers_logits",
    "routers_weights",
    "routers_indices",
    "mlps_expert_output",
    "mlps_shared_expert",
]


def test_status_names_the_default_rows_in_forward_order(tiny_model: Load) -> None:
    assert DEFAULT_ROWS == DEFAULT_NAMES
    # Llama's MLP is gated (no single input projection), GPT-2's is not (no halves)
    refused = {
        "tiny:llama": ["attention_probabilities", *DENSE_MLP, "mlps_pre"],
        "tiny:gpt2": ["attention_probabilities", "mlps_gate", *DENSE_MLP, "mlps_up"],
    }
    for spec in ("tiny:llama", "tiny:gpt2"):
        status = tiny_model(spec).internals.status()
        assert list(status) == DEFAULT_NAMES
        missing = {k: v for k, v in status.items() if v is not None}
        assert list(missing) == refused[spec]
        assert "enable_attention_probs=True" in missing["attention_probabilities"]
    assert (
        tiny_model("tiny:llama", probs=True).internals.status()["attention_probabilities"] is None
    )


def test_a_post_ln_block_adds_its_structure_rows_in_forward_order(tiny_model: Load) -> None:
    # rows block_structures.yaml declares under post_ln: only post-LN models have them,
    # sorted among the default rows by their order
    from causalab_mini.generated import STRUCTURE_ADDRESSES

    model = tiny_model("tiny:openai-gpt")
    assert model.block_structure == "post_ln"
    assert list(STRUCTURE_ADDRESSES["post_ln"]) == POST_LN_ONLY
    names = list(model.internals.status())
    assert sorted(names) == sorted([*DEFAULT_NAMES, *POST_LN_ONLY])
    assert names.index("layers_mid_prenorm") == names.index("attentions_output") + 1
    assert names.index("layers_output_prenorm") == names.index("layers_output") - 1
    orders = [model.internals[n].row.order for n in names if model.internals[n].row.per_layer]
    assert orders == sorted(orders)
    for name in POST_LN_ONLY:
        assert model.internals.status()[name] is None
        assert hasattr(model, name)
    for spec in ("tiny:llama", "tiny:gpt_neox"):
        other = tiny_model(spec)
        assert not set(POST_LN_ONLY) & set(other.internals.status())
        assert not hasattr(other, "layers_mid_prenorm")


def test_status_on_a_parallel_block_says_why(tiny_model: Load) -> None:
    status = tiny_model("tiny:gpt_neox").internals.status()
    assert list(status) == DEFAULT_ROWS
    assert status["layers_mid"] == (
        "layers_mid does not exist on this model: its block is 'parallel'. Attention and the "
        "MLP both read the block input, so there is no residual stream between them."
    )
    assert status["mlps_norm_output"].startswith("mlps_norm_output does not exist on this model")
    assert "GPT-NeoX the second norm exists" in status["mlps_norm_output"]
    assert status["attentions_output"] is None and status["mlps_output"] is None


def test_a_family_says_why_no_block_structure_applies(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Load
) -> None:
    # Dory's family gives structure_unknown_reason: it is the reason of every
    # structural place (those resolved through structural.yaml, and those refused
    # where the structure is unknown), with the place's name filled in
    from causalab_mini.tools.tiny import causal_lm_model_types

    if "dory" not in causal_lm_model_types():
        pytest.skip("Dory is not in this transformers (it arrived after 5.17)")
    model = tiny_model("tiny:dory")
    assert model.block_structure is None and model.families == ("dory",)
    status = model.internals.status()
    for row in ("attentions_norm_output", "layers_mid", "mlps_neurons", "attentions_output"):
        assert status[row] is not None
        assert status[row].startswith(
            f"{row} is refused on Dory: it is one of the places a block structure defines"
        ), status[row]
    # without the family's reason, the generic one (add a rule)
    import dataclasses

    from causalab_mini import family
    from causalab_mini.generated import FAMILIES

    unsaid = dataclasses.replace(FAMILIES["dory"], structure_unknown=None)
    monkeypatch.setattr(family, "FAMILIES", {**FAMILIES, "dory": unsaid})
    other = StandardizedTransformer("tiny:dory").internals.status()
    assert "no rule in registry/block_structures.yaml matches" in str(other["layers_mid"])
    assert "no rule in registry/block_structures.yaml gives" in str(other["attentions_output"])


def test_status_runs_no_forward_pass() -> None:
    model = StandardizedTransformer("tiny:llama")
    calls: list[int] = []
    handle = model._model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        for layer in (None, 0, 1):
            model.internals.status(layer)
        model.internals["layers_mid"].address_at(2)
    finally:
        handle.remove()
    assert calls == []


def test_rank_is_layer_and_order(tiny_model: Load) -> None:
    internals = tiny_model("tiny:llama").internals
    n = internals.num_layers
    assert internals.rank("embeddings_input") == (-1, -2)
    assert internals.rank("layers_mid", 1) == (1, 33)
    assert internals.rank("ln_final_output") == (n, 1000)
    assert internals.rank("logits") == (n, 1002)
    with pytest.raises(IndexError, match=rf"layers 0\.\.{n - 1}"):
        internals.rank("layers_mid", n)
    ranks = [internals.rank(name, 0) for name in internals]
    assert ranks == sorted(ranks)


def test_reading_a_refused_place_says_why_and_where(tiny_model: Load) -> None:
    model = tiny_model("tiny:gpt_neox")
    with pytest.raises(PlaceUnavailable) as info:
        with model.trace(c.sample_inputs(model)):
            model.layers_mid[1].save()
    text = str(info.value)
    assert "model.internals['layers_mid'][1]" in text and "GPTNeoXForCausalLM" in text
    assert "block 'parallel'" in text and "family gpt_neox" in text


def test_structural_resolution_refuses_none_and_several() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from causalab_mini.tools.tiny import build_tiny

    path = build_tiny("llama")
    module = AutoModelForCausalLM.from_pretrained(path)
    layers = module.model.layers
    layers[0].ln_1 = torch.nn.LayerNorm(module.config.hidden_size)  # a second candidate
    del layers[1].post_attention_layernorm  # no candidate left (nothing runs the model)
    model = StandardizedTransformer(
        module, tokenizer=AutoTokenizer.from_pretrained(path), check_renaming=False
    )
    several = model.internals.status(layer=0)["attentions_norm_output"]
    assert several is not None and "ambiguous" in several
    assert "input_layernorm, ln_1 all exist" in several and "RenameConfig(addresses=" in several
    assert model.internals.status(layer=2)["attentions_norm_output"] is None
    none = model.internals.status(layer=1)["layers_mid"]
    assert none is not None and "none of the candidates" in none
    assert "post_attention_layernorm, ln_2" in none and "self_attn" in none
    assert "RenameConfig(addresses={'layers_mid'" in none
    whole = model.internals.status()["attentions_norm_output"]
    assert whole is not None and whole.startswith("available on layers [1, 2] only; on layers [0]")


def test_user_rows_add_and_replace() -> None:
    config = RenameConfig(
        addresses={
            "attentions_gate": Address("self_attn.q_proj", IOType.OUTPUT, order=15),
        }
    )
    model = StandardizedTransformer("tiny:llama", rename_config=config)
    assert "attentions_gate" in model.internals
    assert (
        repr(model.internals["attentions_gate"])
        == "<attentions_gate: self_attn.q_proj.output, per layer>"
    )
    assert model.internals.rank("attentions_gate", 1) == (1, 15)
    inputs = c.sample_inputs(model)
    values = c.read_places(model, inputs, ["attentions_norm_output", "attentions_gate"])
    q_proj = model._model.model.layers[1].self_attn.q_proj  # dispatched by the trace
    with torch.no_grad():
        expected = q_proj(values[("attentions_norm_output", 1)])
    assert torch.allclose(values[("attentions_gate", 1)], expected, atol=1e-6)


def test_attention_probabilities_refused_at_load_are_not_handed_to_nnterp() -> None:
    """A row refused always (or by a config condition the model meets) is not given to
    nnterp's load-time check: a needle that names nothing loads, and the place says why."""
    from dataclasses import replace

    from causalab_mini.address import Condition, Unavailable

    bogus = replace(DEFAULT_ADDRESSES["attention_probabilities"], source=("no_such_call(",))

    def refused(when: Condition) -> RenameConfig:
        reason = Unavailable(when, "{place} is refused on this test model")
        return RenameConfig(
            addresses={"attention_probabilities": replace(bogus, unavailable=(reason,))}
        )

    for when in (
        Condition("always"),
        Condition("config", config=(("model_type", "llama"),)),
    ):
        model = StandardizedTransformer(
            "tiny:llama", rename_config=refused(when), enable_attention_probs=True
        )
        assert model.internals.status()["attention_probabilities"] == (
            "attention_probabilities is refused on this test model"
        )
        assert model.attention_probs_enabled
    # a config condition the model does not meet: nnterp checks the row, and fails
    with pytest.raises(Exception, match="no_such_call"):
        StandardizedTransformer(
            "tiny:llama",
            rename_config=refused(Condition("config", config=(("model_type", "gpt2"),))),
            enable_attention_probs=True,
        )


def test_a_row_named_like_an_attribute_is_refused() -> None:
    config = RenameConfig(addresses={"config": Address("self_attn", IOType.OUTPUT, order=31)})
    with pytest.raises(RenameError, match=r"'config'.*rename the row"):
        StandardizedTransformer("tiny:llama", rename_config=config)


def test_every_row_is_an_attribute_and_logits_stay_properties(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    for name in model.internals:
        if name not in ("logits", "embeddings_output"):
            assert getattr(model, name) is model.internals[name]
    inputs = c.sample_inputs(model)
    box: dict[str, Any] = {}
    with model.trace(inputs):
        box["emb"] = model.token_embeddings.save()
        box["logits"] = model.logits.save()
    with torch.no_grad():
        out = model._model(**c.forward_inputs(model, inputs))
        emb = model._model.model.embed_tokens(inputs["input_ids"])
    assert torch.allclose(box["logits"], out.logits)
    assert torch.allclose(box["emb"], emb)


def test_writing_embeddings_changes_the_logits(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    inputs = c.sample_inputs(model)
    box: dict[str, Any] = {}
    with model.trace(inputs):
        box["clean"] = model.logits.save()
    with model.trace(inputs):
        model.token_embeddings = model.token_embeddings * 0
        box["zeroed"] = model.logits.save()
    assert not torch.allclose(box["clean"], box["zeroed"])


def test_remote_loads_no_weights() -> None:
    model = StandardizedTransformer("tiny:llama", remote=True)
    assert not model.dispatched
    assert all(p.device.type == "meta" for p in model._model.parameters())
    assert model.internals.status()["layers_mid"] is None


Pair = namedtuple("Pair", ["hidden", "cache"])


@pytest.mark.parametrize(
    "value",
    [(1, 2, 3), Pair(1, 2), [1, 2, 3]],
)
def test_first_if_tuple_put_rebuilds_the_container(value: Any) -> None:
    select = FirstIfTuple()  # GPT-1's blocks return lists
    rebuilt = select.put(value, 9)
    assert (
        type(rebuilt) is type(value) and rebuilt[0] == 9 and tuple(rebuilt[1:]) == tuple(value[1:])
    )
    assert select.get(value) == value[0]


def test_index_put_on_mappings_lists_and_model_outputs() -> None:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    logits = torch.zeros(1, 2, 3)
    output = CausalLMOutputWithPast(logits=logits, loss=None)
    select = Index("logits")
    assert select.get(output) is logits
    new = torch.ones(1, 2, 3)
    rebuilt = select.put(output, new)
    assert isinstance(rebuilt, CausalLMOutputWithPast) and rebuilt.logits is new
    assert Index("a").put({"a": 1, "b": 2}, 5) == {"a": 5, "b": 2}
    assert Index(1).put([1, 2, 3], 5) == [1, 5, 3]
    with pytest.raises(KeyError, match="not a field"):
        Index("nope").put({"a": 1}, 5)


def test_mixed_dense_and_moe_layers_answer_per_layer(tiny_model: Load) -> None:
    model = tiny_model("tiny:deepseek_v3")
    internals = model.internals
    assert internals.status(layer=0)["mlps_activation"] is None
    assert internals.status(layer=0)["mlps_neurons"] is None
    for layer in range(1, internals.num_layers):
        reason = internals.status(layer=layer)["mlps_activation"]
        assert reason is not None and reason.startswith(
            "mlps_activation does not exist on a mixture-of-experts layer"
        )
        assert internals.status(layer=layer)["mlps_output"] is None
    whole = internals.status()["mlps_activation"]
    assert whole is not None and whole.startswith("available on layers [0] only; on layers [1, 2]")
    assert internals["mlps_activation"].address.module == "mlp.act_fn"  # resolved on layer 0


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "dbrx"])
def test_every_layer_of_a_mixture_refuses_the_mlp_interiors(family: str, tiny_model: Load) -> None:
    status = tiny_model(f"tiny:{family}").internals.status()
    for name in ("mlps_activation", "mlps_neurons"):
        reason = status[name]
        assert reason is not None and "top-k of N experts" in reason, (name, reason)
    assert status["mlps_input"] is None and status["mlps_output"] is None


def test_a_refused_attention_probabilities_row_is_not_handed_to_nnterp() -> None:
    # a family (XGLM) or a user that refuses the row on every layer: nnterp is not
    # asked to check the row's needles at load (here they name no call, so the check
    # would fail), and the place says the row's own reason
    import dataclasses

    from causalab_mini.address import Condition, Unavailable

    refused = dataclasses.replace(
        DEFAULT_ADDRESSES["attention_probabilities"],
        source=("no_such_call(",),
        unavailable=(Unavailable(Condition("always"), "{place} is refused by this test."),),
    )
    config = RenameConfig(addresses={"attention_probabilities": refused})
    model = StandardizedTransformer("tiny:llama", rename_config=config, enable_attention_probs=True)
    reason = model.internals.status(layer=0)["attention_probabilities"]
    assert reason is not None and "attention_probabilities is refused by this test." in reason


def test_a_family_names_the_config_key_of_its_head_count() -> None:
    # an encoder-decoder's config says num_attention_heads for the encoder's heads (and
    # only through attribute_map, which nnterp's lookup does not see); mbart.yaml names
    # decoder_attention_heads, so nnterp's load-time probability check runs on the
    # decoder's head count, here different from the encoder's
    model = StandardizedTransformer(
        "tiny:mbart?encoder_attention_heads=1", enable_attention_probs=True
    )
    assert model.text_config.decoder_attention_heads == 4
    assert model.num_heads == 4
    checks = c.attention_oracle(model, c.sample_inputs(model))
    assert len(checks) == model.internals.num_layers
    assert all(check.ok for check in checks), checks


def _writes_to_check(model: StandardizedTransformer) -> list[str]:
    """The places whose write or read has to take care (in_place, snapshot) on this
    model, or attentions_output where it has none (a parallel block)."""
    rows = [
        name
        for name, place in model.internals.items()
        if place.row.write == "in_place" or place.row.snapshot
    ]
    available = [n for n in rows if _write_layer(model, n) is not None]
    return available or ["attentions_output"]


def _write_layer(model: StandardizedTransformer, name: str) -> int | None:
    """Layer 1, or the first layer after it where ``name`` is available (a layer of
    another kind may refuse it: a cross-attention layer), else the first before."""
    n = model.internals.num_layers
    for layer in [*range(1, n), 0]:
        if model.internals[name].unavailable_on(layer) is None:
            return layer
    return None


@pytest.mark.parametrize("case", FAMILIES)
def test_a_write_never_changes_an_earlier_read(case: Case, tiny_model: Load) -> None:
    """Read everything up to a place, write there, read it again and a later place:
    the earlier reads equal a clean run, the second read is the written value, and
    the stream after the write changed; on every block structure, at every place
    whose write is in place or whose tensor the forward modifies later."""
    model = tiny_model(case.spec)
    inputs = c.sample_inputs(model)
    for name in _writes_to_check(model):
        layer = _write_layer(model, name)
        checks = c.write_keeps_earlier_reads(model, inputs, name, layer)
        assert len(checks) >= 3, f"{name}[{layer}] was not checked"
        failed = [check for check in checks if not check.ok]
        assert not failed, failed


def test_the_readme_trace_keeps_its_saved_read(tiny_model: Load) -> None:
    """The README's example, as written there: the saved mid-stream keeps its value,
    the write reaches layers_output."""
    model = tiny_model("tiny:llama")
    with model.trace("The quick brown fox"):
        clean_mid = model.layers_mid[1].save()
        clean_mlp = model.mlps_output[1].save()
        clean_out = model.layers_output[1].save()
    with model.trace("The quick brown fox"):
        mid = model.layers_mid[1].save()  # the residual stream between the sublayers
        model.layers_mid[1] = mid * 0  # a write reaches the stream the block carries on
        mlp = model.mlps_output[1].save()  # (not in the README: to check the sum)
        out = model.layers_output[1].save()
    assert float(clean_mid.abs().sum()) > 0
    assert torch.equal(mid, clean_mid)
    assert not torch.allclose(out, clean_out)
    assert torch.allclose(out, torch.zeros_like(mid) + mlp)  # the written zero, carried on
    assert not torch.allclose(mlp, clean_mlp)  # the MLP read the written stream too


@pytest.mark.parametrize("spelling", ["attribute", "internals"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            lambda mid: torch.zeros(mid.shape[-1]),
            r"shape \(\d+,\) to layers_mid\[0\], which has shape",
        ),
        (
            lambda mid: mid.double(),
            r"layers_mid\[0\] holds torch.float32; the value is torch.float64",
        ),
        (lambda mid: torch.zeros(3, 3), r"shape \(3, 3\) to layers_mid\[0\]"),
        (lambda mid: 0.0, r"cannot write a float to layers_mid\[0\]"),
    ],
)
def test_every_spelling_of_a_write_refuses_what_does_not_fit(
    spelling: str, value: Any, message: str, tiny_model: Load
) -> None:
    from causalab_mini.components import WriteRefused

    model = tiny_model("tiny:llama")
    with pytest.raises(WriteRefused, match=message):
        with model.trace("The quick brown fox"):
            mid = model.internals["layers_mid"][0]
            if spelling == "attribute":
                model.layers_mid[0] = value(mid)
            else:
                model.internals["layers_mid"][0] = value(mid)


@pytest.mark.parametrize(
    ("name", "layer", "message"),
    [
        ("logits", None, r"logits\(\) is read-only: the model's own output"),
        ("embeddings_input", None, r"embeddings_input\(\) is read-only: token ids"),
        ("mlps", 0, r"mlps\[0\] is read-only: it is a module, not a tensor"),
    ],
)
def test_read_only_places_refuse_writes_on_every_spelling(
    name: str, layer: int | None, message: str, tiny_model: Load
) -> None:
    from causalab_mini.components import WriteRefused

    model = tiny_model("tiny:llama")
    for spelling in ("attribute", "internals"):
        with pytest.raises(WriteRefused, match=message):
            with model.trace("The quick brown fox"):
                if spelling == "attribute" and name == "logits":
                    model.logits = torch.zeros(1)  # a property, as nnterp spells it
                else:
                    place = (
                        getattr(model, name) if spelling == "attribute" else model.internals[name]
                    )
                    place[layer] = torch.zeros(1)


def test_a_component_name_in_internals_names_its_place(tiny_model: Load) -> None:
    internals = tiny_model("tiny:llama").internals
    with pytest.raises(
        KeyError,
        match=r"'block_mid' is a component name, not a place: the place it reads is 'layers_mid'",
    ):
        internals["block_mid"]
    with pytest.raises(KeyError, match=r"locate\(model, 'attention_query', layer\)"):
        internals["attention_query"]
    with pytest.raises(KeyError, match=r"did you mean layers_mid"):
        internals["layers_mdi"]
