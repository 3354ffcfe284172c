"""The sweep's checks of a mixture of experts' places: the router's weights are the
family's normalization of its logits at the chosen experts; the experts module, fed
the MLP's input with the chosen experts and their weights (plus the shared expert's
term), gives the MLP's output; a write of the weights reaches the MLP's output as the
experts module computes it and keeps what was read before it.

The normalization is stated from what the router and the config say, never found by
trying rules until one matches: the score is a sigmoid where the config's
scoring_func says so or the router keeps an e_score_correction_bias (DeepSeek-V3's
selection bias, which only chooses), a softmax over every expert otherwise; the
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
from causalab_mini.tools.checks.base import Context, Outcome


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
    """(score: "softmax" | "sigmoid", renormalized over the chosen experts, the
    routed scaling factor), as the router and the config state them, each part the
    family's routers_weights row states (``routing``) replacing the default."""
    router = _router(model, layer)
    scoring = _stated(model, layer, router, "scoring_func")
    sigmoid = scoring == "sigmoid" or hasattr(router, "e_score_correction_bias")
    norm = _stated(model, layer, router, "norm_topk_prob")
    scale = _stated(model, layer, router, "routed_scaling_factor")
    # what the family's routers_weights row states replaces the default, part by part
    stated = dict(model.internals["routers_weights"].address_at(layer).routing)
    return (
        str(stated.get("score", "sigmoid" if sigmoid else "softmax")),
        bool(stated.get("renormalize", True if norm is None else bool(norm))),
        float(stated.get("scale", 1.0 if not isinstance(scale, (int, float)) else scale)),
    )


def normalized(logits: Any, indices: Any, rule: tuple[str, bool, float]) -> Any:
    """The weights ``rule`` gives: the score of every expert, gathered at
    ``indices``, renormalized over them, scaled."""
    import torch

    score, renorm, scale = rule
    logits = logits.float()
    scores = logits.sigmoid() if score == "sigmoid" else torch.softmax(logits, dim=-1)
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


def mixture(model: Any, layer: int, x: Any, indices: Any, weights: Any, shared: Any) -> Any:
    """The MLP's output as the experts module computes it from the MLP's input ``x``
    (batch, seq, hidden), the chosen experts and their weights (batch, seq, top_k),
    plus the shared expert's output (None where there is none) times sigmoid of the
    MLP's shared_expert_gate where it has one; times the mlps_output row's scale."""
    import torch

    experts = _experts(model, layer)
    assert experts is not None
    flat = x.reshape(-1, x.shape[-1])
    with torch.no_grad():
        out = experts(flat, indices.reshape(-1, indices.shape[-1]), weights.reshape(-1, weights.shape[-1]))
        out = (out[0] if isinstance(out, tuple) else out).reshape(x.shape)
        if shared is not None:
            router_row = model.internals["routers_logits"].address_at(layer)
            from causalab_mini.internals import child

            parent = router_row.module.rpartition(".")[0]
            gate = child(model.internals.row_base(router_row, layer), f"{parent}.shared_expert_gate")
            if gate is not None:
                shared = torch.sigmoid(gate._module(x)) * shared
            out = out + shared
    # the MLP's output as its row means it: times the row's scale where the block
    # scales the module's output (Granite's residual_multiplier)
    row = model.internals["mlps_output"].address_at(layer)
    if row.scale is not None:
        out = out * model.internals.scale(row.scale)
    return out


def _key(name: str, layer: int) -> tuple[str, int]:
    return name, layer


def router_checks(ctx: Context) -> Iterator[Outcome]:
    """On every mixture-of-experts layer read: router_logits == the router fed
    mlp_input (flattened, as the block feeds it); router_weights == the family's
    normalization of router_logits at router_indices; router_indices integers in
    range; the experts module fed mlp_input, router_indices and router_weights (+ the
    shared expert's term) == mlp_output."""
    import torch

    from causalab_mini.geometry import width_of

    v = ctx.v
    for layer in range(ctx.n):
        logits, weights, indices = (
            v.get(_key(n, layer)) for n in ("router_logits", "router_weights", "router_indices")
        )
        x = v.get(_key("mlp_input", layer))
        if logits is not None and x is not None:
            with torch.no_grad():
                own = _router(ctx.model, layer)(x.reshape(-1, x.shape[-1]))
            own = own[0] if isinstance(own, tuple) else own
            ok, d = close(logits, own.reshape(*x.shape[:-1], -1))
            width = width_of(ctx.model, "num_experts", layer)
            if ok and width != int(logits.shape[-1]):
                ok, d = False, f"{int(logits.shape[-1])} wide, and num_experts is {width}"
            yield Outcome.of(
                ["router_logits"],
                "router_logits == the router's logits of mlp_input, num_experts wide",
                ok,
                f"layer {layer}: {d}",
            )
        if logits is not None and indices is not None:
            experts = width_of(ctx.model, "num_experts", layer)
            ok = not indices.dtype.is_floating_point and bool(
                ((indices >= 0) & (indices < int(logits.shape[-1]))).all()
            )
            ok = ok and experts == int(logits.shape[-1])
            yield Outcome.of(
                ["router_logits", "router_indices"],
                "router_indices are integers naming experts of router_logits' width (num_experts)",
                ok,
                f"layer {layer}: {indices.dtype}, logits {tuple(logits.shape)}, "
                f"num_experts {experts}",
            )
        if logits is not None and weights is not None and indices is not None:
            rule = routing_rule(ctx.model, layer)
            ok, d = close(weights.float(), normalized(logits, indices, rule))
            yield Outcome.of(
                ["router_weights"],
                "router_weights == the family's normalization of router_logits at router_indices",
                ok,
                f"layer {layer}, {_describe(rule)}: {d}",
            )
        out = v.get(_key("mlp_output", layer))
        if weights is None or indices is None or x is None or out is None:
            continue
        shared_place = ctx.model.internals["mlps_shared_expert"].unavailable_on(layer) is None
        shared = v.get(_key("shared_expert_output", layer))
        if _experts(ctx.model, layer) is None or (shared_place and shared is None):
            yield Outcome.of(
                ["router_weights", "router_indices"],
                "experts(mlp_input, router_indices, router_weights) (+ shared) == mlp_output",
                False,
                f"layer {layer}: no experts module beside the router, or the shared "
                "expert was not read",
            )
            continue
        with torch.no_grad():
            mixed = mixture(ctx.model, layer, x, indices, weights.to(x.dtype), shared)
        ok, d = close(mixed, out)
        components = ["router_weights", "router_indices"]
        if shared is not None:
            components.append("shared_expert_output")
        yield Outcome.of(
            components,
            "experts(mlp_input, router_indices, router_weights) (+ shared) == mlp_output",
            ok,
            f"layer {layer}: {d}",
        )


def router_writes(ctx: Context) -> Iterator[Outcome]:
    """On the probe layer: a write of router_weights keeps every place read before it,
    reads back, and mlp_output becomes what the experts module makes of the written
    weights (+ the shared expert's term), not its clean value; a write of the shared
    expert's output reaches mlp_output the same way."""
    from causalab_mini.components import Plan, locate

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
        yield Outcome.of(
            [component],
            "a write keeps every earlier read, reads back, and reaches the stream",
            bool(checks) and not failed,
            f"{failed[0].name}: max error {failed[0].max_error:.3g}" if failed else "",
        )
    names = ["mlp_input", "router_indices", "router_weights", "mlp_output"]
    shared = model.internals["mlps_shared_expert"].unavailable_on(layer) is None
    if shared:
        names.append("shared_expert_output")
    at = {n: locate(model, n, layer) for n in names}
    clean = Plan.of(reads=at.values()).run(model, ctx.inputs)
    weights = clean[at["router_weights"]]
    # a weight per chosen expert away from its own: the first chosen expert dropped,
    # the others doubled
    written = weights * 2.0
    written[..., 0] = 0.0
    out = Plan.of(reads=at.values(), writes=[(at["router_weights"], written)]).run(
        model, ctx.inputs
    )
    x = clean[at["mlp_input"]]
    expected = mixture(
        model,
        layer,
        x,
        clean[at["router_indices"]],
        written.to(x.dtype),
        clean[at["shared_expert_output"]] if shared else None,
    )
    ok, d = close(out[at["mlp_output"]], expected)
    moved = not close(out[at["mlp_output"]], clean[at["mlp_output"]])[0]
    yield Outcome.of(
        ["router_weights"],
        "a write of router_weights gives mlp_output == experts(mlp_input, router_indices, "
        "written weights) (+ shared), away from its clean value",
        ok and moved,
        f"layer {layer}: {d}" + ("" if moved else "; mlp_output did not change"),
    )


__all__ = ["mixture", "normalized", "router_checks", "router_writes", "routing_rule"]
