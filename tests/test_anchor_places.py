"""The places the anchors name beyond the first 21 components: a gated MLP's halves
(mlp_gate, mlp_up), a non-gated MLP's input projection (mlp_pre), the values
(attention_value) and each head's term of the output projection
(attention_head_output). Each holds its identity on real tensors; a write is read
before, written, read after; a family that has no such place refuses it with the
reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini.components import ComponentError, Plan, locate
from causalab_mini.errors import WriteRefused
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

from .registry_cases import skip_unless_installed

Load = Callable[..., StandardizedTransformer]

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def _reads(model: StandardizedTransformer, names: list[str], layer: int) -> dict[str, torch.Tensor]:
    addresses = {name: locate(model, name, layer) for name in names}
    out = Plan.of(reads=addresses.values()).run(model, c.sample_inputs(model))
    return {name: out[a] for name, a in addresses.items()}


def _act(model: StandardizedTransformer, layer: int) -> torch.nn.Module:
    from causalab_mini.internals import child

    row = model.internals["mlps_activation"].address_at(layer)
    module: torch.nn.Module = child(model.layers[layer], row.module)._module
    return module


def test_gated_halves_give_the_neurons(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    v = _reads(model, ["mlp_gate", "mlp_activation", "mlp_up", "mlp_neuron_output"], 1)
    act = _act(model, 1)
    assert torch.allclose(act(v["mlp_gate"]), v["mlp_activation"], atol=1e-6)
    assert torch.allclose(act(v["mlp_gate"]) * v["mlp_up"], v["mlp_neuron_output"], atol=1e-6)
    # the halves are the two linears of the MLP's input, not two reads of one tensor
    assert not torch.allclose(v["mlp_gate"], v["mlp_up"])


def test_a_write_to_the_up_half_reaches_the_neurons_and_keeps_the_gate(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    inputs = c.sample_inputs(model)
    gate, up, neurons = (locate(model, n, 1) for n in ("mlp_gate", "mlp_up", "mlp_neuron_output"))
    clean = Plan.of(reads=[gate, up, neurons]).run(model, inputs)
    written = clean[up] * -2.0 + 0.25
    out = Plan.of(reads=[gate, up, neurons], writes=[(up, written)]).run(model, inputs)
    assert torch.equal(out[gate], clean[gate])  # read before the write: its clean value
    assert torch.equal(out[up], written)  # read after: what was written
    expected = _act(model, 1)(clean[gate]) * written
    assert torch.allclose(out[neurons], expected, atol=1e-6)
    assert not torch.allclose(out[neurons], clean[neurons])


def test_a_non_gated_mlp_reads_its_input_projection(tiny_model: Load) -> None:
    model = tiny_model("tiny:gpt2")
    v = _reads(model, ["mlp_pre", "mlp_activation", "mlp_output"], 1)
    assert torch.allclose(_act(model, 1)(v["mlp_pre"]), v["mlp_activation"], atol=1e-6)
    inputs = c.sample_inputs(model)
    pre, act = locate(model, "mlp_pre", 1), locate(model, "mlp_activation", 1)
    zeros = torch.zeros_like(v["mlp_pre"])
    out = Plan.of(reads=[pre, act], writes=[(pre, zeros)]).run(model, inputs)
    assert torch.equal(out[pre], zeros)
    assert torch.allclose(out[act], _act(model, 1)(zeros))
    with pytest.raises(ComponentError, match="its MLP is not gated"):
        locate(model, "mlp_gate", 1)
    gated = tiny_model("tiny:llama")
    with pytest.raises(ComponentError, match="its MLP is gated, with two input"):
        locate(gated, "mlp_pre", 1)


def test_a_fused_gate_and_up_projection_refuses_both_halves(tiny_model: Load) -> None:
    model = tiny_model("tiny:phi3")
    for name in ("mlp_gate", "mlp_up", "mlp_pre"):
        with pytest.raises(ComponentError, match="computes the gate and up halves in"):
            locate(model, name, 0)


def test_the_values_the_probabilities_mix_give_z(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama", True)
    v = _reads(model, ["attention_value", "attention_probs", "attention_z"], 1)
    probs = v["attention_probs"]
    b, heads, seq = probs.shape[:3]
    value = locate(model, "attention_value", 1)
    assert value.heads is not None and value.head_dim is not None
    assert value.heads < heads  # tiny:llama groups its query heads: the values are per kv head
    values = v["attention_value"].reshape(b, seq, value.heads, value.head_dim).transpose(1, 2)
    mixed = (probs @ values.repeat_interleave(heads // value.heads, dim=1)).transpose(1, 2)
    assert torch.allclose(mixed.flatten(2), v["attention_z"], atol=1e-6)


def test_a_write_to_one_value_head_changes_only_its_query_group(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama", True)
    inputs = c.sample_inputs(model)
    head = locate(model, "attention_value", 1, head=0)
    whole, z, first = (
        locate(model, n, 1) for n in ("attention_value", "attention_z", "block_input")
    )
    clean = Plan.of(reads=[first, whole, z]).run(model, inputs)
    current = Plan.of(reads=[head]).run(model, inputs)[head]
    out = Plan.of(reads=[first, z], writes=[(head, current * 0.0)]).run(model, inputs)
    assert torch.equal(out[first], clean[first])
    assert z.heads is not None and head.heads is not None and z.head_dim is not None
    group = z.heads // head.heads
    per_head = out[z].reshape(*out[z].shape[:2], z.heads, z.head_dim)
    before = clean[z].reshape(*clean[z].shape[:2], z.heads, z.head_dim)
    # query heads 0..group-1 read kv head 0, whose values are now zero: their z is zero
    assert torch.equal(per_head[:, :, :group], torch.zeros_like(per_head[:, :, :group]))
    assert torch.allclose(per_head[:, :, group:], before[:, :, group:], atol=1e-6)


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_the_heads_terms_and_the_bias_give_attentions_output(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec)
    v = _reads(model, ["attention_premix", "attention_head_output", "attention_output"], 1)
    address = locate(model, "attention_head_output", 1)
    heads, hidden = address.heads, model.hidden_size
    assert heads is not None and address.head_dim == hidden
    terms = v["attention_head_output"].unflatten(-1, (heads, hidden))
    from causalab_mini.internals import child

    row = model.internals["attentions_premix"].address_at(1)
    proj = child(model.layers[1], row.module)._module
    bias = proj.bias if proj.bias is not None else torch.zeros(hidden)
    assert torch.allclose(terms.sum(2) + bias, v["attention_output"], atol=1e-5)
    # one head's term is its slice, and not the same as another's
    one = locate(model, "attention_head_output", 1, head=1)
    got = Plan.of(reads=[one]).run(model, c.sample_inputs(model))[one]
    assert torch.equal(got, terms[:, :, 1])
    assert not torch.allclose(terms[:, :, 0], terms[:, :, 1])


def test_a_heads_term_is_read_only_and_refused_after_a_post_norm(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    at = locate(model, "attention_head_output", 1)
    with pytest.raises(WriteRefused, match="attention_z"):
        Plan.of(writes=[(at, torch.zeros(1))]).run(model, c.sample_inputs(model))
    sandwich = tiny_model("tiny:gemma2")
    with pytest.raises(ComponentError, match="a norm is not linear"):
        locate(sandwich, "attention_head_output", 0)


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_heads_term_read_in_a_trace_refuses_an_edit_and_a_gradient(
    spec: str, tiny_model: Load
) -> None:
    """A read of the computed place in a hand-written trace: an in-place edit raises
    (it would change a copy the forward never sees), and every gradient spelling names
    where the gradient is, never torch's silent None; the model's output is untouched."""
    from causalab_mini.errors import GradientRefused

    model = tiny_model(spec)
    inputs = c.sample_inputs(model)
    place = model.internals["attentions_head_output"]
    with model.trace(inputs):
        clean = model.logits.save()
    for spelling in ("retain_grad", "requires_grad_", "grad"):
        with pytest.raises(GradientRefused, match="attentions_output"):
            with model.trace(inputs):
                x = place[1]
                if spelling == "grad":
                    x.grad  # noqa: B018
                else:
                    getattr(x, spelling)()
    with pytest.raises(WriteRefused, match="read-only"):
        with model.trace(inputs):
            y = place[1]
            y.mul_(0)
    with model.trace(inputs):
        kept = place[1].save()
        after = model.logits.save()
    assert torch.equal(after, clean) and kept.abs().sum() > 0


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def test_the_rotary_embedding_of_the_pre_rotary_query_is_the_query(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    names = [
        "attention_query_pre_rope",
        "attention_key_pre_rope",
        "attention_query",
        "attention_key",
    ]
    addresses = {name: locate(model, name, 1) for name in names}
    # one text, unpadded: positions 0..n-1 on its one row
    out = Plan.of(reads=addresses.values()).run(model, "The quick brown fox jumps")
    v = {name: out[a] for name, a in addresses.items()}
    q_pre, q = locate(model, names[0], 1), locate(model, "attention_query", 1)
    assert q_pre.rank < q.rank and q_pre.head_dim == q.head_dim
    # Llama's rotary by hand: cos/sin of the position times the inverse frequencies
    hd = q.head_dim
    assert hd is not None
    base = float(getattr(model._model.config, "rope_theta", None) or 10000.0)
    params = getattr(model._model.config, "rope_parameters", None) or {}
    base = float(params.get("rope_theta", base))
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    seq = v["attention_query"].shape[1]
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    for pre, post in (
        ("attention_query_pre_rope", "attention_query"),
        ("attention_key_pre_rope", "attention_key"),
    ):
        heads = v[pre].unflatten(-1, (-1, hd))  # (batch, seq, heads, head size)
        rotated = heads * cos[None, :, None] + _rotate_half(heads) * sin[None, :, None]
        assert torch.allclose(rotated.flatten(2), v[post], atol=1e-5)
        assert not torch.allclose(v[pre], v[post])  # the rotary moved it


def test_a_write_before_the_rotary_reaches_the_query_rotated(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    inputs = c.sample_inputs(model)
    pre, q, first = (
        locate(model, n, 1) for n in ("attention_query_pre_rope", "attention_query", "block_input")
    )
    clean = Plan.of(reads=[first, pre, q]).run(model, inputs)
    zeros = torch.zeros_like(clean[pre])
    out = Plan.of(reads=[first, pre, q], writes=[(pre, zeros)]).run(model, inputs)
    assert torch.equal(out[first], clean[first])  # read before: kept
    assert torch.equal(out[pre], zeros)  # read after: what was written
    assert clean[q].abs().sum() > 0  # the write changed what follows
    assert torch.equal(out[q], torch.zeros_like(out[q]))  # the rotary of zeros
    gpt2 = tiny_model("tiny:gpt2")  # absolute positions: no rotary call to read before
    with pytest.raises(ComponentError, match="apply_rotary_pos_emb"):
        locate(gpt2, "attention_query_pre_rope", 0)


def test_a_layer_that_skips_the_rotary_call_refuses_it_and_the_others_read(
    tiny_model: Load,
) -> None:
    """Cohere2 rotates on its sliding-window layers only (``if self.sliding_window is
    not None``): the layers without a window refuse the pre-rotary places with that
    condition, the others hold the rotary identity in one trace (it crashed nnsight
    when a full-attention layer's read waited on a call that never came)."""
    model = tiny_model("tiny:cohere2")
    n = model.internals.num_layers
    windows = [model._model.model.layers[i].self_attn.sliding_window for i in range(n)]
    rotated = [i for i in range(n) if windows[i] is not None]
    skipped = [i for i in range(n) if windows[i] is None]
    assert rotated and skipped
    for layer in skipped:
        for name in ("attention_query_pre_rope", "attention_key_pre_rope"):
            with pytest.raises(ComponentError, match=rf"layer {layer}'s attention skips"):
                locate(model, name, layer)
    with pytest.raises(ComponentError, match=r"if self\.sliding_window is not None"):
        locate(model, "attention_query_pre_rope", skipped[0])
    places = [
        locate(model, name, layer)
        for layer in rotated
        for name in ("attention_query_pre_rope", "attention_query")
    ]
    out = Plan.of(reads=places).run(model, c.sample_inputs(model))
    for pre, post in zip(places[::2], places[1::2], strict=True):
        assert not torch.allclose(out[pre], out[post])  # the rotary moved it


@pytest.mark.parametrize(
    ("spec", "name", "reason"),
    [
        # a q/k norm after the rotary: attention_query is norm(rotary(q)), not a rotary
        ("tiny:hunyuan_v1_dense", "attention_query_pre_rope", r"self\.query_layernorm"),
        ("tiny:hunyuan_v1_dense", "attention_key_pre_rope", r"self\.key_layernorm"),
        # the keys tiled over the experts after the rotary
        ("tiny:jetmoe", "attention_key_pre_rope", r"key_states\.repeat\("),
    ],
)
def test_a_rotary_whose_result_is_not_the_query_is_refused_with_the_statement(
    spec: str, name: str, reason: str, tiny_model: Load
) -> None:
    model = tiny_model(spec)
    with pytest.raises(ComponentError, match=reason):
        locate(model, name, 0)


def test_the_query_before_the_rotary_stays_where_only_the_keys_are_tiled(
    tiny_model: Load,
) -> None:
    """JetMoE repeats its keys after the rotary; the query is the rotary's argument and
    the write before it reaches attention_query."""
    model = tiny_model("tiny:jetmoe")
    pre, q = locate(model, "attention_query_pre_rope", 1), locate(model, "attention_query", 1)
    inputs = c.sample_inputs(model)
    clean = Plan.of(reads=[pre, q]).run(model, inputs)
    out = Plan.of(reads=[q], writes=[(pre, torch.zeros_like(clean[pre]))]).run(model, inputs)
    assert clean[q].abs().sum() > 0 and torch.equal(out[q], torch.zeros_like(out[q]))


def test_a_branch_on_what_the_layer_is_given_is_measured_on_a_forward(tiny_model: Load) -> None:
    """Ergo's attention rotates under ``if position_embeddings is not None``, which the
    model decides per layer (its full-attention layers are given none): a plain forward
    says which layers made the call; those read and hold the rotary identity's
    movement, the others refuse with what was measured."""
    skip_unless_installed("ergo")
    model = tiny_model("tiny:ergo")
    kinds = model._model.config.layer_types
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
    assert full and sliding
    for layer in full:
        with pytest.raises(ComponentError, match=r"made no call .*if position_embeddings"):
            locate(model, "attention_key_pre_rope", layer)
    places = [
        locate(model, name, layer)
        for layer in sliding
        for name in ("attention_key_pre_rope", "attention_key")
    ]
    out = Plan.of(reads=places).run(model, c.sample_inputs(model))
    for pre, post in zip(places[::2], places[1::2], strict=True):
        assert not torch.allclose(out[pre], out[post])  # the rotary moved it


def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    return q * cos, k * sin


def attention_interface(module: Any, q: Any, k: Any, v: Any) -> Any:
    return q + k + v


class _Rotating(torch.nn.Module):
    def __init__(self, use_rope: bool) -> None:
        super().__init__()
        self.use_rope = use_rope

    def forward(self, query_states: Any, key_states: Any, cos: Any, sin: Any) -> Any:
        if self.use_rope:
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        query_states = query_states  # as T5Gemma-2 writes it: no change
        key_states = key_states.repeat(1, 2)
        return attention_interface(self, query_states, key_states, key_states)


def test_the_forwards_source_says_which_layers_rotate_and_what_follows() -> None:
    """flow.flow_refusal on a forward of this file: the branch on the module's own
    attribute is decided per module, and an assignment between the rotary and the
    attention function refuses the place it changes, not the other."""
    from causalab_mini.flow import flow_refusal

    needle, later = "apply_rotary_pos_emb(query_states", "attention_interface("
    skipped = flow_refusal(_Rotating(False), needle, 0, later, 1, 3)
    assert skipped is not None and skipped.per_layer
    assert "layer 3's attention skips" in skipped.reason and "if self.use_rope" in skipped.reason
    assert flow_refusal(_Rotating(True), needle, 0, later, 1, 3) is None  # the query
    tiled = flow_refusal(_Rotating(True), needle, 1, later, 2, 3)  # the key
    assert tiled is not None and not tiled.per_layer
    assert "key_states = key_states.repeat(1, 2)" in tiled.reason
