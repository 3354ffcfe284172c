"""Gradients at places (``causalab_mini.attribution.gradients``), certified like values:
the gradient at each layer's block output, and at every other whole place of the probe
layer and the model that is a raw module's output or first input (the attention's and
the MLP's outputs and inputs, the norms', the activation's, the embeddings' ...),
equals autograd on the model's own torch module with respect to the tensor a plain
forward hook or pre-hook on that raw module sees (no causalab_mini code on that side), the hooks engine's gradient at every place it
serves equals the nnsight engine's, and in a hand-written trace each place's read,
``retain_grad()`` called right after it, has that gradient as its ``.grad`` after a
backward (the spelling of ``docs/attribution.md``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.tools.checks.base import CheckResult

ORACLE = (
    "gradient at the place == autograd on the raw model w.r.t. the tensor a plain hook "
    "sees at the module's output (or input), within 1e-5 relative"
)
ENGINES = "engine='hooks' gradient == engine='nnsight' gradient within 1e-6 relative"
ENGINES_RTOL = 1e-6
TRACED = "x.grad of a place's read in a trace (x.retain_grad()) == gradients() within 1e-5"
TOKEN = 1  # the metric: the log-probability of this token at each row's last token
RTOL = 1e-5


def _metric(logits: Any) -> Any:
    import torch

    return torch.log_softmax(logits.float(), -1)[:, TOKEN]


def _oracle(
    model: Any, inputs: dict[str, Any], module: Any, io: Any, last: Any, shared: bool
) -> tuple[Any, Any] | None:
    """d metric / d (``module``'s output, or its first positional input where ``io``
    is the input side) by autograd on the model's torch module called as a trace calls
    it (the arguments nnsight's batching makes of ``inputs``: on a left-padded batch
    without position ids they are not the batch as given). The weights frozen, a zero
    (a leaf that wants a gradient) added to the token embeddings by a plain forward
    hook puts everything after them on the autograd path; a plain hook (or pre-hook)
    on the raw module keeps the tensor object there, and autograd differentiates with
    respect to it, through every use the forward makes of it (the mid-stream feeds the
    MLP's norm and the residual sum alike). Where a write at the place is the module's
    own input only (``shared`` False: the input side of a row written by replacing
    it), a zero added to the input the module is handed instead: what the module sees
    alone, not the other modules the same tensor feeds (a parallel block's attention,
    a post-norm's residual). None where there is no such oracle: the
    module runs more than once in the forward, the input is passed by keyword only,
    the tensor is not on the path from the embeddings, or the forward edits it in
    place later."""
    import torch

    from causalab_mini.address import IOType
    from causalab_mini.attribution import frozen
    from causalab_mini.hooks import forward_inputs

    get = getattr(model._model, "get_input_embeddings", None)
    embed = get() if callable(get) else None
    if embed is None:
        return None
    call, args, kwargs = forward_inputs(model, inputs)
    seen: dict[str, Any] = {"calls": 0}
    lift, hook, pre_hook = _oracle_hooks(seen, shared)
    handles = [embed.register_forward_hook(lift)]
    if io is IOType.INPUT:
        handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
    else:
        handles.append(module.register_forward_hook(hook))
    try:
        with frozen(model), torch.enable_grad():
            logits = call(*args, **kwargs).logits
            tensor = seen.get("tensor")
            if seen["calls"] != 1 or tensor is None or not tensor.requires_grad:
                return None
            if not torch.equal(tensor.detach(), seen["as_handed"]):
                return None  # the forward edits the tensor in place later: no oracle
            value = _metric(logits[torch.arange(logits.shape[0]), last]).sum()
            try:
                (grad,) = torch.autograd.grad(value, [tensor], allow_unused=True)
            except RuntimeError:
                return None  # autograd cannot differentiate through this forward
    finally:
        for handle in handles:
            handle.remove()
    return None if grad is None else (grad, seen["as_handed"])


def _oracle_hooks(seen: dict[str, Any], shared: bool) -> tuple[Any, Any, Any]:
    """The oracle's plain hooks: ``lift`` (the embeddings plus a zero that wants a
    gradient), ``hook`` (keeps a module's output tensor in ``seen``) and ``pre_hook``
    (keeps its first positional input, or hands the module that input plus a zero of
    its own where the place is the module's own input: ``shared`` False)."""
    import torch

    def lift(_m: Any, _args: Any, out: Any) -> Any:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        return out + torch.zeros_like(out, requires_grad=True)

    def capture(tensor: Any) -> None:
        seen["calls"] += 1
        seen["tensor"], seen["as_handed"] = tensor, tensor.detach().clone()

    def hook(_m: Any, _args: Any, out: Any) -> None:
        hidden = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(hidden, torch.Tensor):
            capture(hidden)
        else:
            seen["calls"] += 2

    def pre_hook(_m: Any, args: Any, kwargs: Any) -> Any:
        if not args or not isinstance(args[0], torch.Tensor):
            seen["calls"] += 2  # no positional tensor: no oracle
            return None
        if shared:
            capture(args[0])
            return None
        own = args[0] + torch.zeros_like(args[0], requires_grad=True)
        capture(own)
        return ((own, *args[1:]), kwargs)

    return lift, hook, pre_hook


def _raw_module(model: Any, address: Any) -> tuple[Any, Any, bool] | None:
    """The raw torch module, side (output, input) and whether a write there overwrites
    the tensor in place, whose tensor ``address`` reads as it is, so that a plain hook there is an independent oracle for it: not where the
    row reads an operation inside the module, selects other than the first element,
    scales, views or holds several streams, is computed, or is edited in place later
    by the forward."""
    from causalab_mini.address import FirstIfTuple, IOType
    from causalab_mini.tree import child

    try:
        place = model.internals[address.accessor]
        row = place.address_at(address.layer)
    except Exception:
        return None
    if not (
        row.io in (IOType.OUTPUT, IOType.INPUT)
        and not row.source
        and (
            row.select is None or (row.io is IOType.OUTPUT and isinstance(row.select, FirstIfTuple))
        )
        and row.scale is None
        and row.streams is None
        and not row.flat_tokens
        and not row.views_tokens
        and not row.snapshot  # the forward edits it in place later (XLM)
        and row.heads_through is None
    ):
        return None
    base = model.internals.row_base(row, address.layer)
    envoy = None if base is None else child(base, row.module)
    module = getattr(envoy, "_module", None)
    return None if module is None else (module, row.io, row.write == "in_place")


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
    """The gradient at block_output at every layer, and at every other whole place of
    the probe layer and of the whole model that is a raw module's output or input,
    against autograd on the raw module through a zero hooked there."""
    import torch

    from causalab_mini.address import IOType
    from causalab_mini.attribution import gradients as grads_of
    from causalab_mini.errors import CausalabError
    from causalab_mini.plan import Plan
    from causalab_mini.positions import trace_inputs

    model = ctx.model
    inputs = trace_inputs(model, encoded)
    # where each row predicts its next token, as the metrics read the logits
    last = torch.tensor([f.real[-1] for f in encoded.frames])
    probe = min(1, ctx.n - 1)
    chosen = {
        key: a
        for key, a in ctx.addresses.items()
        if a not in ctx.unordered
        and a.writable
        and a.head is None
        and a.stream is None
        and not a.position
        and (key[0] == "block_output" or a.layer in (None, probe))
    }
    for key, address in sorted(chosen.items(), key=lambda kv: (kv[0][1] or 0, kv[1].rank)):
        raw = _raw_module(model, address)
        if raw is None:
            continue
        try:
            shared = raw[1] is not IOType.INPUT or raw[2]
            want = _oracle(model, inputs, raw[0], raw[1], last, shared)
        except RuntimeError:
            return  # autograd cannot run this forward at all (in-place edits): no gradient
        if want is None:
            continue
        want, hidden = want
        ours = Plan.of([address]).run(model, inputs)[address]
        if ours.shape != hidden.shape or not torch.allclose(ours, hidden, rtol=1e-5, atol=1e-6):
            continue  # the place is not the raw module's tensor here (XLM): no oracle
        try:
            got = grads_of(model, [address], encoded, _metric)[address]
        except CausalabError as exc:
            yield CheckResult.of((key[0],), ORACLE, False, f"[{key[1]}] {exc}")
            continue
        # at the real tokens: a family may change padding positions in place after the
        # place, where the two sides then differ in what is left
        real = inputs["attention_mask"].bool() if "attention_mask" in inputs else None
        if real is not None and got.shape == want.shape and got.shape[:2] == real.shape:
            got, want = got[real], want[real]
        ok, error = got.shape == want.shape, 0.0
        if ok:
            # the model's own autograd may give NaN (Gemma-3n's embeddings on a padded
            # batch): both sides the same NaNs, the rest within the tolerance
            finite = torch.isfinite(want)
            ok = bool(torch.equal(finite, torch.isfinite(got)))
            if ok and bool(finite.any()):
                got, want = got[finite], want[finite]
                error = _relative(got, want)
                ok = error <= RTOL
        if ok and (want.numel() == 0 or float(want.abs().max()) == 0):
            continue  # nothing reaches the metric from here (a layer after the last read)
        yield CheckResult.of((key[0],), ORACLE, ok, f"[{key[1]}] max relative error {error:.2g}")


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
