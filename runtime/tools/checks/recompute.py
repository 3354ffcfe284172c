"""The checks that recompute a place from what the modules themselves were given and
returned in one trace (``raw_outputs``): a module's input fed to it gives its output,
the attention's interiors from its operands (softmax, z from the probabilities and V,
q·kᵀ), the MLP's neurons from its activation and gate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.generated import GATE_CALLS
from causalab_mini.internals import boundary
from causalab_mini.tools import certify as cert
from causalab_mini.tools.certify import close
from causalab_mini.tools.checks.base import CheckResult


def final_hidden_state(model: Any, inputs: dict[str, Any]) -> Any | None:
    """``last_hidden_state`` of the causal LM's base model (None where it has none)."""
    import torch

    base = getattr(model._model, "base_model", None)
    if base is None or base is model._model:
        return None
    with torch.no_grad():
        out = base(**inputs)
    return getattr(out, "last_hidden_state", None)


def _module(model: Any, layer: int, path: str) -> Any:
    """The Envoy at ``path`` in layer ``layer`` (the internals' own tree walk)."""
    from causalab_mini.internals import child

    return child(model.layers[layer], path)


def _row_module(model: Any, layer: int, row: str) -> Any:
    """The Envoy of the module the internals row ``row`` reads at ``layer`` (relative to
    layers[layer], or to its entry of the row's layer_list)."""
    from causalab_mini.internals import child

    address = model.internals[row].address_at(layer)
    return child(model.internals.row_base(address, layer), address.module)


def raw_outputs_of(
    model: Any, inputs: dict[str, Any], addresses: dict[tuple[str, int | None], Any]
) -> dict[tuple[str, int], Any]:
    """The attention and MLP modules' own outputs, the scaling, values and mask the
    attention call is given, and a gated attention's output gate (the output of the
    one gate call of GATE_CALLS in its forward, where it multiplies attention_z before
    the output projection; its kind under ("gate_kind", layer)), per layer, and the
    unembedding's input, from one more trace (in forward order)."""

    internals = model.internals
    wanted, gate_kinds = _wanted_modules(model, addresses)
    saved: list[tuple[str, int, Any]] = []  # bound before the trace
    with model.trace(inputs):
        for kind, layer, what in wanted:
            _save_one(kind, layer, what, saved)
    out = {(kind, layer): getattr(t, "value", t) for kind, layer, t in saved}
    for (kind, layer), value in list(out.items()):
        # a module's own output holds the positions its row leaves out (CPM-Ant's
        # prompt, ProphetNet's predicting streams): compared with the row's reads, it
        # leaves them out too
        if kind in ("attentions", "mlps"):
            address = internals[kind].address_at(layer)
            if address.views_tokens:
                out[(kind, layer)] = address.token_positions(value, internals.count)
    for layer, kind in gate_kinds.items():
        out[("gate_kind", layer)] = kind
    for key, (args, kwargs) in [(k, t) for k, t in out.items() if k[0] == "mlp_rest"]:
        out[key] = ([unkept(a) for a in args], {k: unkept(a) for k, a in kwargs.items()})
    return out


def _wanted_modules(
    model: Any, addresses: dict[tuple[str, int | None], Any]
) -> tuple[list[tuple[str, int, Any]], dict[int, str]]:
    """What ``raw_outputs_of`` reads, in forward order, as (kind, layer, what): each
    layer's attention operands, output gate, attention and MLP modules, then the
    unembedding's inputs; and the gate's kind by layer."""
    internals = model.internals
    wanted: list[tuple[str, int, Any]] = []
    gate_kinds: dict[int, str] = {}
    for layer in range(internals.num_layers):
        query = addresses.get(("attention_query", layer))
        if query is not None:
            wanted.append(("operands", layer, _operand_reads(model, layer, query)))
            _module(model, layer, query.module).source  # noqa: B018 - before the trace
        if ("attention_z", layer) in addresses and ("attention_premix", layer) in addresses:
            gates = _gate_calls(model, layer, addresses[("attention_z", layer)])
            if len(gates) == 1:  # one gate call in the forward, of one kind
                gate_kinds[layer] = gates[0][0]
                wanted.append(("gate", layer, gates[0][1]))
        for row in ("attentions", "mlps"):
            if internals[row].unavailable_on(layer) is None:
                wanted.append((row, layer, _row_module(model, layer, row)))
    if ("lm_head", None) in addresses:
        # the module the lm_head row reads (nnterp's lm_head, or the family's own
        # unembedding where nnterp's container is a head before it)
        head_envoy = _whole_model_module(model, addresses[("lm_head", None)].module)
        wanted.append(("lm_head_input", -1, head_envoy))
        inner = _inner_unembedding(model, head_envoy)
        if inner is not None:
            wanted.append(("unembedding_input", -1, inner))
    return wanted, gate_kinds


def _save_one(kind: str, layer: int, what: Any, saved: list[tuple[str, int, Any]]) -> None:
    """Inside the trace: save what one entry of ``_wanted_modules`` reads."""
    if kind in ("lm_head_input", "unembedding_input"):
        args, kwargs = what.inputs
        given = args[0] if args else next(iter(kwargs.values()))
        saved.append((kind, layer, given.save()))
        return
    if kind == "operands":
        _save_operands(layer, what, saved)
    elif kind == "gate":
        saved.append((kind, layer, what.output.save()))
    elif kind == "mlps":
        envoy = what
        args, kwargs = envoy.inputs
        # the arguments besides the first (Zaya's router state, MPT's residual)
        rest = ([kept(a) for a in args[1:]], {k: kept(a) for k, a in kwargs.items()})
        saved.append(("mlp_rest", layer, rest))
        out = getattr(envoy, boundary("output", envoy))
        saved.append(
            (
                kind,
                layer,
                (out[0] if isinstance(out, (tuple, list)) else out).clone().save(),
            )
        )
    else:
        module = what
        out = getattr(module, boundary("output", module))
        # a copy: a layer may change a module's output in place afterwards (Falcon)
        saved.append(
            (
                kind,
                layer,
                (out[0] if isinstance(out, (tuple, list)) else out).clone().save(),
            )
        )


def _save_operands(layer: int, what: Any, saved: list[tuple[str, int, Any]]) -> None:
    """Inside the trace: save the attention call's operands (its arguments or a
    module's returns; a number the row gives as it is)."""
    for envoy, side, taken in what:
        if side == "value":  # a number the row gives
            saved.extend((name, layer, number) for name, number in taken)
            continue
        if side == "inputs":
            args, kwargs = envoy.inputs
        else:
            got = envoy.output
        for name, operand in taken:
            if side == "inputs":
                found = _argument(args, kwargs, operand.arg, operand.kwarg)
            else:
                index = operand.returns or 0
                found = got[index] if isinstance(got, (tuple, list)) else got
            if found is not None:
                saved.append((name, layer, found.save() if hasattr(found, "save") else found))


def _argument(args: Any, kwargs: Any, arg: int | None, kwarg: str | None) -> Any:
    """The positional argument ``arg`` where the call has it, else keyword ``kwarg``."""
    if arg is not None and len(args) > arg:
        return args[arg]
    return kwargs.get(kwarg) if kwarg is not None else None


def _operand_reads(model: Any, layer: int, query: Any) -> list[tuple[Any, str, list[Any]]]:
    """How to read the attention's operands at ``layer`` (``operands_of``) in one
    trace, in forward order: the attention module's inputs, then each call's inputs
    or output in the order of the forward's source, each once. A number the row gives
    is handed on as it is, and so is a module attribute (a buffer, read before the
    trace); a call the forward does not make is left out (the check that needs the
    operand then says what it lacks)."""
    from causalab_mini.compat import parsed_source
    from causalab_mini.locator import operands_of
    from causalab_mini.ops import OperationNotFound, find_op, op_path

    envoy = _module(model, layer, query.module)
    source = envoy.source
    _, line_of = parsed_source(getattr(source, "accessor", source))
    where = {"row": "operands", "module": f"layers.{layer}.{query.module}"}
    where["model_class"] = model.internals.model_class
    numbers: list[tuple[str, Any]] = []
    module_inputs: list[tuple[str, Any]] = []
    calls: dict[tuple[str, str], tuple[int, Any, list[tuple[str, Any]]]] = {}
    for name, operand in operands_of(model).items():
        if name in MLP_OPERANDS:  # the MLP's, read where its checks run
            continue
        if operand.value is not None:
            numbers.append((name, operand.value))
        elif operand.attribute is not None:  # a buffer: the module's, not the forward's
            held = getattr(envoy._module, operand.attribute, None)
            if held is not None:  # a tensor copied, a number (MPT's softmax_scale) as is
                numbers.append((name, held.detach().clone() if hasattr(held, "detach") else held))
        elif operand.input is not None:
            module_inputs.append((name, type(operand)(arg=operand.arg, kwarg=operand.input)))
        elif operand.needle is not None:
            try:
                op = find_op(source, operand.needle, **where)
            except OperationNotFound:
                continue
            side = "output" if operand.returns is not None else "inputs"
            line = line_of.get(op_path(op).split(".")[-1], 0)
            entry = calls.setdefault((operand.needle, side), (line, op, []))
            entry[2].append((name, operand))
    reads: list[tuple[Any, str, list[Any]]] = []
    if numbers:
        reads.append((None, "value", numbers))
    if module_inputs:
        reads.append((envoy, "inputs", module_inputs))
    for (_, side), (_, op, taken) in sorted(
        calls.items(), key=lambda kv: (kv[1][0], kv[0][1] == "output")
    ):
        reads.append((op, side, taken))
    return reads


# operands of the MLP, not of the attention (interiors.yaml operands): read off the
# MLP module by the MLP's checks
MLP_OPERANDS = frozenset({"down_scale"})


def _down_scale(model: Any, layer: int) -> Any:
    """The factor layer ``layer``'s MLP multiplies its down projection's output by (the
    family's ``down_scale`` operand: an attribute of the MLP module, or a number), 1
    where none is stated or the layer's MLP does not hold it."""
    from causalab_mini.locator import operands_of

    operand = operands_of(model).get("down_scale")
    if operand is None:
        return 1.0
    if operand.value is not None:
        return operand.value
    if operand.attribute is None or model.internals["mlps"].unavailable_on(layer) is not None:
        return 1.0
    held = getattr(_row_module(model, layer, "mlps")._module, operand.attribute, None)
    return 1.0 if held is None else held


def _whole_model_module(model: Any, path: str) -> Any:
    """The Envoy at a whole-model row's ``path`` (standardized names; "" is the
    model), nnterp's lm_head where the path does not resolve."""
    from causalab_mini.internals import child

    found = child(model, path) if path else None
    return model.lm_head if found is None else found


def _inner_unembedding(model: Any, lm_head_envoy: Any) -> Any | None:
    """The Envoy of ``get_output_embeddings()`` where it sits strictly inside the
    module the lm_head row reads (a head that transforms its input before the
    unembedding, as on the RoBERTa kin: dense, gelu, layer_norm, decoder), else None."""
    from causalab_mini.internals import child

    head = model._model.get_output_embeddings()
    lm_head = getattr(lm_head_envoy, "_module", None)
    if head is None or lm_head is None or head is lm_head:
        return None
    path = next((name for name, m in lm_head.named_modules() if m is head and name), None)
    return None if path is None else child(lm_head_envoy, path)


def _gate_calls(model: Any, layer: int, z_address: Any) -> list[tuple[str, Any]]:
    """The calls of GATE_CALLS in the forward of attention at ``layer`` that could be
    its output gate, with their kinds: each needle naming exactly one operation, made
    after the call that returns attention_z (a gate multiplies it; Doge's softplus
    before the call shapes the mask, not the output)."""
    from causalab_mini.compat import parsed_source
    from causalab_mini.ops import OperationNotFound, find_op, op_path

    internals = model.internals
    path = z_address.module  # the forward that holds the attention (a family's own)
    if path == internals["attentions"].address_at(layer).module:
        source = _row_module(model, layer, "attentions").source  # its base: a layer_list
    else:
        source = _module(model, layer, path).source
    _, line_of = parsed_source(getattr(source, "accessor", source))
    where = {"row": "attention_z", "module": f"layers.{layer}.{path}"}
    where["model_class"] = internals.model_class

    def line(op: Any) -> int:
        at: int = line_of[op_path(op).split(".")[-1]]  # parsed_source: name -> line index
        return at

    try:  # the call that returns attention_z
        call = line(find_op(source, z_address.needles[0], **where))
    except (OperationNotFound, KeyError, IndexError):
        return []
    gates = []
    for kind, needle in GATE_CALLS:
        try:
            op = find_op(source, needle, **where)
        except OperationNotFound:  # no such call (or several: not one gate)
            continue
        if line(op) > call:
            gates.append((kind, op))
    return gates


def kept(value: Any) -> Any:
    """A module argument kept past the trace: a tensor copied and saved, a list or tuple
    of them copied element-wise (RWKV's state, which the model updates in place after
    the call), else itself."""
    if isinstance(value, (list, tuple)):
        return _rebuilt(value, [kept(item) for item in value])
    return value.clone().save() if hasattr(value, "clone") and hasattr(value, "save") else value


def unkept(value: Any) -> Any:
    """The value a kept argument holds after the trace."""
    if isinstance(value, (list, tuple)):
        return _rebuilt(value, [unkept(item) for item in value])
    return getattr(value, "value", value)


def _rebuilt(value: list[Any] | tuple[Any, ...], items: list[Any]) -> Any:
    """A list or tuple of the same type holding ``items`` (a named tuple by position)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*items)
    return type(value)(items)


def consistency_checks(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
) -> Iterator[CheckResult]:
    """A place that is a module's input, fed to that module, gives the module's output
    (the tensor read is what the module consumed); and the output projection of
    attention_premix is attention's output or its contribution. Where no contribution
    row is read on the layer (both refused: MiniCPM3's contributions are scaled by a
    factor no row states), no identity names layers_mid, so layers_mid is checked as
    the input of the norm whose output is mlps_norm_output."""
    import torch

    def key(n: str) -> tuple[str, int]:
        return n, layer

    with torch.no_grad():
        both = key("block_mid") in v and key("mlp_input_norm") in v
        # a structure whose MLP module normalizes its own input (a reversible block): no
        # identity names the norm's output, which certifies mlps_norm_output here
        if both and not any("mlps_norm_output" in i for i in cert.structure_identities(model)):
            found = _norm_of_mid(model, v, layer)
            if found is not None:
                yield CheckResult.of(
                    ["mlp_input_norm"], "the MLP's norm(layers_mid) == mlps_norm_output", *found
                )
        # no contribution row read on the layer: no identity names layers_mid, which
        # this certifies instead
        if both and key("attention_output") not in v and key("mlp_output") not in v:
            found = _norm_of_mid(model, v, layer)
            if found is not None:
                yield CheckResult.of(
                    ["block_mid"], "the MLP's norm(layers_mid) == mlps_norm_output", *found
                )
        if key("attention_premix") in v:
            proj = _row_module(model, layer, "attentions_premix")
            projected = proj._module(v[key("attention_premix")])
            targets = [
                t
                for t in (v.get(key("attention_output")), raw.get(("attentions", layer)))
                if t is not None
            ]
            ok = any(close(projected, t)[0] for t in targets)
            covered = ["attention_premix"]
            if key("attention_output") in v and close(projected, v[key("attention_output")])[0]:
                covered.append("attention_output")
            yield CheckResult.of(
                covered, "output projection(attention_premix) == attention's output", ok
            )
        yield from _mlp_refed(model, v, raw, layer)


def _norm_of_mid(
    model: Any, v: dict[tuple[str, int | None], Any], layer: int
) -> tuple[bool, str] | None:
    """norm(layers_mid) == mlps_norm_output, where both are read at the norm's input
    and output with nothing between (None where they are not)."""
    internals = model.internals
    mid = internals["layers_mid"].address_at(layer)
    norm = internals["mlps_norm_output"].address_at(layer)
    plain = not (mid.source or norm.source or mid.scale or norm.scale)
    sides = (mid.io.value, norm.io.value)
    if not (plain and mid.module == norm.module and sides == ("input", "output")):
        return None
    normed = _row_module(model, layer, "layers_mid")._module(v[("block_mid", layer)])
    if isinstance(normed, tuple):
        normed = normed[0]
    found: tuple[bool, str] = close(normed, v[("mlp_input_norm", layer)])
    return found


def _mlp_refed(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
) -> Iterator[CheckResult]:
    """mlp_input, fed to the MLP module (with the other arguments it was given), gives
    the module's output."""
    key = ("mlp_input", layer)
    if key in v and ("mlps", layer) in raw:
        mlp = _row_module(model, layer, "mlps")._module
        args, kwargs = raw.get(("mlp_rest", layer), ([], {}))
        try:
            # with the other arguments it was given (Zaya's router state from the
            # layer before, MPT's and BLOOM's residual)
            out = mlp(v[key], *args, **kwargs)
        except TypeError:
            out = None
        if isinstance(out, tuple):
            out = out[0]
        if out is not None:
            name = "mlp(mlp_input) == the MLP's output"
            if args or kwargs:
                name = "mlp(mlp_input, its other arguments) == the MLP's output"
            ok, d = close(out, raw[("mlps", layer)])
            yield CheckResult.of(["mlp_input"], name, ok, d)


def interior_checks(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
) -> Iterator[CheckResult]:
    import torch

    def key(n: str) -> tuple[str, int]:
        return n, layer

    if key("attention_scores") in v and key("attention_probs") in v:
        s, p = v[key("attention_scores")], v[key("attention_probs")]
        ok, d = close(torch.softmax(s.float(), -1).to(p.dtype), p, atol=1e-5)
        yield CheckResult.of(
            ["attention_scores"], "softmax(attention_scores) == attention_probs", ok, d
        )
    if key("attention_z") in v and key("attention_probs") in v and ("value", layer) in raw:
        probs, values = v[key("attention_probs")], raw[("value", layer)]
        if values.dim() == 3:  # held (batch*heads, keys, head size): XGLM's bmm operand
            values = values.view(probs.shape[0], -1, *values.shape[1:])
        values = values.repeat_interleave(probs.shape[1] // values.shape[1], dim=1)
        mixed = (probs @ values.to(probs.dtype)).transpose(1, 2).flatten(2)
        ok, d = close(v[key("attention_z")], mixed.to(v[key("attention_z")].dtype))
        yield CheckResult.of(["attention_z"], "attention_z == attention_probs · V", ok, d)
    if key("attention_value") in v and key("attention_probs") in v and key("attention_z") in v:
        ok, d = close(_mixed(model, v, layer), v[key("attention_z")])
        yield CheckResult.of(
            ["attention_value"],
            "attention_probs @ repeat_kv(attention_value) == attention_z",
            ok,
            d,
        )
    if key("attention_z") in v and key("attention_premix") in v:
        z, premix = v[key("attention_z")], v[key("attention_premix")]
        gate = raw.get(("gate", layer))
        ok, d = close(z, premix)
        if ok or gate is None:
            yield CheckResult.of(
                ["attention_z", "attention_premix"], "attention_z == attention_premix", ok, d
            )
        else:  # a gated attention multiplies z by its output gate before projecting
            ok, d = close(gated(z, gate), premix)
            yield CheckResult.of(
                ["attention_z", "attention_premix"],
                f"attention_premix == attention_z x the attention's {raw[('gate_kind', layer)]} gate",
                ok,
                d,
            )
    yield from _score_checks(model, v, raw, layer)
    yield from _head_output_checks(model, v, raw, layer)


def _mixed(model: Any, v: dict[tuple[str, int | None], Any], layer: int) -> Any:
    """attention_probs @ attention_value, each key/value head repeated over its group
    of query heads, heads concatenated: (batch, seq, heads x value head size)."""
    from causalab_mini.geometry import num_kv_heads

    probs, flat = v[("attention_probs", layer)], v[("attention_value", layer)]
    kv = num_kv_heads(model, layer)
    values = flat.unflatten(-1, (kv, -1)).transpose(1, 2).to(probs.dtype)
    values = values.repeat_interleave(probs.shape[1] // kv, dim=1)
    return (probs @ values).transpose(1, 2).flatten(2)


def _head_output_checks(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
) -> Iterator[CheckResult]:
    """The heads' terms summed, plus the output projection's bias once, == the
    projection's output: attentions_output where the projection's output is the
    contribution, else the projection of attention_premix."""
    import torch

    from causalab_mini.geometry import num_heads

    key = ("attention_head_output", layer)
    if key not in v:
        return
    terms = v[key]
    heads = num_heads(model, layer)
    proj = _row_module(model, layer, "attentions_head_output")._module
    bias = getattr(proj, "bias", None)
    total = terms.unflatten(-1, (heads, -1)).sum(-2)
    if isinstance(bias, torch.Tensor):
        total = total + bias.to(total.dtype)
    output = v.get(("attention_output", layer))
    if output is not None and close(total, output)[0]:
        yield CheckResult.of(
            ["attention_head_output"],
            "sum over heads of attention_head_output + the output bias == attention_output",
            True,
        )
        return
    premix = v.get(("attention_premix", layer))
    if premix is None:
        yield CheckResult.of(
            ["attention_head_output"],
            "sum over heads of attention_head_output + the output bias == attention_output",
            False,
            "" if output is None else close(total, output)[1],
        )
        return
    with torch.no_grad():
        projected = proj(premix)
    ok, d = close(total, projected[0] if isinstance(projected, tuple) else projected)
    yield CheckResult.of(
        ["attention_head_output"],
        "sum over heads of attention_head_output + the output bias == "
        "output projection(attention_premix)",
        ok,
        d,
    )


def _score_checks(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
) -> Iterator[CheckResult]:
    """The scores (or, where they are refused, the log probabilities) against
    q·kᵀ·scaling and the attention's mask, from the query and key read."""
    import torch

    def key(n: str) -> tuple[str, int]:
        return n, layer

    if all(key(n) in v for n in ("attention_query", "attention_key", "attention_scores")):
        s = v[key("attention_scores")]
        visible = torch.isfinite(s) & (s > torch.finfo(s.dtype).min / 2)
        s = s.double()
        product, additive, seen = _expected_scores(model, v, raw, layer, s.shape)
        # the scores are q·kᵀ·scaling plus the additive mask the attention function is
        # given: 0 where a query sees a key, unless the model biases the keys it sees
        # (Doge's dynamic mask)
        visible = visible & seen
        diff = (s - product - additive)[visible]
        ok = bool(visible.any()) and bool(torch.allclose(diff, torch.zeros_like(diff), atol=1e-4))
        worst = float(diff.abs().max()) if diff.numel() else float("nan")
        yield CheckResult.of(
            ["attention_query", "attention_key"],
            "attention_scores == q·kᵀ·scaling + the attention's mask (and bias)",
            ok,
            f"max error {worst:.3g}",
        )
    elif all(key(n) in v for n in ("attention_query", "attention_key", "attention_probs")):
        # no scores to compare with (refused): the probabilities are a softmax of
        # q·kᵀ·scaling + mask over the keys a query sees, so their log is that plus one
        # constant per query (the normalizer, whatever else it sums: a sink, say)
        p = v[key("attention_probs")].double()
        product, additive, seen = _expected_scores(model, v, raw, layer, p.shape)
        visible = (p > 0) & seen
        diff = torch.where(visible, torch.log(p.clamp_min(1e-300)) - product - additive, 0.0)
        mean = diff.sum(-1, keepdim=True) / visible.sum(-1, keepdim=True).clamp_min(1)
        spread = float(torch.where(visible, diff - mean, 0.0).abs().max())
        ok = bool(visible.any()) and spread <= 1e-4 * max(1.0, float(product.abs().max()))
        yield CheckResult.of(
            ["attention_query", "attention_key"],
            "log attention_probs == q·kᵀ·scaling + mask + a constant per query",
            ok,
            f"max spread {spread:.3g}",
        )


def _expected_scores(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
    shape: Any,
) -> tuple[Any, Any, Any]:
    """What the scores (or log probabilities) of ``shape`` at ``layer`` are held to:
    q·kᵀ·scaling, the additive mask plus bias, and where a query sees a key (float64,
    float64, bool)."""
    product = _qk_product(model, v, raw, layer, shape[1]).double()
    additive, seen = _mask(raw, layer, shape)
    return product, additive + _bias(raw, layer, shape), seen


def _mask(raw: dict[tuple[str, int], Any], layer: int, shape: Any) -> tuple[Any, Any]:
    """The attention's mask at ``layer`` as (additive part, where a query sees a key),
    both broadcast to ``shape`` (no mask: 0, everywhere), with the ``seen`` operand
    (a causal buffer) where the attention masks by one."""
    import torch

    mask = raw.get(("mask", layer))
    seen = torch.ones(shape, dtype=torch.bool)
    extra = raw.get(("seen", layer))
    if extra is not None:  # a causal buffer (nonzero: seen), its last queries, first keys
        keys, queries = shape[-1], shape[-2]
        seen = (extra[..., keys - queries : keys, :keys] != 0).expand(shape)
    if mask is None:
        return torch.zeros(shape, dtype=torch.float64), seen
    mask = mask[..., : shape[-1]]
    if mask.dtype == torch.bool:
        return torch.zeros(shape, dtype=torch.float64), seen & mask.expand(shape)
    sees = (mask > torch.finfo(mask.dtype).min / 2).expand(shape)
    additive = torch.where(sees, mask.double().expand(shape), 0.0)
    return additive, seen & sees


def _bias(raw: dict[tuple[str, int], Any], layer: int, shape: Any) -> Any:
    """The additive bias the attention puts in its scores at ``layer`` (the ``bias``
    operand: ALiBi), as float64 broadcast to ``shape`` (batch, heads, queries, keys);
    one held as (batch*heads, ...) is viewed as (batch, heads, ...). None: 0."""
    import torch

    bias = raw.get(("bias", layer))
    if bias is None:
        return torch.zeros(shape, dtype=torch.float64)
    bias = bias.double()
    if bias.dim() == 3 and bias.shape[0] == shape[0] * shape[1]:
        bias = bias.view(shape[0], shape[1], *bias.shape[1:])
    return bias[..., -shape[-1] :].expand(shape)  # the last keys: the ones the scores have


def _qk_product(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
    heads: int,
) -> Any:
    """q·kᵀ·scaling per query head (soft-capped where the config caps the logits), from
    the attention_query and attention_key read at ``layer``."""
    import torch

    q, k = v[("attention_query", layer)], v[("attention_key", layer)]
    b, seq = q.shape[0], q.shape[1]
    hd = q.shape[-1] // heads
    qn = q.reshape(b, seq, heads, hd).transpose(1, 2)
    kn = k.reshape(b, k.shape[1], -1, hd).transpose(1, 2)
    kn = kn.repeat_interleave(heads // kn.shape[1], dim=1)
    scaling = raw.get(("scaling", layer))
    if scaling is None:
        scaling = hd**-0.5
    product = (qn @ kn.transpose(-1, -2)) * scaling
    # the cap the attention call is given (the softcap operand), not a config field: a
    # config may state attn_logit_softcapping that its forward never applies (Gemma-3)
    cap = raw.get(("softcap", layer))
    if cap:
        product = cap * torch.tanh(product / cap)
    return product


def gated(z: Any, gate: Any) -> Any:
    """``z`` (b, s, heads x head_dim, flat) times an output gate, as a gated attention
    applies it before its output projection: one gate value per feature (a gate of
    z's shape, or (b, s, heads, head_dim)) or per head ((b, s, heads) or (b, s, heads,
    1)). A gate of any
    other shape is returned as is, so the check that compares the product fails
    rather than guessing."""
    if tuple(gate.shape) == tuple(z.shape):
        return z * gate.to(z.dtype)
    if gate.dim() == 4 and gate.shape[-1] == 1:
        gate = gate[..., 0]  # one value per head, kept broadcastable: (b, s, heads, 1) (Dots3)
    if gate.dim() == 4 and tuple(gate.flatten(2).shape) == tuple(z.shape):
        # one value per feature, held per head: (b, s, heads, head_dim) (Beam)
        return z * gate.flatten(2).to(z.dtype)
    if gate.dim() == 3 and tuple(gate.shape[:2]) == tuple(z.shape[:2]):
        heads = gate.shape[-1]
        if heads and z.shape[-1] % heads == 0:
            per_head = z.reshape(*z.shape[:2], heads, -1) * gate.to(z.dtype)[..., None]
            return per_head.flatten(2)
    return gate


def mlp_checks(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    raw: dict[tuple[str, int], Any],
    layer: int,
) -> Iterator[CheckResult]:
    import torch

    def key(n: str) -> tuple[str, int]:
        return n, layer

    if key("mlp_neuron_output") not in v:
        return
    neurons = v[key("mlp_neuron_output")]
    module = _row_module(model, layer, "mlps_neurons")
    with torch.no_grad():
        projected = module._module(neurons)
        projected = projected * _down_scale(model, layer)
    targets = [t for t in (v.get(key("mlp_output")), raw.get(("mlps", layer))) if t is not None]
    if targets:
        ok = any(close(projected, t)[0] for t in targets)
        yield CheckResult.of(
            ["mlp_neuron_output"], "down projection(mlp_neuron_output) == the MLP's output", ok
        )
    if key("mlp_activation") in v and key("mlp_input") in v:
        act, x = v[key("mlp_activation")], v[key("mlp_input")]
        ok, _ = close(neurons, act)
        if not ok:  # gated: neurons == act * linear(x) for one of the MLP's linears, or
            # act * one half of a fused gate-and-up linear (Phi-3's gate_up_proj); the
            # linears inside the MLP at any depth (CPM-Ant's w_in holds w_0 and w_1)
            mlp_module = _row_module(model, layer, "mlps")
            width = act.shape[-1]
            with torch.no_grad():
                for child in mlp_module._module.modules():
                    if not isinstance(child, torch.nn.Linear):
                        continue
                    if child.out_features == width:
                        branches: tuple[Any, ...] = (child(x),)
                    elif child.out_features == 2 * width:
                        branches = child(x).chunk(2, dim=-1)
                    else:
                        continue
                    if any(close(neurons, act * branch)[0] for branch in branches):
                        ok = True
                        break
        # with no MLP output to project the neurons onto (X-MOD's feed-forward ends in
        # a language adapter, so mlps_output is refused), the neurons are held to the
        # activation they read
        covered = ["mlp_activation"] if targets else ["mlp_activation", "mlp_neuron_output"]
        yield CheckResult.of(covered, "mlp_neuron_output == mlp_activation (x a gate)", ok)


# ---------------------------------------------------------------------- one architecture


def _mlp_linears_input(model: Any, v: dict[tuple[str, int | None], Any], layer: int) -> Any | None:
    """What the MLP's input projections read: mlp_input, or mlp_input_norm where its
    row ranks after mlp_input's (a norm inside the MLP module: Reformer)."""
    internals = model.internals
    if ("mlp_input_norm", layer) in v and ("mlp_input", layer) in v:
        if internals.rank("mlps_norm_output", layer) > internals.rank("mlps_input", layer):
            return v[("mlp_input_norm", layer)]
    return v.get(("mlp_input", layer))


def _activation_function(
    model: Any, layer: int, v: dict[tuple[str, int | None], Any]
) -> tuple[Any, str]:
    """The MLP's activation as (a callable, its name): the module whose output the
    mlps_activation row reads, where it reads one's output; else the one module the
    structure's candidates for that row name; else the function
    transformers maps the config's activation name to; else (a forward that calls
    F.silu itself and a config that names none) the one activation of transformers'
    table that maps mlp_gate (or mlp_pre) to mlp_activation, said by name. The checks
    hold it to mlp_activation, so a wrong one fails rather than passes; (None, "")
    where none is found."""
    from causalab_mini.internals import layer_config

    row = model.internals["mlps_activation"].address_at(layer)
    if not row.source and row.io.value == "output" and row.select is None:
        module = _row_module(model, layer, "mlps_activation")._module
        return module, f"the module {row.module}"
    # the activation module the structure's candidates name, where the row reads the
    # tensor elsewhere (GPT-1's act is one module every layer shares)
    from causalab_mini.generated import STRUCTURAL_ADDRESSES
    from causalab_mini.internals import child

    entry = STRUCTURAL_ADDRESSES.get("mlps_activation", {}).get(model.block_structure or "")
    found = [
        c for c in (entry.candidates if entry else ()) if child(model.layers[layer], c) is not None
    ]
    if len(found) == 1:
        return child(model.layers[layer], found[0])._module, f"the module {found[0]}"
    from transformers.activations import ACT2FN

    config = layer_config(model.text_config, layer)
    for attribute in ("hidden_act", "hidden_activation", "activation_function", "afn"):
        name = getattr(config, attribute, None)
        if isinstance(name, str) and name in ACT2FN:
            return ACT2FN[name], f"config.{attribute} {name!r}"
    given = v.get(("mlp_gate", layer), v.get(("mlp_pre", layer)))
    activation = v.get(("mlp_activation", layer))
    if given is None or activation is None:
        return None, ""
    matching = []
    for name in ACT2FN:
        try:
            function = ACT2FN[name]
            if close(function(given), activation)[0]:
                matching.append((function, name))
        except Exception:  # an activation that needs arguments or another shape
            continue
    if matching:
        return matching[0][0], f"transformers' {matching[0][1]!r} (the one that matches)"
    return None, ""


def mlp_projection_checks(
    model: Any,
    v: dict[tuple[str, int | None], Any],
    layer: int,
) -> Iterator[CheckResult]:
    """A gated MLP's halves: act(mlp_gate) == mlp_activation, act(mlp_gate) * mlp_up
    == mlp_neuron_output (mlp_activation * mlp_up where act is not known); a non-gated
    MLP's input projection: act(mlp_pre) == mlp_activation (``_activation_function``).
    Each is also held to its own linear fed what the MLP's linears read, and to the
    MLP's intermediate width (not a fused linear's two halves); where the activation is
    refused (a norm after it: Kosmos-2, BitNet), that is what certifies the place."""
    import torch

    from causalab_mini.geometry import width_of

    def key(n: str) -> tuple[str, int]:
        return n, layer

    activation = v.get(key("mlp_activation"))
    neurons = v.get(key("mlp_neuron_output"))
    act, act_name = (None, "") if activation is None else _activation_function(model, layer, v)
    with torch.no_grad():
        gate, up, pre = (v.get(key(n)) for n in ("mlp_gate", "mlp_up", "mlp_pre"))
        if gate is not None and act is not None:
            activated = act(gate)
            ok, d = close(activated, activation)
            yield CheckResult.of(
                ["mlp_gate"], "act(mlp_gate) == mlp_activation", ok, f"{act_name}: {d}"
            )
            if up is not None and neurons is not None:
                ok, d = close(activated * up, neurons)
                yield CheckResult.of(
                    ["mlp_gate", "mlp_up"], "act(mlp_gate) * mlp_up == mlp_neuron_output", ok, d
                )
        elif gate is not None and up is not None and activation is not None and neurons is not None:
            ok, d = close(activation * up, neurons)
            yield CheckResult.of(["mlp_up"], "mlp_activation * mlp_up == mlp_neuron_output", ok, d)
        if pre is not None and act is not None:
            ok, d = close(act(pre), activation)
            yield CheckResult.of(
                ["mlp_pre"], "act(mlp_pre) == mlp_activation", ok, f"{act_name}: {d}"
            )
        read = _mlp_linears_input(model, v, layer)
        width = width_of(model, "intermediate_size", layer)
        rows = {"mlp_gate": "mlps_gate", "mlp_up": "mlps_up", "mlp_pre": "mlps_pre"}
        for name, row in rows.items():
            if key(name) not in v or read is None:
                continue
            projection = _row_module(model, layer, row)._module
            out = projection(read)
            ok, d = close(out[0] if isinstance(out, tuple) else out, v[key(name)])
            wide = int(v[key(name)].shape[-1])
            if width is not None and wide != width:
                ok, d = False, f"{wide} wide, and the MLP's intermediate width is {width}"
            yield CheckResult.of(
                [name], f"its projection(mlp_input) == {name}, intermediate_size wide", ok, d
            )


ROTARY_PLACES = ("attention_query_pre_rope", "attention_key_pre_rope")


def _rotary_calls(
    model: Any, addresses: dict[tuple[str, int | None], Any]
) -> list[tuple[int, Any, Any]]:
    """Per layer that reads a pre-rotary place: (the layer, the rotary call's Envoy,
    the family's rotary function, found by the needle's callee in the attention
    module's Python module)."""
    import sys

    from causalab_mini.ops import OperationNotFound, find_op

    wanted: list[tuple[int, Any, Any]] = []
    for layer in range(model.internals.num_layers):
        found = [addresses.get((name, layer)) for name in ROTARY_PLACES]
        first = next((a for a in found if a is not None), None)
        if first is None:
            continue
        envoy = _module(model, layer, first.module)
        name = first.needles[-1].split("(")[0].split(".")[-1]
        function = getattr(sys.modules.get(type(envoy._module).__module__), name, None)
        if function is None or len(first.needles) != 1:
            continue
        where = {"row": first.component, "module": f"layers.{layer}.{first.module}"}
        try:
            op = find_op(
                envoy.source, first.needles[0], **where, model_class=model.internals.model_class
            )
        except OperationNotFound:
            continue
        wanted.append((layer, op, function))
    return wanted


def _rotated_equal(
    v: dict[tuple[str, int | None], Any], layer: int, out: Any
) -> Iterator[CheckResult]:
    """The rotary's (q, k) of the pre-rotary reads against attention_query / _key, and
    the rotary moved them (a read that is zero everywhere cannot move: said)."""
    for pre, rotated, post in (
        (ROTARY_PLACES[0], out[0], "attention_query"),
        (ROTARY_PLACES[1], out[1], "attention_key"),
    ):
        if (post, layer) not in v or (pre, layer) not in v:
            continue
        ok, d = close(rotated.transpose(1, 2).flatten(2), v[(post, layer)])
        zero = not bool(v[(pre, layer)].any())
        moved = zero or not close(v[(pre, layer)], v[(post, layer)])[0]
        detail = f"layer {layer}: {d}"
        if zero:
            detail += "; the read is zero on this build, which no rotation moves"
        elif not moved:
            detail += "; the rotary left it unchanged"
        yield CheckResult.of(
            [pre], f"rotary({pre}) == {post}, and differs from it", ok and moved, detail
        )


def rotary_checks(
    model: Any,
    inputs: dict[str, Any],
    addresses: dict[tuple[str, int | None], Any],
    v: dict[tuple[str, int | None], Any],
) -> Iterator[CheckResult]:
    """rotary(attention_query_pre_rope, ...) == attention_query, and the same for the
    keys: the family's own rotary function (the callee the interiors' needle names, in
    the attention module's Python module) applied to the pre-rotary query and key read,
    with the other arguments the forward gave it (cos, sin: partial, interleaved or
    halved rotary is the function's own), gives the query and key the attention
    function receives; and the rotary moves them (pre != post where positions differ).
    Where one of the two is refused (JetMoE tiles its keys after the rotary), the
    other is checked with the call's own tensor in the refused one's place. A read that
    is zero everywhere (a tiny build whose norm weights start at zero) cannot be moved
    by a rotation: the identity is checked and the detail says so, and the moved build
    (norms drawn away from their start) is where it must move."""
    import torch

    names = ROTARY_PLACES
    wanted = _rotary_calls(model, addresses)
    if not wanted:
        return
    saved: list[tuple[int, Any, Any]] = []
    with model.trace(inputs):
        for layer, op, _ in wanted:
            args, kwargs = op.inputs
            saved.append((layer, [kept(a) for a in args], {k: kept(a) for k, a in kwargs.items()}))
    wrote = False
    for (layer, _, function), (_, args, kwargs) in zip(wanted, saved, strict=True):
        args = [unkept(a) for a in args]
        kwargs = {k: unkept(a) for k, a in kwargs.items()}
        held = []
        for i, pre in enumerate(names):
            native = args[i]
            read = v.get((pre, layer))
            if read is None:  # refused here: the call's own tensor in its place
                held.append(native)
                continue
            # the read, back as the call holds it (batch, heads, seq, head size)
            back = read.reshape(native.shape[0], native.shape[2], native.shape[1], -1)
            held.append(back.transpose(1, 2))
        with torch.no_grad():
            out = function(held[0], held[1], *args[2:], **kwargs)
        if not isinstance(out, (tuple, list)) or len(out) < 2:
            yield CheckResult.of(
                [n for n in names if (n, layer) in v],
                "rotary(attention_*_pre_rope) == attention_query, attention_key",
                False,
                f"layer {layer}: the rotary function returned {type(out).__name__}, not (q, k)",
            )
            continue
        yield from _rotated_equal(v, layer, out)
        if not wrote:  # the writes, on the first layer that rotates
            wrote = True
            yield from _rotary_writes(
                model, inputs, addresses, v, layer, function, held, args, kwargs
            )


def _rotary_writes(
    model: Any,
    inputs: dict[str, Any],
    addresses: dict[tuple[str, int | None], Any],
    v: dict[tuple[str, int | None], Any],
    layer: int,
    function: Any,
    held: list[Any],
    args: list[Any],
    kwargs: dict[str, Any],
) -> Iterator[CheckResult]:
    """A write at a pre-rotary place (2 x its clean value + 1) reaches the attention's
    query or key as the family's rotary of what was written (the other argument as the
    forward gave it), changes it, reads back as written, and leaves block_input (read
    before it) at its clean value."""
    import torch

    from causalab_mini.components import Plan

    before = addresses.get(("block_input", layer))
    clean_before = v.get(("block_input", layer))
    for i, (pre, post) in enumerate(
        (
            ("attention_query_pre_rope", "attention_query"),
            ("attention_key_pre_rope", "attention_key"),
        )
    ):
        at, after = addresses.get((pre, layer)), addresses.get((post, layer))
        if at is None or after is None or (pre, layer) not in v or (post, layer) not in v:
            continue
        written = v[(pre, layer)].detach() * 2 + 1
        reads = [a for a in (before, at, after) if a is not None]
        out = Plan.of(reads=reads, writes=[(at, written)]).run(model, inputs)
        native = args[i]
        back = written.reshape(native.shape[0], native.shape[2], native.shape[1], -1)
        given = list(held)
        given[i] = back.transpose(1, 2)
        with torch.no_grad():
            expected = function(given[0], given[1], *args[2:], **kwargs)[i]
        rotated, d = close(expected.transpose(1, 2).flatten(2), out[after])
        changed = not close(out[after], v[(post, layer)])[0]
        kept = before is None or clean_before is None or torch.equal(out[before], clean_before)
        back_ok = torch.equal(out[at], written)
        problems = [
            what
            for what, ok in (
                (f"{post} is not the rotary of the written value ({d})", rotated),
                (f"{post} did not change", changed),
                ("block_input, read before, changed", kept),
                (f"{pre} does not read back as written", back_ok),
            )
            if not ok
        ]
        yield CheckResult.of(
            [pre],
            f"a write at {pre} reaches {post} rotated, reads back, keeps block_input",
            not problems,
            f"layer {layer}: " + ("; ".join(problems) or d),
        )
