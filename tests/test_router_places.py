"""A mixture of experts' places: the router's logits, the weights the chosen experts'
outputs are mixed with and the chosen experts (held flat by the block, read as
(batch, seq, ...)), the shared expert's output, and expert_output, refused with the
reason. Each holds its identity on real tensors: the weights are the family's
normalization of the logits at the chosen experts, and the experts module fed the
MLP's input, the chosen experts and the weights (plus the shared expert's gated term)
gives the MLP's output; a write of the weights reaches the MLP's output as the experts
compute it and leaves what was read before it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from causalab_mini.components import ComponentError, Plan, locate
from causalab_mini.errors import WriteRefused
from causalab_mini.internals import child
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

Load = Callable[..., StandardizedTransformer]

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

ROUTER = ["mlp_input", "router_logits", "router_weights", "router_indices", "mlp_output"]


def _reads(model: StandardizedTransformer, names: list[str], layer: int) -> dict[str, torch.Tensor]:
    addresses = {name: locate(model, name, layer) for name in names}
    out = Plan.of(reads=addresses.values()).run(model, c.sample_inputs(model))
    return {name: out[a] for name, a in addresses.items()}


def _mlp(model: StandardizedTransformer, layer: int, name: str) -> torch.nn.Module:
    module: torch.nn.Module = child(model.layers[layer], f"mlp.{name}")._module
    return module


def _experts(
    model: StandardizedTransformer, layer: int, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """The experts module's weighted sum, fed as the block feeds it (flat tokens)."""
    flat = x.reshape(-1, x.shape[-1])
    with torch.no_grad():
        out = _mlp(model, layer, "experts")(
            flat, idx.reshape(-1, idx.shape[-1]), w.reshape(-1, w.shape[-1]).to(x.dtype)
        )
    return out.reshape(x.shape)


def test_mixtral_weights_are_the_softmax_of_the_chosen_logits(tiny_model: Load) -> None:
    model = tiny_model("tiny:mixtral")
    v = _reads(model, ROUTER, 1)
    batch, seq = v["mlp_input"].shape[:2]
    config = model._model.config
    assert v["router_logits"].shape == (batch, seq, config.num_local_experts)
    assert v["router_weights"].shape == (batch, seq, config.num_experts_per_tok)
    assert v["router_indices"].shape == (batch, seq, config.num_experts_per_tok)
    assert not v["router_indices"].dtype.is_floating_point
    probs = torch.softmax(v["router_logits"].float(), dim=-1)
    chosen = probs.gather(-1, v["router_indices"])
    # Mixtral renormalizes the chosen experts' probabilities (a softmax of their logits)
    assert torch.allclose(
        v["router_weights"].float(), chosen / chosen.sum(-1, keepdim=True), atol=1e-6
    )
    assert torch.equal(v["router_indices"], probs.topk(config.num_experts_per_tok, -1).indices)
    mixed = _experts(model, 1, v["mlp_input"], v["router_indices"], v["router_weights"])
    assert torch.allclose(mixed, v["mlp_output"], atol=1e-5)


def test_a_write_of_the_weights_reaches_the_mlp_output_and_keeps_the_logits(
    tiny_model: Load,
) -> None:
    model = tiny_model("tiny:mixtral")
    inputs = c.sample_inputs(model)
    at = {n: locate(model, n, 1) for n in ROUTER}
    clean = Plan.of(reads=at.values()).run(model, inputs)
    written = clean[at["router_weights"]].clone()
    written[..., 0] = 0.0  # drop the first chosen expert
    out = Plan.of(reads=at.values(), writes=[(at["router_weights"], written)]).run(model, inputs)
    assert torch.equal(out[at["router_logits"]], clean[at["router_logits"]])  # read before
    assert torch.equal(out[at["router_weights"]], written)  # read after: what was written
    expected = _experts(model, 1, clean[at["mlp_input"]], clean[at["router_indices"]], written)
    assert torch.allclose(out[at["mlp_output"]], expected, atol=1e-5)
    assert not torch.allclose(out[at["mlp_output"]], clean[at["mlp_output"]], atol=1e-4)


def test_the_logits_and_the_chosen_experts_are_read_only(tiny_model: Load) -> None:
    model = tiny_model("tiny:mixtral")
    inputs = c.sample_inputs(model)
    for name, why in (("router_logits", "router_weights"), ("router_indices", "integer")):
        at = locate(model, name, 1)
        with pytest.raises(WriteRefused, match=why):
            Plan.of(writes=[(at, torch.zeros(1))]).run(model, inputs)


def test_qwen2_moe_adds_its_gated_shared_expert(tiny_model: Load) -> None:
    model = tiny_model("tiny:qwen2_moe")
    v = _reads(model, [*ROUTER, "shared_expert_output"], 1)
    probs = torch.softmax(v["router_logits"].float(), dim=-1).gather(-1, v["router_indices"])
    if model._model.config.norm_topk_prob:
        probs = probs / probs.sum(-1, keepdim=True)
    assert torch.allclose(v["router_weights"].float(), probs, atol=1e-6)
    x = v["mlp_input"]
    routed = _experts(model, 1, x, v["router_indices"], v["router_weights"])
    with torch.no_grad():
        gate = torch.sigmoid(_mlp(model, 1, "shared_expert_gate")(x))
    # the place is the shared expert's own output, before its sigmoid gate
    assert torch.allclose(routed + gate * v["shared_expert_output"], v["mlp_output"], atol=1e-5)
    assert not torch.allclose(routed + v["shared_expert_output"], v["mlp_output"], atol=1e-4)


def test_olmoe_weights_follow_norm_topk_prob(tiny_model: Load) -> None:
    model = tiny_model("tiny:olmoe")
    v = _reads(model, ROUTER, 0)
    probs = torch.softmax(v["router_logits"].float(), dim=-1).gather(-1, v["router_indices"])
    if model._model.config.norm_topk_prob:
        probs = probs / probs.sum(-1, keepdim=True)
    assert torch.allclose(v["router_weights"].float(), probs, atol=1e-6)
    mixed = _experts(model, 0, v["mlp_input"], v["router_indices"], v["router_weights"])
    assert torch.allclose(mixed, v["mlp_output"], atol=1e-5)


def test_the_sweeps_rule_is_the_familys(tiny_model: Load) -> None:
    """The check's stated normalization: Jamba's softmax is not renormalized (its family
    file says so), DeepSeek-V3's is a sigmoid scaled by routed_scaling_factor."""
    from causalab_mini.tools.checks.experts import normalized, routing_rule

    jamba = tiny_model("tiny:jamba")
    layer = next(
        i
        for i in range(len(jamba.layers))
        if jamba.internals["routers_weights"].unavailable_on(i) is None
    )
    assert routing_rule(jamba, layer) == ("softmax", False, 1.0)
    v = _reads(jamba, ROUTER, layer)
    got = normalized(v["router_logits"], v["router_indices"], routing_rule(jamba, layer))
    assert torch.allclose(v["router_weights"].float(), got, atol=1e-6)
    deepseek = tiny_model("tiny:deepseek_v3")
    layer = next(
        i
        for i in range(len(deepseek.layers))
        if deepseek.internals["routers_weights"].unavailable_on(i) is None
    )
    score, _, scale = routing_rule(deepseek, layer)
    assert score == "sigmoid" and scale == deepseek._model.config.routed_scaling_factor


def test_expert_output_and_dense_layers_refuse_with_the_reason(tiny_model: Load) -> None:
    model = tiny_model("tiny:mixtral")
    with pytest.raises(ComponentError, match="no module returns one expert's output"):
        locate(model, "expert_output", 1)
    with pytest.raises(ComponentError, match="routed experts only"):
        locate(model, "shared_expert_output", 1)
    dense = tiny_model("tiny:llama")
    for name in ("router_logits", "router_weights", "router_indices", "shared_expert_output"):
        with pytest.raises(ComponentError, match="its MLP is dense"):
            locate(dense, name, 1)
    phimoe = tiny_model("tiny:phimoe")
    with pytest.raises(ComponentError, match="sparsemixer"):
        locate(phimoe, "router_weights", 0)


def test_the_router_ranks_between_the_mlp_input_and_its_output(tiny_model: Load) -> None:
    """The router's places rank after mlp_input (40) and before mlp_output (50); the
    shared expert after them where the block calls it after its router (DeepSeek-V3)
    and before them where it calls it first (Qwen2-MoE)."""
    model = tiny_model("tiny:mixtral")
    ranks = {n: locate(model, n, 1).rank for n in ROUTER}
    assert ranks == {
        "mlp_input": (1, 40),
        "router_logits": (1, 41.2),
        "router_weights": (1, 41.4),
        "router_indices": (1, 41.6),
        "mlp_output": (1, 50),
    }
    assert locate(tiny_model("tiny:qwen2_moe"), "shared_expert_output", 1).rank == (1, 40.5)
    deepseek = tiny_model("tiny:deepseek_v3")
    assert locate(deepseek, "shared_expert_output", 1).rank == (1, 41.9)


def test_switch_routes_one_expert_module_per_expert(tiny_model: Load) -> None:
    """Switch Transformers holds a module per expert (experts.expert_<i>), each called
    on the tokens routed to it alone: the logits and the chosen expert's probability
    are read (unflattened, (batch, seq, ...)); the dispatch mask is not indices, and no
    expert's output is a place."""
    model = tiny_model("tiny:switch_transformers")
    layer = next(
        i
        for i in range(model.num_layers)
        if model.internals["routers_logits"].unavailable_on(i) is None
    )
    experts = _mlp(model, layer, "experts")
    assert isinstance(experts, torch.nn.ModuleDict) and "expert_0" in experts
    v = _reads(model, ["router_logits", "router_weights"], layer)
    probs = torch.softmax(v["router_logits"].float(), dim=-1)
    # one expert a token: its weight is its probability, not renormalized
    assert v["router_weights"].shape[-1] == 1
    assert torch.allclose(
        v["router_weights"].float(), probs.max(-1, keepdim=True).values, atol=1e-6
    )
    with pytest.raises(ComponentError, match="one-hot"):
        locate(model, "router_indices", layer)
    with pytest.raises(ComponentError, match="a module per"):
        locate(model, "expert_output", layer)


@pytest.mark.parametrize(
    ("spec", "tampered"),
    [
        ("tiny:mixtral", "router_weights"),
        ("tiny:mixtral", "router_logits"),
        ("tiny:qwen2_moe", "shared_expert_output"),
    ],
)
def test_the_sweeps_router_checks_hold_and_notice_a_tampered_tensor(
    spec: str, tampered: str
) -> None:
    import dataclasses

    from causalab_mini.tools.checks import experts

    from .test_checks import _context

    ctx = _context(StandardizedTransformer(spec, enable_attention_probs=True))
    clean = list(experts.router_checks(ctx))
    assert clean and all(o.ok for o in clean), [o for o in clean if not o.ok]
    assert any(tampered in o.components for o in clean)
    values = dict(ctx.v)
    values[(tampered, 1)] = values[(tampered, 1)] * 1.1 + 0.5
    broken = list(experts.router_checks(dataclasses.replace(ctx, v=values)))
    assert any(not o.ok and tampered in o.components for o in broken)


def test_the_sweeps_write_check_notices_a_dropped_write(monkeypatch: pytest.MonkeyPatch) -> None:
    from causalab_mini.tools.checks import experts
    from causalab_mini.tools.checks.base import Context

    model = StandardizedTransformer("tiny:mixtral")
    inputs = c.sample_inputs(model)
    at = locate(model, "router_weights", 1)
    v = {("router_weights", 1): Plan.of(reads=[at]).run(model, inputs)[at]}
    ctx = Context(model, inputs, {}, v)
    clean = list(experts.router_writes(ctx))
    assert clean and all(o.ok for o in clean), clean
    place = model.internals["routers_weights"]
    monkeypatch.setattr(place, "set", lambda layer, value: None)  # the write dropped
    assert any(not o.ok for o in experts.router_writes(ctx))


def test_a_changed_copy_of_the_logits_reaches_nothing(tiny_model: Load) -> None:
    """Why router_logits is read-only, measured: Mixtral's router returns its logits
    beside the weights and experts it computed from them, and the block uses only the
    latter, so the router's output with its logits replaced leaves the MLP's output as
    it was (while the same change to its weights moves it)."""
    model = tiny_model("tiny:mixtral")
    inputs = c.sample_inputs(model)
    gate = child(model.layers[1], "mlp.gate")
    mlp = child(model.layers[1], "mlp")
    with model.trace(inputs):
        clean = mlp.output.save()
    outputs = {}
    for slot in (0, 1):
        with model.trace(inputs):
            parts = list(gate.output)
            parts[slot] = parts[slot] * 0.0
            gate.output = tuple(parts)
            outputs[slot] = mlp.output.save()
    assert torch.equal(outputs[0], clean)
    assert not torch.allclose(outputs[1], clean)
