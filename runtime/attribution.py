"""Gradients at places, and attribution patching built on them.

``gradients(model, addresses, inputs, metric)`` is the gradient of the metric (its sum
over rows) with respect to each place, shaped as a read of the address hands it on
(its head, its positions). It is taken the way an independent check would take it: a
zero tensor that requires grad is added to the place where the forward reaches it
(a write whose value is made of the place's own tensor, on any engine), and autograd
differentiates the metric with respect to that zero. Nothing of the model changes:
the forward runs in eval mode (dropout off) unless asked otherwise, the weights are
frozen for the run (no ``.grad`` is left on them and their ``requires_grad`` is as it
was), and the value of every place is the model's own (the zero adds nothing).

``attribute(model, addresses, bases, sources, metric, method="atp")`` estimates what
patching each (pair, position) of each address from the source would do to the
metric: attribution patching, the gradient at the base times (source - base), summed
over the place's features; ``method="ig"`` integrates the gradient along the straight
path from the base's value to the source's at the address's positions (``steps``
midpoints); with no sources, gradient times activation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from . import plain
from .engines import Engine, RemoteEngine, engine_for
from .errors import CausalabError, RemoteRefused
from .locator import ComponentAddress, locate
from .lower import geometry
from .metrics import Metric, MetricError, as_metric
from .plan import Plan, Step
from .positions import Encoded, PositionError, encode, resolve, stacked, take, trace_inputs


class AttributionRefused(CausalabError, ValueError):
    """A gradient or attribution that cannot be taken as asked, with the reason."""


@contextlib.contextmanager
def frozen(model: Any, train: bool = False) -> Iterator[None]:
    """The model's weights frozen (``requires_grad`` False) and the module in eval mode
    (``train``: in train mode) for the block; both restored after, whatever happens."""
    module = getattr(model, "_model", model)
    saved = [(p, p.requires_grad) for p in module.parameters()]
    was_training = module.training
    try:
        for p, _ in saved:
            p.requires_grad_(False)
        module.train(train)
        yield
    finally:
        for p, wanted in saved:
            p.requires_grad_(wanted)
        module.train(was_training)


def _whole(address: ComponentAddress) -> ComponentAddress:
    return replace(address, position=(), head=None, stream=None)


def _cut(address: ComponentAddress, whole: Any, index: Any) -> Any:
    """A tensor of the whole place (as handed on: all heads, every position) cut as a
    read of ``address`` is: its positions, its head, its stream."""
    value = whole
    if address.position:
        assert address.sequence_axis is not None
        value = take(value, index, address.sequence_axis)
    step = geometry(address)
    if address.head is not None:
        value = value[plain.head_slice(step)]
    if address.stream is not None:
        value = value[plain.stream_slice(step, value, None)]
    return value


def _last(encoded: Encoded) -> Any:
    """Each row's last token as the model receives it (``{"anchor": "last"}``): where it
    predicts the next token, as interchange reads its logits."""
    import torch

    return torch.tensor([f.real[-1] for f in encoded.frames])


def _take_last(full: Any, last: Any) -> Any:
    import torch

    return full[torch.arange(full.shape[0], device=full.device), last.to(full.device)]


@dataclass
class _Probe:
    """Where a zero joins a place: its tensor (filled in where the forward reaches it)
    and, optionally, what the place is set to before the zero is added."""

    address: ComponentAddress
    zero: Any = None
    clean: Any = None
    set_to: Any = None  # a function of the place's own tensor (interpolation), or None

    def edit(self, full: Any) -> Any:
        import torch

        self.clean = full.detach()
        base = self.set_to(full) if self.set_to is not None else full
        # a new tensor, never the model's own edited in place: autograd keeps its graph
        self.zero = torch.zeros_like(base, requires_grad=True)
        return base + self.zero


def _run(
    model: Any,
    runner: Engine,
    probes: list[_Probe],
    inputs: dict[str, Any],
    last: Any,
) -> Any:
    """One forward with every probe's zero added at its place; the last-token logits."""
    steps = [Step(p.address, True, None) for p in probes]
    logits_at = locate(model, "logits")
    ordered = sorted(range(len(steps)), key=lambda i: (steps[i].address.rank, not steps[i].write))
    plan = Plan(tuple([steps[i] for i in ordered] + [Step(logits_at)]))
    edits: list[tuple[Any, Any]] = [(probes[i].edit, None) for i in ordered]
    edits.append((None, lambda full: _take_last(full, last)))
    program = runner.lower(plan, model, edits=edits)
    (logits,) = runner.run(model, program, inputs)
    return logits


def _grads(value: Any, probes: list[_Probe]) -> list[Any]:
    import torch

    missing = [p.address for p in probes if p.zero is None]
    if missing:
        raise AttributionRefused(f"{missing[0]}: the forward never reached this place")
    if not getattr(value, "requires_grad", False):
        raise AttributionRefused(
            "the metric's value does not depend on any place asked for (no gradient flows "
            "to it): a metric of the logits, and places before the logits"
        )
    try:
        grads = torch.autograd.grad(value, [p.zero for p in probes], allow_unused=True)
    except RuntimeError as exc:
        if "inplace" not in str(exc):
            raise
        raise AttributionRefused(
            f"{probes[0].address}: autograd cannot differentiate this family's forward: it "
            "edits in place a tensor its own backward needs (RWKV's state); the place's "
            "value is read as usual, its gradient is not available"
        ) from None
    out = []
    for probe, grad in zip(probes, grads, strict=True):
        if grad is None:
            raise AttributionRefused(
                f"{probe.address}: autograd reaches no gradient here from the metric (the "
                "place is not on the path from the input to the logits on this family)"
            )
        out.append(grad)
    return out


def _local(engine: str | Engine, remote: bool | str | None, backend: Any) -> Engine:
    """The engine a gradient runs on: here, or refused before anything is sent."""
    if isinstance(engine, RemoteEngine) or remote or backend is not None:
        raise RemoteRefused(
            "gradients and attributions are taken through a zero added at each place where "
            "the forward runs, and the metric's code runs on the logits there; a remote "
            "run sends plain steps, which carry neither. On NDIF, write the backward in a "
            "trace: x = model.layers_output[layer]; x.requires_grad_(); loss = "
            "metric(model.logits[...]).sum(); with loss.backward(): g = x.grad.save() "
            "(docs/attribution.md)"
        )
    return engine_for(engine)


def _check_metric(model: Any, measure: Metric) -> None:
    """Refuse, before anything runs, a metric whose value on logits that require grad
    is no float tensor of one value per row that autograd reaches (an argmax, a count,
    a Python number). A metric that needs more than zero logits is judged on the run."""
    import torch

    width = int(getattr(getattr(model, "text_config", None), "vocab_size", 0) or 0)
    if width <= 0:
        return
    logits = torch.zeros(2, width, requires_grad=True)
    try:
        value = measure(logits, model)
    except MetricError:
        raise
    except Exception:
        return
    said = (
        f"a {value.dtype} tensor{'' if value.requires_grad else ' off the graph'}"
        if isinstance(value, torch.Tensor)
        else type(value).__name__
    )
    grad_able = isinstance(value, torch.Tensor) and value.is_floating_point()
    if not grad_able or not value.requires_grad or tuple(value.shape[:1]) != (2,):
        raise AttributionRefused(
            f"the metric {measure.name!r} returned {said} of shape "
            f"{tuple(getattr(value, 'shape', ()))} for 2 rows of logits: a gradient needs "
            "a float tensor computed from the logits, one value per row (e.g. "
            "causalab_mini.metrics.logprob(token), or logits[:, good] - logits[:, bad])"
        )


def _encoded(model: Any, inputs: Any, frame: str) -> Encoded:
    return inputs if isinstance(inputs, Encoded) else encode(model, inputs, frame)


def gradients(
    model: Any,
    addresses: Sequence[ComponentAddress],
    inputs: Any,
    metric: Any,
    *,
    engine: str | Engine = "nnsight",
    frame: str = "plain",
    train: bool = False,
    remote: bool | str | None = None,
    backend: Any = None,
) -> dict[ComponentAddress, Any]:
    """{address: the gradient of ``metric`` (summed over rows) with respect to the
    place, shaped as a read of the address}. ``inputs``: texts, or
    ``positions.encode(model, texts)``; ``metric``: a ``causalab_mini.metrics`` metric
    or a callable of the (rows, vocab) last-token logits. See the module's text.
    ``remote``/``backend``: refused before anything is sent, with the trace to write
    on NDIF instead."""
    import torch

    measure = as_metric(metric)
    if not addresses:
        raise AttributionRefused("no addresses: give the places to differentiate at")
    runner = _local(engine, remote, backend)
    _check_metric(model, measure)
    encoded = _encoded(model, inputs, frame)
    batch = trace_inputs(model, encoded)
    wholes: dict[ComponentAddress, _Probe] = {}
    for address in addresses:
        if not address.writable:
            raise AttributionRefused(
                f"{address}: a gradient is taken through a zero added at the place, and the "
                f"place is read-only ({address.why_read_only})"
            )
        wholes.setdefault(_whole(address), _Probe(_whole(address)))
    probes = list(wholes.values())
    with frozen(model, train), torch.enable_grad():
        logits = _run(model, runner, probes, batch, _last(encoded))
        value = measure(logits, model).sum()
        grads = dict(zip(wholes, _grads(value, probes), strict=True))
    out = {}
    for address in addresses:
        index = (
            stacked(resolve(model, encoded, address.position), address.position)
            if address.position
            else None
        )
        out[address] = _cut(address, grads[_whole(address)], index)
    return out


@dataclass
class Attribution:
    """``scores[address]``: (pairs, positions[, ...]) estimated effect on the metric of
    patching each position of the address from the source; ``metric_base`` and
    ``metric_source`` (pairs,) the metric on the clean runs; ``method``."""

    method: str
    scores: dict[ComponentAddress, Any] = field(default_factory=dict)
    metric_base: Any = None
    metric_source: Any = None


def _aligned(model: Any, encoded: Encoded, address: ComponentAddress, k: int) -> tuple[Any, Any]:
    """The (pairs, n) token indices of the address's positions in each base row and in
    its source row (every content token where the address names none), as many in both."""
    spec: Any = address.position or "all"
    indices = resolve(model, encoded, spec)
    for i in range(k):
        if len(indices[i]) != len(indices[k + i]):
            raise PositionError(
                f"{address}: its positions name {len(indices[i])} tokens in base {i} and "
                f"{len(indices[k + i])} in its source; name as many in both (a position "
                "spec on the address, or pairs of as many content tokens)"
            )
    base = stacked(indices[:k], spec)
    source = stacked(indices[k:], spec)
    return base, source


def _features(address: ComponentAddress, value: Any) -> Any:
    """``value`` (pairs, ..., n, ...) summed over every axis but the pair and the
    position axis: one score per (pair, position[, head for a per-head read])."""
    axis = address.sequence_axis
    assert axis is not None
    moved = value.movedim(axis, 1)
    return moved.reshape(moved.shape[0], moved.shape[1], -1).sum(-1)


def _check_attribute(
    addresses: Sequence[ComponentAddress],
    bases: Sequence[str],
    sources: Sequence[str] | None,
    method: str,
    steps: int,
) -> None:
    if method not in ("atp", "ig"):
        raise AttributionRefused(f"method is 'atp' or 'ig', not {method!r}")
    if sources is not None and (len(sources) != len(bases) or isinstance(sources, str)):
        raise PositionError("bases and sources are lists of texts, one source per base")
    if method == "ig" and sources is None:
        raise AttributionRefused("integrated gradients run from the base to a source: give sources")
    if type(steps) is not int or steps < 1:
        raise AttributionRefused(f"steps is a positive int, not {steps!r}")
    for address in addresses:
        if address.head is not None or address.stream is not None:
            raise AttributionRefused(
                f"{address}: attribution scores a place per (pair, position); locate it "
                "without a head (every head's score is its slice of the features)"
            )
        if address.sequence_axis is None:
            raise AttributionRefused(f"{address} has no sequence axis to score positions on")


def _score(
    model: Any,
    encoded: Encoded,
    address: ComponentAddress,
    probe: _Probe,
    grad: Any,
    sources: Sequence[str] | None,
    method: str,
    run: tuple[Engine, dict[str, Any], Any, Metric, int, int],
) -> Any:
    """One address's scores: (pairs, positions)."""
    runner, batch, last, measure, k, steps = run
    axis = address.sequence_axis
    assert axis is not None
    if sources is None:
        spec: Any = address.position or "all"
        at = stacked(resolve(model, encoded, spec)[:k], spec)
        x = take(probe.clean[:k], at, axis)
        return _features(address, take(grad[:k], at, axis) * x).detach()
    base_at, source_at = _aligned(model, encoded, address, k)
    x_base = take(probe.clean[:k], base_at, axis)
    x_source = take(probe.clean[k:], source_at, axis)
    if method == "atp":
        g = take(grad[:k], base_at, axis)
    else:
        path = (base_at, x_base, x_source)
        g = _integrated(model, runner, address, batch, last, measure, k, steps, path)
    return _features(address, g * (x_source - x_base)).detach()


def attribute(
    model: Any,
    addresses: Sequence[ComponentAddress],
    bases: Sequence[str],
    sources: Sequence[str] | None,
    metric: Any,
    *,
    method: str = "atp",
    steps: int = 16,
    engine: str | Engine = "nnsight",
    frame: str = "plain",
    remote: bool | str | None = None,
    backend: Any = None,
) -> Attribution:
    """Attribution scores per (pair, position) of each address; see the module's text.
    ``method``: "atp" (gradient at the base x (source - base)), "ig" (integrated
    gradients from base to source, ``steps`` midpoints; completeness: the scores of an
    address sum to metric(source-patched there) - metric(base)), or, with
    ``sources=None``, gradient x activation. ``remote``/``backend``: refused before
    anything is sent (``gradients``)."""
    import torch

    _check_attribute(addresses, bases, sources, method, steps)
    measure = as_metric(metric)
    runner = _local(engine, remote, backend)
    _check_metric(model, measure)
    k = len(bases)
    texts = [*bases, *(sources or [])]
    encoded = encode(model, texts, frame)
    batch = trace_inputs(model, encoded)
    last = _last(encoded)
    result = Attribution(method if sources is not None else "grad_x_act")
    with frozen(model), torch.enable_grad():
        probes = [_Probe(_whole(a)) for a in addresses]
        logits = _run(model, runner, probes, batch, last)
        values = measure(logits, model)
        grads = _grads(values[:k].sum(), probes)
    result.metric_base = values[:k].detach()
    result.metric_source = values[k:].detach() if sources is not None else None
    run = (runner, batch, last, measure, k, steps)
    for address, probe, grad in zip(addresses, probes, grads, strict=True):
        result.scores[address] = _score(model, encoded, address, probe, grad, sources, method, run)
    return result


def _integrated(
    model: Any,
    runner: Engine,
    address: ComponentAddress,
    batch: dict[str, Any],
    last: Any,
    measure: Metric,
    k: int,
    steps: int,
    path: tuple[Any, Any, Any],
) -> Any:
    """The mean gradient at the base's positions along base -> source (midpoints),
    each point a forward of the base rows with the place set there."""
    import torch

    base_at, x_base, x_source = path
    axis = address.sequence_axis
    assert axis is not None
    rows = {key: value[:k] if hasattr(value, "shape") else value for key, value in batch.items()}
    total = torch.zeros_like(x_base)
    for s in range(steps):
        alpha = (s + 0.5) / steps
        point = x_base + alpha * (x_source - x_base)

        def set_to(full: Any, point: Any = point) -> Any:
            return plain.put_positions(full, base_at.to(full.device), axis, point.to(full.dtype))

        probe = _Probe(_whole(address), set_to=set_to)
        with frozen(model), torch.enable_grad():
            logits = _run(model, runner, [probe], rows, last[:k])
            (grad,) = _grads(measure(logits, model).sum(), [probe])
        total += take(grad, base_at, axis).detach()
    return total / steps


__all__ = [
    "Attribution",
    "AttributionRefused",
    "attribute",
    "frozen",
    "gradients",
]
