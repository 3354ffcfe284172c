"""Gradients at places and attribution patching, held to independent oracles: each
place's gradient equals torch.autograd on the plain transformers model of the same
checkpoint through a zero added by a hook on the raw module; a row's gradient in a
padded batch (left and right) equals the row alone; the weights get no gradient and
keep their requires_grad; identical base and source attribute exactly 0; attribution
patching is the first-order term of a patch scaled by a small epsilon; integrated
gradients are complete; both engines agree; bad input is refused before anything runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from causalab_mini import locate
from causalab_mini.attribution import AttributionRefused, attribute, gradients
from causalab_mini.errors import GradientRefused, HooksRefused
from causalab_mini.interchange import interchange
from causalab_mini.metrics import MetricError, logit_diff, logprob
from causalab_mini.plan import Plan
from causalab_mini.positions import encode, trace_inputs
from causalab_mini.tools.checks import positions as checks

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

TEXTS = ["The cat sat on the mat", "A dog ran"]
FAMILIES = ["tiny:llama", "tiny:gpt2", "tiny:gemma2", "tiny:gpt_neox"]


def _module_path(model: Any, module: Any) -> str:
    for name, candidate in model._model.named_modules():
        if candidate is module:
            return name
    raise AssertionError("module not in the model")


def _oracle(model: Any, layer: int, texts: list[str], token: int) -> Any:
    """d logprob(token) / d (layer's output), by autograd on a fresh plain model with a
    zero added by a forward hook on the raw decoder layer."""
    path = _module_path(model, model.layers[layer]._module)
    plain = AutoModelForCausalLM.from_pretrained(model._model.name_or_path, dtype=torch.float32)
    plain.eval()
    encoded = encode(model, texts)
    zero: dict[str, Any] = {}

    def hook(_m: Any, _args: Any, out: Any) -> Any:
        hidden = out[0] if isinstance(out, tuple) else out
        zero["z"] = torch.zeros_like(hidden, requires_grad=True)
        moved = hidden + zero["z"]
        return (moved, *out[1:]) if isinstance(out, tuple) else moved

    handle = plain.get_submodule(path).register_forward_hook(hook)
    try:
        logits = plain(**trace_inputs(model, encoded)).logits
    finally:
        handle.remove()
    last = torch.tensor([f.content[-1] for f in encoded.frames])
    value = torch.log_softmax(logits[torch.arange(len(texts)), last], -1)[:, token].sum()
    (grad,) = torch.autograd.grad(value, [zero["z"]])
    return grad


@pytest.mark.parametrize("spec", FAMILIES)
def test_a_place_gradient_is_autograd_on_the_plain_model(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    before = [(p.requires_grad, p.grad) for p in model._model.parameters()]
    address = locate(model, "block_output", 1)
    want = _oracle(model, 1, TEXTS, 5)
    got = {}
    for engine in ("nnsight", "hooks"):
        got[engine] = gradients(model, [address], TEXTS, logprob(5), engine=engine)[address]
        torch.testing.assert_close(got[engine], want, rtol=1e-5, atol=1e-7)
    assert torch.equal(got["nnsight"], got["hooks"])
    assert want.abs().max() > 0
    # nothing of the model changed: no gradient on a weight, requires_grad as it was
    after = [(p.requires_grad, p.grad) for p in model._model.parameters()]
    assert [r for r, _ in after] == [r for r, _ in before]
    assert all(g is None for _, g in after)
    assert not model._model.training


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_row_in_a_padded_batch_has_its_gradient_alone(
    side: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model("tiny:llama")
    tokenizer = model.tokenizer
    kept = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        at = locate(model, "block_output", 0, position={"index": -1})
        whole = locate(model, "mlp_input", 1, position={"index": 0})
        batch = gradients(model, [at, whole], TEXTS, logprob(7))
        for row, text in enumerate(TEXTS):
            alone = gradients(model, [at, whole], [text], logprob(7))
            for address in (at, whole):
                torch.testing.assert_close(
                    batch[address][row], alone[address][0], rtol=1e-5, atol=1e-7
                )
    finally:
        tokenizer.padding_side = kept


def test_heads_and_positions_are_cut_as_reads_are(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    whole = locate(model, "attention_z", 1)
    head = locate(model, "attention_z", 1, head=1)
    grads = gradients(model, [whole, head], TEXTS, logprob(3))
    size = whole.head_dim
    assert grads[head].shape[-1] == size
    torch.testing.assert_close(grads[head], grads[whole][..., size : 2 * size])


def _in_trace(model: Any, texts: list[str], token: int) -> tuple[Any, Callable[[Any], Any]]:
    """The batch a trace takes, and the oracle's metric on the model's logits (the sum
    over rows of logprob(token) at each row's last content token)."""
    encoded = encode(model, texts)
    last = torch.tensor([f.content[-1] for f in encoded.frames])

    def metric(logits: Any) -> Any:
        return torch.log_softmax(logits[torch.arange(len(texts)), last], -1)[:, token].sum()

    return trace_inputs(model, encoded), metric


def _weights_clean(model: Any) -> None:
    """A hand-written backward leaves gradients on the weights (as in plain torch):
    cleared, since the session's model is shared."""
    for p in model._model.parameters():
        p.grad = None


def _in_backward(model: Any, batch: Any, metric: Any, read: Callable[[], Any]) -> Any:
    """``read()`` (a read of a place) in the forward, then its ``.grad`` inside
    ``with loss.backward():``."""
    try:
        with model.trace(batch):
            x = read()
            loss = metric(model.output.logits)
            with loss.backward():
                g = x.grad.save()
    finally:
        _weights_clean(model)
    return g


def _retained(model: Any, batch: Any, metric: Any, place: Any = None) -> Any:
    """``x.retain_grad()`` on a saved read (``place()``, else block_output[1]), a plain
    ``loss.backward()``, then ``x.grad``."""
    try:
        with model.trace(batch):
            x = (place() if place is not None else model.layers_output[1]).save()
            x.retain_grad()
            metric(model.output.logits).backward()
    finally:
        _weights_clean(model)
    return x.grad


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_place_gradient_spelled_in_a_trace_is_autograd_on_the_plain_model(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    """Every spelling of a place's gradient in a hand-written trace gives what autograd
    gives on the plain model: ``.grad`` of a read (by attribute or through
    ``model.internals``) inside the backward, ``retain_grad()`` and a plain backward,
    and a Plan read differentiated by torch, on both engines."""
    model = tiny_model(spec)
    want = _oracle(model, 1, TEXTS, 5)
    assert want.abs().max() > 0
    batch, metric = _in_trace(model, TEXTS, 5)
    got = {
        "attribute": _in_backward(model, batch, metric, lambda: model.layers_output[1]),
        "internals": _in_backward(
            model, batch, metric, lambda: model.internals["layers_output"][1]
        ),
        "retain_grad": _retained(model, batch, metric),
    }
    address, logits = locate(model, "block_output", 1), locate(model, "logits")
    for engine in ("nnsight", "hooks"):
        reads = Plan.of([address, logits]).run(model, batch, engine=engine)
        (got[engine],) = torch.autograd.grad(metric(reads[logits]), [reads[address]])
    for spelling, grad in got.items():
        assert grad is not None, spelling
        torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-7, msg=spelling)
    assert all(p.grad is None for p in model._model.parameters())


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_plan_read_at_positions_or_a_head_is_on_the_autograd_path(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    """A Plan read cut to positions, a head, or both, differentiated by torch, has the
    place's gradient there on both engines (autograd on the plain model at the layer's
    output for the positions; ``gradients`` at the same address otherwise), and the
    read's values and the logits are those of a run without a gradient."""
    model = tiny_model(spec)
    want = _oracle(model, 1, TEXTS, 5)
    batch, metric = _in_trace(model, TEXTS, 5)
    last = torch.tensor([f.content[-1] for f in encode(model, TEXTS).frames])
    logits = locate(model, "logits")
    cut = [
        locate(model, "block_output", 1, position={"index": -1}),
        locate(model, "attention_z", 1, head=1),
        locate(model, "attention_query", 1, head=0, position={"index": -2}),
    ]

    def token_logprob(lo: Any) -> Any:
        return torch.log_softmax(lo.float(), -1)[:, 5]

    for engine in ("nnsight", "hooks"):
        with torch.no_grad():
            plain = Plan.of([*cut, logits]).run(model, batch, engine=engine)
        reads = Plan.of([*cut, logits]).run(model, batch, engine=engine)
        for address in cut:
            torch.testing.assert_close(reads[address].detach(), plain[address], rtol=0, atol=0)
        torch.testing.assert_close(reads[logits].detach(), plain[logits], rtol=0, atol=0)
        grads = torch.autograd.grad(metric(reads[logits]), [reads[a] for a in cut])
        at_last = want[torch.arange(len(TEXTS)), last].unsqueeze(1)
        torch.testing.assert_close(grads[0], at_last, rtol=1e-5, atol=1e-7)
        for address, grad in zip(cut[1:], grads[1:], strict=True):
            expected = gradients(model, [address], batch, token_logprob, engine=engine)[address]
            assert float(expected.abs().max()) > 0, address
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-9, msg=str(address))
    assert all(p.grad is None for p in model._model.parameters())


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_a_read_after_an_in_place_edit_has_its_gradient_and_one_before_is_refused(
    tiny_model: Callable[..., Any], spec: str
) -> None:
    """A read takes the tensor's version when it is read: block_output[0] (held as the
    model's own tensor, no copy) scaled in place through a first read, then read again,
    has the gradient autograd gives on the plain model with the block's output scaled
    the same (a zero added after the scaling); the first read, made before the edit,
    is refused its gradient (autograd's is the edited tensor's, not the read's)."""
    model = tiny_model(spec)
    batch, metric = _in_trace(model, TEXTS, 5)
    path = _module_path(model, model.layers[0]._module)
    plain = AutoModelForCausalLM.from_pretrained(model._model.name_or_path, dtype=torch.float32)
    zero: dict[str, Any] = {}

    def hook(_m: Any, _args: Any, out: Any) -> Any:
        hidden = out[0] if isinstance(out, tuple) else out
        zero["z"] = torch.zeros_like(hidden, requires_grad=True)
        moved = hidden * 1.5 + zero["z"]
        return (moved, *out[1:]) if isinstance(out, tuple) else moved

    handle = plain.get_submodule(path).register_forward_hook(hook)
    try:
        (want,) = torch.autograd.grad(metric(plain(**batch).logits), [zero["z"]])
    finally:
        handle.remove()
    try:
        with model.trace(batch):
            first = model.layers_output[0]
            first.mul_(1.5)
            again = model.layers_output[0]
            loss = metric(model.output.logits)
            with loss.backward():
                got = again.grad.save()
        with pytest.raises(GradientRefused, match=r"layers_output\[0\].*in place after"):
            with model.trace(batch):
                first = model.layers_output[0]
                first.mul_(1.5)
                loss = metric(model.output.logits)
                with loss.backward():
                    first.grad.save()
    finally:
        _weights_clean(model)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_a_place_gradient_in_reverse_order_and_at_a_copied_place(
    tiny_model: Callable[..., Any],
) -> None:
    """Two places' gradients asked in reverse forward order, one of them a place whose
    reads are copies (the mid-stream, edited in place later by the forward): each is
    what ``gradients`` gives (itself held to autograd above)."""
    model = tiny_model("tiny:llama")
    batch, metric = _in_trace(model, TEXTS, 5)
    mid, out = locate(model, "block_mid", 1), locate(model, "block_output", 0)
    want = gradients(model, [mid, out], TEXTS, logprob(5))
    try:
        with model.trace(batch):
            x0 = model.layers_output[0]
            x1 = model.layers_mid[1]
            loss = metric(model.output.logits)
            with loss.backward():
                g1 = x1.grad.save()
                g0 = x0.grad.save()
    finally:
        _weights_clean(model)
    torch.testing.assert_close(g1, want[mid], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g0, want[out], rtol=1e-5, atol=1e-7)


def test_a_place_gradient_with_several_invokes(tiny_model: Callable[..., Any]) -> None:
    """With an invoke per prompt: a read's gradient inside a backward the same invoke
    opens, and ``retain_grad()`` in each invoke, give each row's gradient alone; a
    backward opened in another invoke (which nnsight's backward does not serve) is
    refused with those two spellings. nnsight 0.6/0.7 never serve ``.grad`` inside a
    backward in a trace of several invokes: refused there with the version and the
    spellings that work (``retain_grad()`` does work). The metric reads the library's
    ``model.logits``, which every nnsight narrows to the invoke's rows (0.6/0.7 hand
    nnsight's own ``model.output`` to every invoke whole)."""
    from causalab_mini import compat

    model = tiny_model("tiny:llama")
    texts = ["The cat sat on the mat", "The dog sat on the rug"]  # 11 and 12 tokens
    address = locate(model, "block_output", 1)
    alone = [gradients(model, [address], [t], logprob(5))[address] for t in texts]

    def metric(logits: Any) -> Any:
        return torch.log_softmax(logits[:, -1], -1)[:, 5].sum()

    try:
        with model.trace() as tracer:
            with tracer.invoke(texts[0]):
                a = model.layers_output[1].save()
                a.retain_grad()
                loss_a = metric(model.logits).save()
            with tracer.invoke(texts[1]):
                b = model.layers_output[1].save()
                b.retain_grad()
                loss_b = metric(model.logits).save()
        (loss_a + loss_b).backward()
        grads = [a.grad, b.grad]

        def second_invokes_grad() -> Any:
            """x.grad inside the backward, of the second invoke's read."""
            with model.trace() as tracer:
                with tracer.invoke(texts[0]):
                    model.layers_output[1].save()
                with tracer.invoke(texts[1]):
                    b = model.layers_output[1]
                    loss = metric(model.logits)
                    with loss.backward(retain_graph=True):
                        g = b.grad.save()
            return g

        if compat.is_08():
            torch.testing.assert_close(second_invokes_grad(), alone[1], rtol=1e-5, atol=1e-7)
            with pytest.raises(GradientRefused, match="another invoke"):
                with model.trace() as tracer:
                    with tracer.invoke(texts[0]):
                        x = model.layers_output[1]
                    with tracer.invoke(texts[1]):
                        loss = metric(model.logits)
                        with loss.backward():
                            x.grad.save()
        else:  # (a name bound in one invoke is not seen in another there)
            refused = rf"several invokes, and under nnsight {compat.nnsight_version()}"
            with pytest.raises(GradientRefused, match=refused):
                second_invokes_grad()
    finally:
        _weights_clean(model)
    n = alone[0].shape[1]  # the first row padded to the batch's length
    side = slice(-n, None) if model.tokenizer.padding_side == "left" else slice(0, n)
    torch.testing.assert_close(grads[0][:, side], alone[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grads[1], alone[1], rtol=1e-5, atol=1e-7)


def test_a_flat_place_gradient_on_nnsight_and_refused_up_front_on_hooks(
    tiny_model: Callable[..., Any],
) -> None:
    """OPT holds its mid-stream flat, (batch*seq, hidden), viewed back with the layer
    input's batch and sequence: its gradient in a trace (viewed back the same way) is
    what ``gradients`` gives on the nnsight engine; the hooks engine, which cannot view
    it back, refuses before the model runs."""
    model = tiny_model("tiny:opt")
    address = locate(model, "block_mid", 1)
    want = gradients(model, [address], TEXTS, logprob(5))[address]
    assert tuple(want.shape[:2]) == (2, max(len(f.real) for f in encode(model, TEXTS).frames))
    batch, metric = _in_trace(model, TEXTS, 5)
    got = _in_backward(model, batch, metric, lambda: model.layers_mid[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    runs: list[int] = []
    handle = model._model.register_forward_pre_hook(lambda *_: runs.append(1))
    try:
        with pytest.raises(HooksRefused, match="held flat"):
            gradients(model, [address], TEXTS, logprob(5), engine="hooks")
    finally:
        handle.remove()
    assert not runs


def test_a_module_input_place_gradient_is_its_own(tiny_model: Callable[..., Any]) -> None:
    """Falcon's MLP takes the tensor its attention takes too (a parallel block): the
    tensor's gradient is both modules', the place's is the MLP's alone. Asked inside
    the backward it is refused, naming ``retain_grad()``; ``retain_grad()`` right after
    the read hands the MLP a view of its own and gives what ``gradients`` gives."""
    model = tiny_model("tiny:falcon")
    address = locate(model, "mlp_input", 1)
    want = gradients(model, [address], TEXTS, logprob(5))[address]
    batch, metric = _in_trace(model, TEXTS, 5)
    try:
        with pytest.raises(GradientRefused, match=r"x\.retain_grad\(\) right after"):
            _in_backward(model, batch, metric, lambda: model.mlps_input[1])
    finally:
        _weights_clean(model)
    got = _retained(model, batch, metric, lambda: model.mlps_input[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_the_sweep_certifies_the_trace_spelling(certified: Callable[[str], Any]) -> None:
    """The sweep's gradients check holds each place's read in a trace of one's own
    (``retain_grad()`` right after it, one backward) to ``gradients`` at every served
    boundary place of the probe layer; on Llama that is every one of them, inputs and
    the in-place mid-stream included."""
    from causalab_mini.tools.checks.gradients import TRACED

    result = certified("tiny:llama")
    assert result.outcome == "certified", result.reason
    traced = {
        name
        for name, item in result.components.items()
        if any(c.startswith(TRACED) for c in item.get("checks", []))
    }
    assert {"block_input", "block_mid", "mlp_input", "mlp_output", "block_output"} <= traced


def test_a_place_gradient_spelled_wrongly_is_refused_with_the_spelling_that_works(
    tiny_model: Callable[..., Any],
) -> None:
    model = tiny_model("tiny:llama")
    batch, metric = _in_trace(model, TEXTS, 5)
    try:
        # the place asked for inside the backward: the forward is over
        with pytest.raises(GradientRefused, match=r"read x = model.layers_output\[1\] before"):
            with model.trace(batch):
                loss = metric(model.output.logits)
                with loss.backward():
                    model.layers_output[1].grad.save()
        # a part of a read: the whole read's gradient, indexed
        with pytest.raises(GradientRefused, match="of the whole read"):
            with model.trace(batch):
                x = model.layers_output[1][:, 0]
                loss = metric(model.output.logits)
                with loss.backward():
                    x.grad.save()
        # .grad of a read after a plain backward, without retain_grad: never a silent None
        with model.trace(batch):
            y = model.layers_output[1].save()
            metric(model.output.logits).backward()
        with pytest.raises(GradientRefused, match="retain_grad"):
            _ = y.grad
        # a read's gradient is not replaced through the read
        with pytest.raises(GradientRefused, match=r"t\.grad = g"):
            with model.trace(batch):
                z = model.layers_output[1]
                loss = metric(model.output.logits)
                with loss.backward():
                    z.grad = torch.zeros_like(z)
    finally:
        _weights_clean(model)


def _pairs(model: Any) -> tuple[list[str], list[str]]:
    pairs = checks.equal_length_pairs(model, list(checks.SENTENCES[:10]))
    assert pairs is not None
    return pairs[0][:2], pairs[1][:2]


def test_identical_base_and_source_attribute_exactly_zero(
    tiny_model: Callable[..., Any],
) -> None:
    model = tiny_model("tiny:gpt2")
    address = locate(model, "block_output", 0)
    for method in ("atp", "ig"):
        result = attribute(
            model, [address], TEXTS[:1], TEXTS[:1], logprob(5), method=method, steps=4
        )
        assert torch.equal(result.scores[address], torch.zeros_like(result.scores[address]))


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_attribution_patching_is_the_first_order_term(
    spec: str, tiny_model: Callable[..., Any]
) -> None:
    model = tiny_model(spec)
    bases, sources = _pairs(model)
    base, source = bases[:1], sources[:1]
    address = locate(model, "block_output", 1)
    metric = logprob(5)
    atp = attribute(model, [address], base, source, metric)
    x_base = Plan.of([address]).run(model, base)[address]
    x_source = Plan.of([address]).run(model, source)[address]
    logits = locate(model, "logits")
    last = encode(model, base).frames[0].content[-1]
    eps = 1e-3
    moved = Plan.of([logits], [(address, x_base + eps * (x_source - x_base))]).run(model, base)
    clean = Plan.of([logits]).run(model, base)
    finite = (metric(moved[logits][:, last], model) - metric(clean[logits][:, last], model)) / eps
    estimate = atp.scores[address].sum()
    torch.testing.assert_close(estimate, finite[0].detach(), rtol=2e-2, atol=1e-4)


def test_integrated_gradients_are_complete(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    bases, sources = _pairs(model)
    address = locate(model, "block_output", 1)
    metric = logprob(5)
    by_engine = {}
    for engine in ("nnsight", "hooks"):
        result = attribute(
            model, [address], bases, sources, metric, method="ig", steps=32, engine=engine
        )
        patched = interchange(
            model, [locate(model, "block_output", 1, position="all")], bases, sources
        )
        exact = metric(patched.logits, model) - result.metric_base
        total = result.scores[address].sum(-1)
        torch.testing.assert_close(total, exact.detach(), rtol=1e-2, atol=1e-4)
        by_engine[engine] = result.scores[address]
    assert torch.equal(by_engine["nnsight"], by_engine["hooks"])


def test_bad_input_is_refused_before_anything_runs(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    address = locate(model, "block_output", 0)
    with pytest.raises(MetricError, match="callable"):
        gradients(model, [address], TEXTS, "logprob")
    with pytest.raises(AttributionRefused, match="read-only"):
        gradients(model, [locate(model, "input_ids")], TEXTS, logprob(1))
    with pytest.raises(AttributionRefused, match="'atp' or 'ig'"):
        attribute(model, [address], TEXTS, TEXTS, logprob(1), method="shap")
    with pytest.raises(AttributionRefused, match="give sources"):
        attribute(model, [address], TEXTS, None, logprob(1), method="ig")
    with pytest.raises(MetricError, match="not one"):
        gradients(model, [address], TEXTS, logit_diff("the cat sat", " dog"))
    # a metric autograd cannot differentiate: refused before the model runs
    runs: list[int] = []
    handle = model._model.register_forward_pre_hook(lambda *_: runs.append(1))
    try:
        with pytest.raises(AttributionRefused, match=r"torch\.int64 tensor off the graph"):
            gradients(model, [address], TEXTS, lambda logits: logits.argmax(-1))
        with pytest.raises(AttributionRefused, match=r"torch\.bool tensor off the graph"):
            attribute(model, [address], TEXTS, TEXTS, lambda logits: logits[:, 0] > 0)
        with pytest.raises(MetricError, match="not one value per row"):
            gradients(model, [address], TEXTS, lambda logits: logits.sum())
    finally:
        handle.remove()
    assert not runs
