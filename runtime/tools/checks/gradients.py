"""Gradients at places (``causalab_mini.attribution.gradients``), certified like values:
the gradient at each layer's block output equals autograd on the model's own torch
module through a zero added by a plain forward hook on the raw decoder layer (no
causalab_mini code on that side), the hooks engine's gradient at every place it
serves equals the nnsight engine's, and in a hand-written trace each place's read,
``retain_grad()`` called right after it, has that gradient as its ``.grad`` after a
backward (the spelling of ``docs/attribution.md``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.tools.checks.base import CheckResult

ORACLE = "gradient at block_output == autograd through a zero hooked on the raw layer"
ENGINES = "engine='hooks' gradient == engine='nnsight' gradient within 1e-6 relative"
ENGINES_RTOL = 1e-6
TRACED = "x.grad of a place's read in a trace (x.retain_grad()) == gradients() within 1e-5"
TOKEN = 1  # the metric: the log-probability of this token at each row's last token
RTOL = 1e-5


def _metric(logits: Any) -> Any:
    import torch

    return torch.log_softmax(logits.float(), -1)[:, TOKEN]


def _oracle(model: Any, inputs: dict[str, Any], layer: int, last: Any) -> tuple[Any, Any] | None:
    """d metric / d (layer ``layer``'s output) by autograd on the model's torch module
    called as a trace calls it (the arguments nnsight's batching makes of ``inputs``:
    on a left-padded batch without position ids they are not the batch as given), a
    zero added to the raw layer's output by a forward hook."""
    import torch

    from causalab_mini.attribution import frozen
    from causalab_mini.hooks import forward_inputs

    call, args, kwargs = forward_inputs(model, inputs)

    zero: dict[str, Any] = {}

    def hook(_m: Any, _args: Any, out: Any) -> Any:
        hidden = out[0] if isinstance(out, (tuple, list)) else out
        zero["z"] = torch.zeros_like(hidden, requires_grad=True)
        moved = hidden + zero["z"]
        zero["moved"], zero["as_handed"] = moved, moved.detach().clone()
        zero["hidden"] = hidden.detach().clone()
        if hasattr(out, "_fields"):  # a named tuple (Reformer's ReformerOutput)
            return type(out)(moved, *out[1:])
        if isinstance(out, (tuple, list)):  # as the layer returned it (GPT-1: a list)
            return type(out)([moved, *out[1:]])
        return moved

    handle = model.layers[layer]._module.register_forward_hook(hook)
    try:
        with frozen(model), torch.enable_grad():
            logits = call(*args, **kwargs).logits
            value = _metric(logits[torch.arange(logits.shape[0]), last]).sum()
            (grad,) = torch.autograd.grad(value, [zero["z"]])
    finally:
        handle.remove()
    if not torch.equal(zero["moved"].detach(), zero["as_handed"]):
        return None  # the forward edits the layer's output in place later: no oracle
    return grad, zero["hidden"]


def _the_layer_output(model: Any, layer: Any) -> bool:
    """Whether block_output at ``layer`` is the decoder layer module's own output (its
    first element), so that a hook on the raw layer is an independent oracle for it: not
    where the row reads another module, scales, views or holds several streams."""
    from causalab_mini.address import FirstIfTuple, IOType

    if layer is None:
        return False
    try:
        row = model.internals["layers_output"].address_at(layer)
    except Exception:
        return False
    return bool(
        row.module == ""
        and row.io is IOType.OUTPUT
        and not row.source
        and (row.select is None or isinstance(row.select, FirstIfTuple))
        and row.scale is None
        and row.streams is None
        and not row.flat_tokens
        and not row.views_tokens
        and not row.snapshot  # the forward edits it in place later (XLM)
    )


def _relative(a: Any, b: Any) -> float:
    scale = float(b.abs().max()) or 1.0
    return float((a - b).abs().max()) / scale


def gradients(ctx: Any) -> Iterator[CheckResult]:
    """The two gradient checks on the context's inputs (token ids, no media)."""
    from causalab_mini.errors import CausalabError
    from causalab_mini.hooks import dispatched
    from causalab_mini.positions import encode

    model = ctx.model
    if set(ctx.inputs) - {"input_ids", "attention_mask", "position_ids"}:
        return  # media and encoder inputs: the oracle's forward needs more than ids
    dispatched(model)  # the oracle calls the module itself: its real weights
    try:
        encoded = encode(model, {k: v for k, v in ctx.inputs.items()})
    except CausalabError:
        return
    yield from _oracle_outcomes(ctx, encoded)
    yield from _engine_outcomes(ctx, encoded)
    yield from _traced_outcomes(ctx, encoded)


def _oracle_outcomes(ctx: Any, encoded: Any) -> Iterator[CheckResult]:
    """block_output's gradient at each layer against the raw layer's autograd."""
    import torch

    from causalab_mini.attribution import gradients as grads_of
    from causalab_mini.errors import CausalabError
    from causalab_mini.plan import Plan
    from causalab_mini.positions import trace_inputs

    model = ctx.model
    inputs = trace_inputs(model, encoded)
    # where each row predicts its next token, as the metrics read the logits
    last = torch.tensor([f.real[-1] for f in encoded.frames])
    outputs = {
        key: a
        for key, a in ctx.addresses.items()
        if key[0] == "block_output"
        and a not in ctx.unordered
        and a.writable
        and _the_layer_output(model, key[1])
    }
    for key, address in sorted(outputs.items(), key=lambda kv: kv[0][1] or 0):
        try:
            want = _oracle(model, inputs, int(key[1]), last)
        except RuntimeError:
            return  # autograd cannot run this forward at all (in-place edits): no gradient
        if want is None:
            continue
        want, hidden = want
        ours = Plan.of([address]).run(model, inputs)[address]
        if ours.shape != hidden.shape or not torch.allclose(ours, hidden, rtol=1e-5, atol=1e-6):
            continue  # the place is not the raw layer's output here (XLM): no oracle
        try:
            got = grads_of(model, [address], encoded, _metric)[address]
        except CausalabError as exc:
            yield CheckResult.of(("block_output",), ORACLE, False, f"[{key[1]}] {exc}")
            continue
        # at the real tokens: a family may change padding positions in place after the
        # layer, where the two sides then differ in what is left
        real = inputs["attention_mask"].bool() if "attention_mask" in inputs else None
        if real is not None and got.shape == want.shape and got.shape[:2] == real.shape:
            got, want = got[real], want[real]
        error = _relative(got, want)
        ok = got.shape == want.shape and error <= RTOL and float(want.abs().max()) > 0
        yield CheckResult.of(
            ("block_output",), ORACLE, ok, f"[{key[1]}] max relative error {error:.2g}"
        )


def _engine_outcomes(ctx: Any, encoded: Any) -> Iterator[CheckResult]:
    """The hooks engine's gradient against the nnsight engine's at every served
    boundary place of the probe layer and the whole model."""
    import torch

    from causalab_mini.attribution import gradients as grads_of
    from causalab_mini.errors import CausalabError

    model = ctx.model
    served = [
        a
        for a in ctx.addresses.values()
        if a not in ctx.unordered
        and a.writable
        and a.kind == "boundary"
        and a.layer in (None, min(1, ctx.n - 1))
    ]
    for address in served:
        try:
            want = grads_of(model, [address], encoded, _metric)[address]
        except (CausalabError, RuntimeError):
            continue  # no gradient there (refused with the reason): nothing to compare
        try:
            got = grads_of(model, [address], encoded, _metric, engine="hooks")[address]
        except (CausalabError, RuntimeError):
            continue  # the hooks engine does not serve it (said by the engines check)
        ok = got.shape == want.shape
        error = 0.0
        if ok:
            # the model's own autograd may give NaN (Gemma-3n's embeddings on a padded
            # batch): the engines agree where both give the same NaNs and the rest matches
            finite = torch.isfinite(want)
            ok = bool(torch.equal(finite, torch.isfinite(got)))
            if ok and bool(finite.any()):
                error = _relative(got[finite], want[finite])
                ok = error <= ENGINES_RTOL
        yield CheckResult.of(
            (address.component,), ENGINES, ok, "" if ok else f"{address}: {error:.2g}"
        )


def _traced_reads(model: Any, served: list[Any], inputs: Any, last: Any) -> list[Any]:
    """Each of ``served`` read in one trace in forward order, ``retain_grad()`` right
    after the read, and one backward of the metric (through the weights' graph, leaving
    no ``.grad`` on them): the reads, whose ``.grad`` is then the place's gradient."""
    import torch

    weights = [p for p in model._model.parameters() if p.requires_grad]
    reads: list[Any] = []  # bound before the trace: nnsight hands saves back
    with torch.enable_grad(), model.trace(inputs):
        for address in served:
            x = model.internals[address.accessor][address.layer]
            x.retain_grad()
            reads.append(x.save())
        logits = model.internals["logits"]()
        value = _metric(logits[torch.arange(logits.shape[0]), last]).sum()
        torch.autograd.grad(value, weights, allow_unused=True)
    return reads


def _traced_outcomes(ctx: Any, encoded: Any) -> Iterator[CheckResult]:
    """Every served boundary place of the probe layer, read in a trace of one's own,
    against ``gradients`` at the component that reads the whole place (where the read
    and the component hand the tensor on alike)."""
    import torch

    from causalab_mini.attribution import gradients as grads_of
    from causalab_mini.errors import CausalabError
    from causalab_mini.positions import trace_inputs

    model = ctx.model
    by_place: dict[Any, Any] = {}
    for a in ctx.addresses.values():
        if (
            a not in ctx.unordered
            and a.writable
            and a.kind == "boundary"
            and a.layer == min(1, ctx.n - 1)
            and a.head is None
            and a.stream is None
            and not a.position
        ):
            by_place.setdefault((a.accessor, a.layer), a)
    served = sorted(by_place.values(), key=lambda a: a.rank)
    if not served or "logits" not in model.internals:
        return
    try:
        want = grads_of(model, served, encoded, _metric)
    except (CausalabError, RuntimeError):
        return  # no gradient there (refused with the reason): nothing to compare
    last = torch.tensor([f.real[-1] for f in encoded.frames])
    try:
        reads = _traced_reads(model, served, trace_inputs(model, encoded), last)
    except CausalabError as exc:
        yield CheckResult.of(tuple(a.component for a in served), TRACED, False, str(exc)[:300])
        return
    for address, x in zip(served, reads, strict=True):
        got, expected = x.grad, want[address]
        if got is None:
            yield CheckResult.of((address.component,), TRACED, False, f"{address}: x.grad is None")
            continue
        if got.shape != expected.shape:
            continue  # the place holds the tensor otherwise than the component hands it on
        error = _relative(got, expected)
        ok = error <= RTOL
        yield CheckResult.of(
            (address.component,), TRACED, ok, "" if ok else f"{address}: {error:.2g}"
        )


__all__ = ["ENGINES", "ORACLE", "TRACED", "gradients"]
