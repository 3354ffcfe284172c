"""The sweep's checks of a mixture of experts' places: the router's weights are the
family's normalization of its logits at the chosen experts; the experts module, fed
the MLP's input with the chosen experts and their weights (plus the shared expert's
term), gives the MLP's output; a write of the weights reaches the MLP's output as the
experts module computes it and keeps what was read before it.

The normalization is stated from what the router and the config say, never found by
trying rules until one matches: the score is what the router's or the config's
scoring_func names (a softmax over every expert, or transformers' activation of that
name applied to each logit: sigmoid, DeepSeek-V4's sqrtsoftplus), else a sigmoid where
the router keeps an e_score_correction_bias (DeepSeek-V3's selection bias, which only
chooses), else a softmax over every expert; the
chosen scores are renormalized to sum to one where the router or the config says
norm_topk_prob, always where neither states it (Mixtral's softmax of the chosen
logits); and multiplied by routed_scaling_factor where the router or the config has
one. A family file states what differs (``routing`` on its routers_weights row:
Jamba's softmax is not renormalized); a family whose router computes its weights
otherwise (PhiMoE's sparsemixer) refuses router_weights with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.tools import certify as cert
from causalab_mini.tools.certify import close
from causalab_mini.tools.checks.base import CheckResult, Context


def _router(model: Any, layer: int) -> Any:
    """The torch module the routers_logits row reads at ``layer``."""
    from causalab_mini.internals import child

    row = model.internals["routers_logits"].address_at(layer)
    return child(model.internals.row_base(row, layer), row.module)._module


def _experts(model: Any, layer: int) -> Any | None:
    """The experts module beside the router (its parent's ``experts``), or None."""
    from causalab_mini.internals import child

    row = model.internals["routers_logits"].address_at(layer)
    parent = row.module.rpartition(".")[0]
    envoy = child(model.internals.row_base(row, layer), f"{parent}.experts")
    return None if envoy is None else envoy._module


def _stated(model: Any, layer: int, router: Any, key: str) -> Any:
    from causalab_mini.internals import layer_config

    if hasattr(router, key):
        return getattr(router, key)
    return getattr(layer_config(model.text_config, layer), key, None)


def routing_rule(model: Any, layer: int) -> tuple[str, bool, float]:
    """(score: "softmax" or an activation's name, renormalized over the chosen experts, the
    routed scaling factor), as the router and the config state them, each part the
    family's routers_weights row states (``routing``) replacing the default."""
    router = _router(model, layer)
    scoring = _stated(model, layer, router, "scoring_func")
    if not isinstance(scoring, str):
        scoring = "sigmoid" if hasattr(router, "e_score_correction_bias") else "softmax"
    norm = _stated(model, layer, router, "norm_topk_prob")
    scale = _stated(model, layer, router, "routed_scaling_factor")
    # what the family's routers_weights row states replaces the default, part by part
    stated = dict(model.internals["routers_weights"].address_at(layer).routing)
    return (
        str(stated.get("score", scoring)),
        bool(stated.get("renormalize", True if norm is None else bool(norm))),
        _scale(model, layer, router, stated.get("scale", scale)),
    )


def _scale(model: Any, layer: int, router: Any, scale: Any) -> float:
    """A routing scale as a number: a config or router attribute where it names one."""
    if isinstance(scale, str):
        scale = _stated(model, layer, router, scale)
    return 1.0 if not isinstance(scale, (int, float)) else float(scale)


def normalized(logits: Any, indices: Any, rule: tuple[str, bool, float]) -> Any | None:
    """The weights ``rule`` gives: the score of every expert, gathered at
    ``indices``, renormalized over them, scaled (None where the score names no
    function)."""
    import torch

    score, renorm, scale = rule
    logits = logits.float()
    if score == "softmax":
        scores = torch.softmax(logits, dim=-1)
    else:  # an elementwise score: transformers' activation of that name (sigmoid, ...)
        from transformers.activations import ACT2FN

        if score not in ACT2FN:
            return None
        scores = ACT2FN[score](logits)
    chosen = scores.gather(-1, indices.long())
    if renorm:
        chosen = chosen / (chosen.sum(-1, keepdim=True) + 1e-20)
    return chosen * scale


def _describe(rule: tuple[str, bool, float]) -> str:
    score, renorm, scale = rule
    text = f"{score} over the experts at the chosen ones"
    if renorm:
        text += ", renormalized"
    if scale != 1.0:
        text += f", x {scale:g}"
    return text


def _given(model: Any, inputs: Any, layers: list[int], written: Any = None) -> dict[Any, Any]:
    """One trace, in forward order: each layer's router's arguments and the experts
    module's arguments and output, saved; with ``written`` (layer, value), that value
    written at routers_weights first."""
    from causalab_mini.internals import boundary, child
    from causalab_mini.tools.checks.recompute import kept, unkept

    internals = model.internals
    saved: dict[Any, Any] = {}
    with model.trace(inputs):
        for layer in layers:
            row = internals["routers_logits"].address_at(layer)
            base = internals.row_base(row, layer)
            router = child(base, row.module)
            experts = child(base, f"{row.module.rpartition('.')[0]}.experts")
            saved[("router", layer)] = kept(router.inputs)
            if written is not None and written[0] == layer:
                internals["routers_weights"].set(layer, written[1])
            saved[("experts", layer)] = kept(experts.inputs)
            out = getattr(experts, boundary("output", experts))
            saved[("experts_out", layer)] = kept(out)
    return {k: unkept(v) for k, v in saved.items()}


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) else value


def _rerun(module: Any, call: tuple[Any, Any], whole: bool = False, **replace: Any) -> Any:
    """``module`` called again on a saved call's (args, kwargs), positional arguments
    replaced by index (``replace={"2": weights}``): its output's first element, or
    (``whole``) all of it."""
    import torch

    args, kwargs = call
    args = list(args)
    for index, value in replace.items():
        args[int(index)] = value
    with torch.no_grad():
        out = module(*args, **kwargs)
    return out if whole else _first(out)


def _selected(model: Any, layer: int, out: Any) -> Any:
    """The router's output as the routers_logits row selects it (Switch's logits are
    its third element)."""
    from causalab_mini.address import Index

    select = model.internals["routers_logits"].address_at(layer).select
    if isinstance(select, Index) and isinstance(out, (tuple, list)):
        return out[select.key]
    return _first(out)


def _key(name: str, layer: int) -> tuple[str, int]:
    return name, layer


def _moe_layers(ctx: Context) -> list[int]:
    return [
        i
        for i in range(ctx.n)
        if _key("router_logits", i) in ctx.v or _key("router_weights", i) in ctx.v
    ]


def router_checks(ctx: Context) -> Iterator[CheckResult]:
    """On every mixture-of-experts layer read: router_logits == the router called
    again on its own arguments, num_experts wide; router_indices and router_weights ==
    the chosen experts and weights the experts module was given (viewed (batch, seq,
    top_k)); router_weights == the family's normalization of router_logits at
    router_indices; the experts module's output plus shared_expert_output (times
    sigmoid of shared_expert_gate where the block has one) == the MLP module's own
    output, where the layer has a shared expert."""
    v, model = ctx.v, ctx.model
    layers = _moe_layers(ctx)
    if not layers:
        return
    given = _given(model, ctx.inputs, layers)
    for layer in layers:
        logits, weights, indices = (
            v.get(_key(n, layer)) for n in ("router_logits", "router_weights", "router_indices")
        )
        if logits is not None:
            yield _logits_result(model, layer, logits, given[("router", layer)])
        yield from _given_results(ctx, layer, given[("experts", layer)][0])
        if logits is not None and indices is not None:
            yield _indices_result(model, layer, logits, indices)
        if logits is not None and weights is not None and indices is not None:
            yield _weights_result(model, layer, logits, weights, indices)
        shared = v.get(_key("shared_expert_output", layer))
        whole = ctx.raw.get(("mlps", layer))
        if shared is not None and whole is not None:
            yield _shared_result(ctx, layer, shared, whole, given[("experts_out", layer)])


def _logits_result(model: Any, layer: int, logits: Any, call: Any) -> CheckResult:
    """router_logits == the router called again on its own arguments, num_experts wide."""
    from causalab_mini.geometry import width_of

    own = _selected(model, layer, _rerun(_router(model, layer), call, whole=True))
    if own.numel() == logits.numel():
        ok, d = close(logits, own.reshape(logits.shape))
    else:
        ok, d = False, f"the router returns {tuple(own.shape)}, read {tuple(logits.shape)}"
    width = width_of(model, "num_experts", layer)
    if ok and width != int(logits.shape[-1]):
        ok, d = False, f"{int(logits.shape[-1])} wide, and num_experts is {width}"
    return CheckResult.of(
        ["router_logits"],
        "router_logits == the router called on its own arguments, num_experts wide",
        ok,
        f"layer {layer}: {d}",
    )


def _given_results(ctx: Context, layer: int, args: Any) -> Iterator[CheckResult]:
    """router_indices and router_weights == the experts module's arguments 1 and 2,
    experts_per_token wide."""
    import torch

    from causalab_mini.geometry import width_of

    model = ctx.model
    for name, at in (("router_indices", 1), ("router_weights", 2)):
        value = ctx.v.get(_key(name, layer))
        if value is None:
            continue
        fed = args[at] if len(args) > at else None
        if fed is None or not hasattr(fed, "shape") or fed.numel() != value.numel():
            ok, d = False, f"the experts module's argument {at} is not {tuple(value.shape)}"
        else:
            ok = torch.equal(value, fed.reshape(value.shape))
            error = (value.float() - fed.reshape(value.shape).float()).abs().max()
            d = "" if ok else f"max error {error:.3g}"
        width = width_of(model, "experts_per_token", layer)
        if width is None and value.shape[-1] == 1:
            width = 1  # a router that states no top-k and hands on one expert (Switch)
        if ok and width != int(value.shape[-1]):
            ok, d = False, f"{int(value.shape[-1])} wide, and experts_per_token is {width}"
        yield CheckResult.of(
            [name],
            f"{name} == the experts module's argument {at} (what it mixes with), "
            "experts_per_token wide",
            ok,
            f"layer {layer}: {d}",
        )


def _indices_result(model: Any, layer: int, logits: Any, indices: Any) -> CheckResult:
    """router_indices are integers naming experts of router_logits' width."""
    from causalab_mini.geometry import width_of

    experts = width_of(model, "num_experts", layer)
    ok = not indices.dtype.is_floating_point and bool(
        ((indices >= 0) & (indices < int(logits.shape[-1]))).all()
    )
    return CheckResult.of(
        ["router_indices"],
        "router_indices are integers naming experts of router_logits' width",
        ok,
        f"layer {layer}: {indices.dtype}, logits {tuple(logits.shape)}, num_experts {experts}",
    )


def _weights_result(model: Any, layer: int, logits: Any, weights: Any, indices: Any) -> CheckResult:
    """router_weights == the family's normalization of router_logits at the indices."""
    rule = routing_rule(model, layer)
    want = normalized(logits, indices, rule)
    if want is None:
        ok, d = False, f"no score function {rule[0]!r}"
    else:
        ok, d = close(weights.float(), want)
    return CheckResult.of(
        ["router_weights"],
        "router_weights == the family's normalization of router_logits at router_indices",
        ok,
        f"layer {layer}, {_describe(rule)}: {d}",
    )


def _shared_result(ctx: Context, layer: int, shared: Any, whole: Any, routed: Any) -> CheckResult:
    """The experts module's output + the shared expert's term == the MLP's output."""
    model = ctx.model
    term = _gated(model, layer, shared, ctx.v.get(_key("mlp_input", layer)))
    if term is None:
        ok, d = False, "the block gates its shared expert and mlp_input was not read"
    else:
        ok, d = close(_combined(model, layer, routed, term.reshape(whole.shape)), whole)
    return CheckResult.of(
        ["shared_expert_output"],
        "the experts module's output + (sigmoid(shared_expert_gate) x) "
        "shared_expert_output (combined as the block states) == the MLP module's output",
        ok,
        f"layer {layer}: {d}",
    )


def _gated(model: Any, layer: int, shared: Any, x: Any) -> Any:
    """The shared expert's term of the MLP's output: its output, times sigmoid of the
    block's shared_expert_gate of the MLP's input ``x`` where the block has one (None
    where it has one and ``x`` was not read)."""
    import torch

    from causalab_mini.internals import child

    row = model.internals["routers_logits"].address_at(layer)
    base = model.internals.row_base(row, layer)
    gate = child(base, f"{row.module.rpartition('.')[0]}.shared_expert_gate")
    if gate is None:
        return shared
    if x is None:
        return None
    with torch.no_grad():
        return torch.sigmoid(gate._module(x)) * shared


def _combined(model: Any, layer: int, routed: Any, shared: Any) -> Any:
    """The MLP's output from the routed sum and the shared expert's term, as the block
    states it: their sum (the routed sum first summed over experts where the experts
    return a row per expert and token, and times the family's routing sum_scale where
    it states one); their mean where the config's
    shared_expert_combination_strategy says "average" (Cohere2-MoE); then the block's
    post_mlp_layernorm where it has one (AXK1 normalizes inside the MLP)."""
    import torch

    from causalab_mini.internals import child, layer_config

    config = layer_config(model.text_config, layer)
    if routed.numel() != shared.numel() and routed.numel() % shared.numel() == 0:
        # a row per expert and token (Llama 4 runs every expert on every token, its
        # input scaled by its score): the block sums them over the experts
        routed = routed.reshape(-1, *shared.shape).sum(0)
    routed = routed.reshape(shared.shape)
    # (the row as the family states it: refused weights (Llama 4) still state no scale)
    factor = dict(model.internals["routers_weights"].row.routing).get("sum_scale")
    if isinstance(factor, str):
        row = model.internals["routers_logits"].address_at(layer)
        block = child(model.internals.row_base(row, layer), row.module.rpartition(".")[0])
        factor = getattr(block._module if block is not None else None, factor, None)
        factor = getattr(config, str(factor), None) if factor is None else factor
    if isinstance(factor, (int, float)):
        routed = routed * factor
    total = routed + shared
    if getattr(config, "shared_expert_combination_strategy", None) == "average":
        total = total / 2
    row = model.internals["routers_logits"].address_at(layer)
    base = model.internals.row_base(row, layer)
    norm = child(base, f"{row.module.rpartition('.')[0]}.post_mlp_layernorm")
    if norm is not None:
        with torch.no_grad():
            total = norm._module(total)
    return total


def router_writes(ctx: Context) -> Iterator[CheckResult]:
    """On the first mixture-of-experts layer from the probe layer on: a write of
    router_weights keeps every place read before it, reads back and reaches the stream
    (certify.write_keeps_earlier_reads); the experts module is given the written
    weights and returns what it computes from them, not its clean output; the same
    write certification for shared_expert_output."""
    model = ctx.model
    layer = next(
        (
            i
            for i in (min(1, ctx.n - 1), *range(ctx.n))
            if model.internals["routers_weights"].unavailable_on(i) is None
        ),
        None,
    )
    if layer is None:
        return
    for component, row in (
        ("router_weights", "routers_weights"),
        ("shared_expert_output", "mlps_shared_expert"),
    ):
        if model.internals[row].unavailable_on(layer) is not None:
            continue
        checks = cert.write_keeps_earlier_reads(model, ctx.inputs, row, layer)
        failed = [c for c in checks if not c.ok]
        yield CheckResult.of(
            [component],
            "a write keeps every earlier read, reads back, and reaches the stream",
            bool(checks) and not failed,
            f"{failed[0].description}: max error {failed[0].max_error:.3g}" if failed else "",
        )
    clean = _given(model, ctx.inputs, [layer])
    weights = clean[("experts", layer)][0][2]
    # a weight per chosen expert away from its own: the first chosen expert dropped,
    # the others tripled, so the sum moves even where both slots name one expert (a
    # hash router's zero table: DeepSeek-V4) (written as the place reads it)
    read = ctx.v.get(_key("router_weights", layer))
    if read is None:
        return
    written = read * 3.0
    written[..., 0] = 0.0
    after = _given(model, ctx.inputs, [layer], written=(layer, written))
    fed = after[("experts", layer)][0][2]
    ok = torch_equal(fed.reshape(written.shape).to(written.dtype), written)
    expected = _rerun(
        _experts(model, layer),
        clean[("experts", layer)],
        **{"2": written.reshape(weights.shape).to(weights.dtype)},
    )
    got = after[("experts_out", layer)]
    same, d = close(got, expected.reshape(got.shape))
    moved = not close(got, clean[("experts_out", layer)])[0]
    yield CheckResult.of(
        ["router_weights"],
        "a write of router_weights is what the experts module is given, and its output is "
        "what it computes from them, away from its clean output",
        ok and same and moved,
        f"layer {layer}: given {'==' if ok else '!='} written, {d}"
        + ("" if moved else "; the experts' output did not change"),
    )


def torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


__all__ = ["normalized", "router_checks", "router_writes", "routing_rule"]
