"""Components: locate() compiles to pure data; the four interiors mean what they say
(softmax(scores) == probs, probs·V == z, z == premix, scores == q·kᵀ·scaling);
per-head slicing; writes are checked; plans run in forward order."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import Address, IOType, RenameConfig
from causalab_mini import components as comp
from causalab_mini import locator as locate_module
from causalab_mini.components import ComponentError, Plan, WriteRefused, locate
from causalab_mini.generated import COMPONENTS
from causalab_mini.model import StandardizedTransformer
from causalab_mini.ops import OperationNotFound
from causalab_mini.tools import certify as c
from causalab_mini.tree import child

from .conftest import gpt2_with_a_moved_op

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

SEMANTIC = ["llama", "gpt2", "gpt_neox", "gemma2", "qwen3", "mixtral"]


Load = Callable[..., StandardizedTransformer]
Eager = Callable[[str], StandardizedTransformer]


@pytest.fixture
def eager(tiny_model: Load) -> Eager:
    """``eager(model_type)``: tiny:<model_type> with attention probabilities enabled,
    the session's shared instance."""
    return lambda family: tiny_model(f"tiny:{family}", probs=True)


# the components one family has and another refuses by what its block is: a gated or
# a non-gated MLP, a rotary embedding or absolute positions
BY_BLOCK = {"attention_query_pre_rope", "attention_key_pre_rope", "mlp_gate", "mlp_up", "mlp_pre"}
# a mixture of experts' places, refused on a dense MLP (and expert_output everywhere)
MOE = {"router_logits", "router_weights", "router_indices", "expert_output", "shared_expert_output"}
# a head's term of the output projection is refused where a norm follows it
AFTER_A_NORM = "a norm is not linear"


def _all(model: StandardizedTransformer) -> list[comp.ComponentAddress]:
    out = []
    for name, spec in COMPONENTS.items():
        for layer in range(model.num_layers) if spec.per_layer else [None]:
            try:
                out.append(locate(model, name, layer))
            except ComponentError:
                assert name in BY_BLOCK | MOE, name
    return out


def test_one_address_serves_both_families(eager: Eager) -> None:
    llama, gpt2 = eager("llama"), eager("gpt2")
    assert llama.num_layers == gpt2.num_layers
    for name, spec in COMPONENTS.items():
        if name in BY_BLOCK | MOE:  # Llama's MLP is gated and rotary, GPT-2's neither
            continue
        for layer in range(llama.num_layers) if spec.per_layer else [None]:
            a, b = locate(llama, name, layer), locate(gpt2, name, layer)
            # the same component, layer and rank; the family (and the heads and width
            # where they differ) keep the keys of two models apart
            # (tests/test_address_identity.py)
            assert a != b, (name, layer)
            assert (a.component, a.layer, a.op, a.rank) == (b.component, b.layer, b.op, b.rank)
    # the spelling differs and is resolution detail
    assert locate(llama, "block_mid", 0).module == "post_attention_layernorm"
    assert locate(gpt2, "block_mid", 0).module == "ln_2"


def test_spec_ranks(eager: Eager) -> None:
    model = eager("llama")
    ranks = {
        name: locate(model, name, 0 if spec.per_layer else None).rank
        for name, spec in COMPONENTS.items()
        # Llama's MLP is gated (GPT-2's input projection below) and dense (Mixtral's
        # router in tests/test_router_places.py)
        if name != "mlp_pre" and name not in MOE
    }
    n = model.num_layers
    assert locate(eager("gpt2"), "mlp_pre", 0).rank == (0, 43)
    assert ranks == {
        "input_ids": (-1, -2),
        "embeddings": (-1, -1),
        "block_input": (0, 0),
        "attention_input_norm": (0, 5),
        "attention_query_pre_rope": (0, 10.3),
        "attention_key_pre_rope": (0, 10.6),
        "attention_query": (0, 11),
        "attention_key": (0, 12),
        "attention_value": (0, 13),
        "attention_scores": (0, 15),
        "attention_probs": (0, 20),
        "attention_z": (0, 22),
        "attention_premix": (0, 25),
        "attention_head_output": (0, 27),
        "attention_output": (0, 30),
        "block_mid": (0, 33),
        "mlp_input_norm": (0, 36),
        "mlp_input": (0, 40),
        "mlp_gate": (0, 41),
        "mlp_activation": (0, 44),
        "mlp_up": (0, 45),
        "mlp_neuron_output": (0, 47),
        "mlp_output": (0, 50),
        "block_output": (0, 60),
        "ln_final": (n, 1000),
        "lm_head": (n, 1001),
        "logits": (n, 1002),
    }


def test_addresses_are_pure_data(eager: Eager) -> None:
    model = eager("llama")
    addresses = _all(model)
    again = pickle.loads(pickle.dumps(addresses))
    assert again == addresses
    assert sorted(reversed(addresses)) == sorted(addresses)
    assert [a.rank for a in sorted(addresses)] == sorted(a.rank for a in addresses)
    text = str(locate(model, "attention_query", 1, head=2))
    assert text.startswith("attention_query[1].head[2] @ self_attn op=attention_interface_")
    assert "rank=(1, 11)" in text


def test_widths_and_heads_come_from_the_model(eager: Eager) -> None:
    model = eager("llama")  # 4 query heads, 2 key/value heads (grouped-query attention)
    config = model._model.config
    hd = config.head_dim
    assert locate(model, "attention_query", 0).width == config.num_attention_heads * hd
    assert locate(model, "attention_key", 0).width == config.num_key_value_heads * hd
    assert locate(model, "mlp_activation", 0).width == config.intermediate_size
    assert locate(model, "logits").width == config.vocab_size
    assert locate(model, "attention_query", 0, head=3).width == hd
    with pytest.raises(IndexError, match=r"2 key/value heads \(0\.\.1\)"):
        locate(model, "attention_key", 0, head=2)
    with pytest.raises(IndexError, match=r"4 query heads \(0\.\.3\)"):
        locate(model, "attention_z", 0, head=4)
    with pytest.raises(ComponentError, match="not per head"):
        locate(model, "block_output", 0, head=0)


def test_head_slices_are_handed_on_flat(eager: Eager) -> None:
    model = eager("llama")
    inputs = c.sample_inputs(model)
    reads = [
        locate(model, name, 1, head=h)
        for name in ("attention_query", "attention_z", "attention_premix")
        for h in (None, 1)
    ]
    reads.append(locate(model, "attention_key", 1, head=1))
    reads.append(locate(model, "attention_key", 1))
    out = Plan.of(reads=reads).run(model, inputs)
    hd = model._model.config.head_dim
    seq = inputs["input_ids"].shape[1]
    q, q1 = (
        out[locate(model, "attention_query", 1)],
        out[locate(model, "attention_query", 1, head=1)],
    )
    assert q.shape == (2, seq, 4 * hd)  # handed on flat: (batch, seq, heads x head_dim)
    assert torch.equal(q1, q[..., hd : 2 * hd]) and q1.shape == (2, seq, hd)
    z, z1 = out[locate(model, "attention_z", 1)], out[locate(model, "attention_z", 1, head=1)]
    assert torch.equal(z1, z[..., hd : 2 * hd])
    pm, pm1 = (
        out[locate(model, "attention_premix", 1)],
        out[locate(model, "attention_premix", 1, head=1)],
    )
    assert torch.equal(pm1, pm[..., hd : 2 * hd])
    assert torch.equal(pm, z)  # the heads' outputs, concatenated, are what o_proj reads
    k, k1 = out[locate(model, "attention_key", 1)], out[locate(model, "attention_key", 1, head=1)]
    assert torch.equal(k1, k[..., hd : 2 * hd]) and k.shape == (2, seq, 2 * hd)


def test_unknown_and_user_components() -> None:
    model = StandardizedTransformer(
        "tiny:llama",
        rename_config=RenameConfig(
            addresses={
                "attentions_gate": Address("self_attn.q_proj", IOType.OUTPUT, order=15),
            }
        ),
    )
    address = locate(model, "attentions_gate", 1)
    assert (address.module, address.io, address.rank) == ("self_attn.q_proj", "output", (1, 15))
    assert address.width is None and address.per_head == "none" and address.kind == "boundary"
    with pytest.raises(ComponentError, match="not per head"):
        locate(model, "attentions_gate", 1, head=0)
    with pytest.raises(ComponentError, match="Did you mean block_mid"):
        locate(model, "block_mdi", 0)


def test_per_layer_disagreement_names_the_component_table(eager: Eager) -> None:
    model = eager("llama")
    wrong = dataclasses.replace(COMPONENTS["block_mid"], per_layer=False)
    with pytest.raises(
        ComponentError, match=r"component table \(registry/components.yaml\) is what to fix"
    ):
        locate_module._boundary(model, wrong, None, None)


def test_refusals_at_compile_time(tiny_model: Load) -> None:
    neox = tiny_model("tiny:gpt_neox")
    with pytest.raises(ComponentError) as info:
        locate(neox, "block_mid", 0)
    assert str(info.value).startswith(
        "component 'block_mid': layers_mid does not exist on this model"
    )
    with pytest.raises(
        ComponentError, match=r"only under 'eager' attention, and this model runs 'sdpa'"
    ):
        locate(neox, "attention_scores", 0)
    with pytest.raises(ComponentError, match="per layer: say which layer"):
        locate(neox, "block_output")
    with pytest.raises(ComponentError, match="whole-model: give no layer"):
        locate(neox, "logits", 0)


def test_a_family_without_the_shared_attention_function_refuses_its_interiors(
    tiny_model: Load,
) -> None:
    # Falcon with ALiBi multiplied queries and keys with the @ operator before
    # transformers 5.25 (falcon_alibi.yaml): no call to name. From 5.25 it calls the
    # shared attention function, and its interiors are the default rows'
    from causalab_mini.generated import FAMILY_MATCH
    from causalab_mini.versions import outside_versions

    falcon = tiny_model("tiny:falcon?alibi=true")
    if outside_versions(FAMILY_MATCH["falcon_alibi"].versions) is not None:
        assert "falcon_alibi" not in falcon.families
        assert locate(falcon, "attention_query", 0).module == "self_attn"
        falcon = tiny_model("tiny:diffllama")
        with pytest.raises(ComponentError) as info:
            locate(falcon, "attention_query", 0)
        assert str(info.value).startswith(
            "component 'attention_query': attention_query is not offered on DiffLlama"
        )
        return
    with pytest.raises(ComponentError) as info:
        locate(falcon, "attention_query", 0)
    text = str(info.value)
    assert text.startswith(
        "component 'attention_query': attention_query is not offered on Falcon with ALiBi"
    )
    assert "the @ operator, which is no call" in text
    assert locate(falcon, "attention_premix", 0).module == "self_attn.dense"


def test_a_moved_op_names_row_module_version_class_and_lists_the_operations() -> None:
    import transformers

    model = gpt2_with_a_moved_op()
    with pytest.raises(OperationNotFound) as info:
        Plan.of(reads=[locate(model, "attention_probs", 0)]).run(model, c.sample_inputs(model))
    text = str(info.value)
    assert text.startswith(
        "attention_probabilities: the forward of layers.0.self_attn.attention_interface_"
    )
    assert "has no operation called as 'module.attn_dropout('" in text
    assert f"transformers {transformers.__version__} on GPT2LMHeadModel" in text
    assert "nn_functional_dropout_0 ->" in text and "nn_functional_softmax_0 ->" in text


def test_writes_are_checked_before_they_run(eager: Eager) -> None:
    model = eager("llama")
    inputs = c.sample_inputs(model)
    out = locate(model, "block_output", 0)
    with pytest.raises(
        WriteRefused,
        match=r"shape \(2, 64\) to block_output\[0\], which has shape \(2, \d+, 64\); nothing is broadcast",
    ):
        Plan.of(writes=[(out, torch.zeros(2, 64))]).run(model, inputs)
    with pytest.raises(WriteRefused, match="read-only: the model's output is read after"):
        Plan.of(writes=[(locate(model, "logits"), torch.zeros(1))]).run(model, inputs)
    q = locate(model, "attention_query", 0, head=1)
    with pytest.raises(WriteRefused, match="head 1 of attention_query"):
        Plan.of(writes=[(q, torch.zeros(2, 4, 16))]).run(model, inputs)
    seq = inputs["input_ids"].shape[1]
    with pytest.raises(WriteRefused, match=r"holds torch.float32; the value is torch.float64"):
        Plan.of(writes=[(out, torch.zeros(2, seq, 64, dtype=torch.float64))]).run(model, inputs)


def test_plans_run_in_forward_order_and_writes_land_before_reads(eager: Eager) -> None:
    model = eager("llama")
    inputs = c.sample_inputs(model)
    late, early = locate(model, "block_output", 2), locate(model, "block_output", 0)
    out = Plan.of(reads=[late, early]).run(model, inputs)  # asked in reverse: no error
    seq = inputs["input_ids"].shape[1]
    zero = torch.zeros(2, seq, 64)
    before = locate(model, "block_mid", 0)  # read before the write: keeps its value
    clean_before = Plan.of(reads=[before]).run(model, inputs)[before]
    plan = Plan.of(
        reads=[before, locate(model, "block_output", 0), late],
        writes=[(locate(model, "block_output", 0), zero)],
    )
    assert pickle.loads(pickle.dumps(plan)) == plan
    written = plan.run(model, inputs)
    assert torch.equal(written[locate(model, "block_output", 0)], zero)
    assert torch.equal(written[before], clean_before)
    assert not torch.allclose(written[late], out[late])


def _semantics(family: str, eager: Eager) -> dict[str, Any]:
    model = eager(family)
    inputs = c.sample_inputs(model)
    layer = 1
    names = [
        "attention_query",
        "attention_key",
        "attention_scores",
        "attention_probs",
        "attention_z",
        "attention_premix",
    ]
    reads = [locate(model, n, layer) for n in names]
    out = Plan.of(reads=reads).run(model, inputs)
    values = {n: out[a] for n, a in zip(names, reads, strict=True)}
    # value states and scaling: read at the same call, by the test only
    op_address = reads[0]
    box: dict[str, Any] = {}
    with model.trace(inputs):
        module = child(model.internals.layer_envoy(op_address.layer), op_address.module)
        op = getattr(module.source, str(op_address.op))
        args, kwargs = op.inputs
        box["v"] = args[3].save()
        box["mask"] = args[4].save() if len(args) > 4 and args[4] is not None else None
        box["scaling"] = kwargs.get("scaling")
    values.update(v=box["v"], mask=box["mask"], scaling=box["scaling"], model=model, inputs=inputs)
    return values


@pytest.mark.parametrize("family", SEMANTIC)
def test_interior_identities(family: str, eager: Eager) -> None:
    v = _semantics(family, eager)
    q, k, scores, probs, z, premix = (
        v[n]
        for n in (
            "attention_query",
            "attention_key",
            "attention_scores",
            "attention_probs",
            "attention_z",
            "attention_premix",
        )
    )
    model = v["model"]
    b, heads, seq = probs.shape[0], probs.shape[1], probs.shape[2]
    hd = q.shape[-1] // heads
    q = q.reshape(b, seq, heads, hd).transpose(1, 2)  # as the model holds them
    k = k.reshape(b, seq, -1, hd).transpose(1, 2)
    z = z.reshape(b, seq, heads, hd)
    groups = heads // k.shape[1]
    # softmax(scores) == probs (the scores are the softmax's argument: mask included)
    assert torch.allclose(torch.softmax(scores.float(), dim=-1).to(probs.dtype), probs, atol=1e-6)
    # probs · V, heads moved next to the sequence, == z
    values = v["v"].repeat_interleave(groups, dim=1)
    assert torch.allclose((probs @ values).transpose(1, 2), z, atol=1e-5)
    # z flattened == attentions_premix
    assert torch.allclose(z.reshape(*z.shape[:2], -1), premix, atol=1e-6)
    # scores == q·kᵀ·scaling on unmasked positions (q, k after RoPE: as the call gets them)
    keys = k.repeat_interleave(groups, dim=1)
    scaling = v["scaling"] if v["scaling"] is not None else q.shape[-1] ** -0.5
    raw = (q @ keys.transpose(-1, -2)) * scaling
    cap = getattr(model._model.config, "attn_logit_softcapping", None)
    if cap:  # Gemma-2 caps the scores before the mask: cap * tanh(x / cap)
        raw = cap * torch.tanh(raw / cap)
    visible = torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min / 2)
    assert visible.any()
    mask = v["mask"]
    expected = raw + mask if mask is not None else raw
    assert torch.allclose(scores[visible], expected[visible], atol=1e-5)


@pytest.mark.parametrize("family", SEMANTIC)
def test_writing_one_query_head_changes_only_that_heads_z(family: str, eager: Eager) -> None:
    model = eager(family)
    inputs = c.sample_inputs(model)
    layer, head = 1, 1
    z = locate(model, "attention_z", layer)
    clean = Plan.of(reads=[z]).run(model, inputs)[z]
    query = locate(model, "attention_query", layer, head=head)
    current = Plan.of(reads=[query]).run(model, inputs)[query]
    # a read before the write (the layer's input) keeps its clean value
    first = locate(model, "block_input", layer)
    kept = Plan.of(reads=[first]).run(model, inputs)[first]
    out = Plan.of(reads=[first, z], writes=[(query, current * -3.0)]).run(model, inputs)
    assert torch.equal(out[first], kept)
    changed = out[z]
    hd = query.head_dim
    assert hd is not None
    per_head = lambda t: t.reshape(*t.shape[:2], -1, hd)  # noqa: E731
    others = [h for h in range(per_head(clean).shape[2]) if h != head]
    assert torch.allclose(per_head(changed)[:, :, others], per_head(clean)[:, :, others], atol=1e-6)
    assert not torch.allclose(per_head(changed)[:, :, head], per_head(clean)[:, :, head])


def test_every_component_reads_on_the_semantic_families(eager: Eager) -> None:
    for family in SEMANTIC:
        model = eager(family)
        addresses = []
        for name, spec in COMPONENTS.items():
            try:
                addresses.append(locate(model, name, 1 if spec.per_layer else None))
            except ComponentError as exc:
                said = str(exc)
                by_block = name in BY_BLOCK and ("gated" in said or "rotary" in said)
                by_block = by_block or AFTER_A_NORM in said
                moe_refusals = ("its MLP is dense", "routed experts only", "one expert's output")
                by_block = by_block or (name in MOE and any(r in said for r in moe_refusals))
                assert by_block or "mixture-of-experts" in said or "block is 'parallel'" in said, (
                    family,
                    name,
                    exc,
                )
        out = Plan.of(reads=addresses).run(model, c.sample_inputs(model))
        for address, tensor in out.items():
            if address.width is not None:
                assert tensor.shape[-1] == address.width, (family, address)


def test_a_heterogeneous_config_gives_each_layer_its_own_heads(eager: Eager) -> None:
    # Gemma-4's config is heterogeneous: head_dim varies by layer, and transformers
    # refuses to answer config.head_dim for the whole model; layer i's config answers
    model = eager("gemma4_text")
    config = model.text_config
    assert config.is_heterogeneous
    n = model.num_layers
    dims = [config.per_layer_config[i].head_dim for i in range(n)]
    assert len(set(dims)) > 1  # the tiny checkpoint does vary
    reads = [locate(model, "attention_query", layer) for layer in range(n)]
    heads = [locate(model, "attention_query", layer, head=1) for layer in range(n)]
    keys = [locate(model, "attention_key", layer) for layer in range(n)]
    out = Plan.of(reads=[*reads, *heads, *keys]).run(model, c.sample_inputs(model))
    for layer in range(n):
        q, q1, k = out[reads[layer]], out[heads[layer]], out[keys[layer]]
        hd = dims[layer]
        assert reads[layer].head_dim == hd and q.shape[-1] == reads[layer].width
        assert reads[layer].width == config.num_attention_heads * hd
        assert k.shape[-1] == keys[layer].width == config.num_key_value_heads * hd
        assert q1.shape[-1] == heads[layer].width == hd
        assert torch.equal(q1, q[..., hd : 2 * hd])


def test_head_counts_are_read_off_each_layers_attention(eager: Eager) -> None:
    # MiMo-V2-Flash doubles the key/value heads of its sliding-window layers, which
    # its config does not say: the attention module does (num_key_value_groups)
    model = eager("mimo_v2_flash")
    n = model.num_layers
    kinds = model.text_config.layer_types
    assert {"sliding_attention", "full_attention"} <= set(kinds[:n])
    keys = [locate(model, "attention_key", layer) for layer in range(n)]
    out = Plan.of(reads=keys).run(model, c.sample_inputs(model))
    kv = model.text_config.num_key_value_heads
    for layer in range(n):
        doubled = kinds[layer] == "sliding_attention"
        assert keys[layer].heads == (2 * kv if doubled else kv)
        assert out[keys[layer]].shape[-1] == keys[layer].width


@pytest.mark.parametrize("spec", ["minicpm3", "deepseek_v3", "deepseek_v3?v_head_dim=24"])
def test_one_head_of_latent_attention_is_sliced_by_the_modules_head_sizes(
    spec: str, eager: Eager
) -> None:
    # Multi-head latent attention: the config's head_dim is qk_rope_head_dim (8), the
    # queries and keys are qk_nope + qk_rope (16) a head, the mixed values v_head_dim
    # (16; 24 with the override, to tell the two sizes apart)
    model = eager(spec)
    layer = 1
    module = model.layers[layer].self_attn._module
    assert model.text_config.head_dim == model.text_config.qk_rope_head_dim != module.qk_head_dim
    sizes = {
        "attention_query": module.qk_head_dim,
        "attention_key": module.qk_head_dim,
        "attention_z": module.v_head_dim,
    }
    whole = {name: locate(model, name, layer) for name in sizes}
    heads = {(name, h): locate(model, name, layer, head=h) for name in sizes for h in (0, 3)}
    inputs = c.sample_inputs(model)
    out = Plan.of(reads=[*whole.values(), *heads.values()]).run(model, inputs)
    held = Plan.of(reads=whole.values()).run(model, inputs, held=True)
    for name, hd in sizes.items():
        flat = out[whole[name]]
        assert whole[name].head_dim == hd
        assert flat.shape[-1] == module.num_heads * hd == whole[name].width
        for h in (0, 3):
            address = heads[(name, h)]
            assert address.head_dim == hd and address.width == hd
            one = out[address]
            # the module's own head axis (bhsd for q and k, bshd for z) ...
            native = held[whole[name]]
            expected = native[:, h] if whole[name].layout == "bhsd" else native[:, :, h]
            assert torch.equal(one, expected), (name, h)
            # ... and the flat tensor sliced by the module's head size
            assert torch.equal(one, flat[..., h * hd : (h + 1) * hd]), (name, h)


def test_a_head_whose_size_the_tensor_contradicts_is_refused_not_sliced(eager: Eager) -> None:
    model = eager("minicpm3")
    address = locate(model, "attention_query", 1, head=1)
    wrong = dataclasses.replace(address, head_dim=8, width=8)  # the config's head_dim
    with pytest.raises(ComponentError, match=r"holds heads of size 16 .*head size of 8"):
        Plan.of(reads=[wrong]).run(model, c.sample_inputs(model))


def test_a_value_head_size_left_open_refuses_one_head() -> None:
    # an attention module that states a q/k head size apart from its head_dim and no
    # value head size: which width each head of z has is open
    model = StandardizedTransformer("tiny:llama", enable_attention_probs=True)
    module = model.layers[1].self_attn._module
    module.qk_head_dim = 2 * module.head_dim
    with pytest.raises(ComponentError, match="the value head size of layer 1 is not stated"):
        locate(model, "attention_z", 1, head=0)
    whole = locate(model, "attention_z", 1)
    assert whole.head_dim is None and whole.width is None
    assert "the value head size of layer 1 is not stated" in str(whole.head_size_unknown)
    assert locate(model, "attention_query", 1).head_dim == 2 * module.head_dim
    assert locate(model, "attention_z", 0, head=0).head_dim == module.head_dim  # layer 0 as is


def test_key_heads_are_those_the_attention_function_receives(eager: Eager) -> None:
    # JetMoE tiles its key/value heads top_k times before the attention call and says
    # num_key_value_groups = 1: the keys read have num_heads heads, not
    # num_key_value_heads
    model = eager("jetmoe")
    module = model.layers[1].self_attn._module
    assert module.num_key_value_groups == 1 and module.num_key_value_heads < module.num_heads
    whole = locate(model, "attention_key", 1)
    last = locate(model, "attention_key", 1, head=module.num_heads - 1)
    assert whole.heads == module.num_heads
    inputs = c.sample_inputs(model)
    held = Plan.of(reads=[whole]).run(model, inputs, held=True)[whole]
    assert held.shape[1] == module.num_heads and whole.width == held.shape[1] * held.shape[3]
    one = Plan.of(reads=[last]).run(model, inputs)[last]
    assert torch.equal(one, held[:, module.num_heads - 1])
