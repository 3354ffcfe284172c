"""The hooks engine (``causalab_mini.hooks``, ``Plan.run(..., engine="hooks")``):
tensors torch.equal to the nnsight engine's, reads, writes (the read before, the
place after, the logits), heads, streams, positions and interchange; what it refuses,
and why; no hook outlives a run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import compat
from causalab_mini.components import ComponentError, locate
from causalab_mini.engines import HooksEngine
from causalab_mini.errors import RemoteRefused, WriteRefused
from causalab_mini.generated import COMPONENTS
from causalab_mini.hooks import HooksRefused, dispatched
from causalab_mini.interchange import interchange
from causalab_mini.plan import Plan

Load = Callable[..., Any]
TEXTS = ["The cat sat on the mat", "Hello, world!"]
FAMILIES = ["tiny:llama", "tiny:gpt2"]


def _addresses(model: Any, layers: tuple[int, ...] = (0, 1)) -> list[Any]:
    out = []
    for name, spec in COMPONENTS.items():
        for layer in layers if spec.per_layer else (None,):
            try:
                out.append(locate(model, name, layer))
            except ComponentError:
                pass
    return out


def _served(model: Any, addresses: list[Any]) -> tuple[list[Any], dict[str, str]]:
    served, refused = [], {}
    for address in addresses:
        try:
            Plan.of([address]).run(model, TEXTS, engine="hooks")
            served.append(address)
        except HooksRefused as exc:
            refused[address.component] = str(exc)
    return served, refused


@pytest.mark.semantic
@pytest.mark.parametrize("spec", FAMILIES)
def test_every_served_read_equals_nnsight(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec, True)
    served, refused = _served(model, _addresses(model))
    assert {"block_input", "attention_query", "attention_z", "block_mid", "logits"} <= {
        a.component for a in served
    }
    want = Plan.of(served).run(model, TEXTS)
    got = Plan.of(served).run(model, TEXTS, engine="hooks")
    for address in served:
        assert torch.equal(want[address], got[address]), address
    held = Plan.of(served).run(model, TEXTS, held=True, engine="hooks")
    assert torch.equal(held[served[0]], Plan.of(served).run(model, TEXTS, held=True)[served[0]])
    # the softmax's input is inside the attention function: only nnsight reaches it
    assert "attention_scores" in refused
    assert "use engine='nnsight'" in refused["attention_scores"]
    assert "softmax" in refused["attention_scores"]


@pytest.mark.semantic
@pytest.mark.parametrize("spec", FAMILIES)
@pytest.mark.parametrize(
    "component,head", [("block_mid", None), ("attention_z", 1), ("mlp_output", None)]
)
def test_a_write_reads_before_writes_and_reads_after_as_nnsight(
    spec: str, component: str, head: int | None, tiny_model: Load
) -> None:
    model = tiny_model(spec)
    before = locate(model, "block_input", 1)
    place = locate(model, component, 1, head=head)
    logits = locate(model, "logits")
    clean = Plan.of([before, place, logits]).run(model, TEXTS)
    value = clean[place] * 0.5 + 1
    kept = value.clone()
    results = []
    for engine in ("nnsight", "hooks"):
        plan = Plan.of([before, place, logits], [(place, value)])
        results.append(plan.run(model, TEXTS, engine=engine))
    want, got = results
    for out in (want, got):
        assert torch.equal(out[before], clean[before])  # the read before keeps its value
        assert torch.equal(out[place], value)  # the place reads back the write
        assert not torch.equal(out[logits], clean[logits])  # and it reaches the logits
    for address in (before, place, logits):
        assert torch.equal(want[address], got[address]), address
    assert torch.equal(value, kept)  # the value handed in is never changed


def test_a_write_that_does_not_fit_is_refused_as_by_nnsight(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    place = locate(model, "block_mid", 1)
    shape = Plan.of([place]).run(model, TEXTS)[place].shape
    for bad in (torch.zeros(shape[0], 1, shape[2]), torch.zeros(shape, dtype=torch.float64)):
        with pytest.raises(WriteRefused):
            Plan.of(writes=[(place, bad)]).run(model, TEXTS)
        with pytest.raises(WriteRefused, match="block_mid"):
            Plan.of(writes=[(place, bad)]).run(model, TEXTS, engine="hooks")


@pytest.mark.semantic
def test_streams_equal_nnsight(tiny_model: Load) -> None:
    model = tiny_model("tiny:deepseek_v4")
    whole = locate(model, "block_input", 1)
    one = locate(model, "block_input", 1, stream=1)
    mid = locate(model, "block_output", 1)
    clean = Plan.of([whole, one, mid]).run(model, TEXTS)
    got = Plan.of([whole, one, mid]).run(model, TEXTS, engine="hooks")
    for address in (whole, one, mid):
        assert torch.equal(clean[address], got[address])
    value = clean[one] + 1
    want = Plan.of([one, mid], [(one, value)]).run(model, TEXTS)
    got = Plan.of([one, mid], [(one, value)]).run(model, TEXTS, engine="hooks")
    assert torch.equal(got[one], value) and not torch.equal(got[mid], clean[mid])
    assert torch.equal(want[mid], got[mid])


def test_flat_tokens_are_refused_with_the_engine_that_reads_them(tiny_model: Load) -> None:
    model = tiny_model("tiny:opt")
    address = locate(model, "mlp_output", 1)
    with pytest.raises(HooksRefused, match=r"held flat.*use engine='nnsight'"):
        Plan.of([address]).run(model, TEXTS, engine="hooks")
    assert Plan.of([address]).run(model, TEXTS)[address] is not None  # nnsight reads it


def test_inline_attention_interiors_are_refused(tiny_model: Load) -> None:
    model = tiny_model("tiny:bloom")
    with pytest.raises(HooksRefused, match=r"attention_query.*inside a forward.*engine='nnsight'"):
        Plan.of([locate(model, "attention_query", 1)]).run(model, TEXTS, engine="hooks")


@pytest.mark.semantic
def test_a_probabilities_write_is_refused_and_its_read_served(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama", True)
    probs = locate(model, "attention_probs", 1)
    read = Plan.of([probs]).run(model, TEXTS, engine="hooks")[probs]
    assert torch.equal(read, Plan.of([probs]).run(model, TEXTS)[probs])
    with pytest.raises(HooksRefused, match="a write of the probabilities"):
        Plan.of(writes=[(probs, read.clone())]).run(model, TEXTS, engine="hooks")


@pytest.mark.semantic
@pytest.mark.parametrize("spec", FAMILIES)
def test_positions_equal_nnsight(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec)
    last = locate(model, "block_output", 1, position={"index": -1})
    at = locate(model, "block_input", 1, position={"index": 2})
    whole = locate(model, "block_output", 1)
    earlier = locate(model, "block_input", 0)
    reads = [earlier, at, whole, last]
    clean = Plan.of(reads).run(model, TEXTS)
    got = Plan.of(reads).run(model, TEXTS, engine="hooks")
    for address in reads:
        assert torch.equal(clean[address], got[address])
    value = clean[at] + 1
    want = Plan.of(reads, [(at, value)]).run(model, TEXTS)
    got = Plan.of(reads, [(at, value)]).run(model, TEXTS, engine="hooks")
    assert torch.equal(got[earlier], clean[earlier])
    assert torch.equal(got[at], value)
    assert not torch.equal(got[whole], clean[whole])
    for address in reads:
        assert torch.equal(want[address], got[address])


@pytest.mark.semantic
@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2", "tiny:bloom"])
def test_interchange_equals_nnsight(spec: str, tiny_model: Load) -> None:
    model = tiny_model(spec)
    patches = [
        locate(model, "block_output", 1, position={"index": -1}),
        locate(model, "mlp_output", 0, position={"index": -1}),
    ]
    reads = [
        locate(model, "block_input", 0, position={"index": -1}),
        locate(model, "block_mid", 1, position="all"),
    ]
    bases = ["The cat sat on the mat", "Rome is the capital of Italy", "Hello"]
    sources = ["The dog slept by the door", "Berlin is the capital of Germany", "Good"]
    a = interchange(model, patches, bases, sources, reads=reads, return_sources=True)
    b = interchange(
        model, patches, bases, sources, reads=reads, return_sources=True, engine="hooks"
    )
    assert torch.equal(a.logits, b.logits)
    assert torch.equal(a.sources[0].logits, b.sources[0].logits)
    for address in reads:
        x, y = a.reads[address], b.reads[address]
        if isinstance(x, list):  # ragged: each row its own tokens
            assert len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y, strict=True))
        else:
            assert torch.equal(x, y)


def _hooks(model: Any) -> list[tuple[str, int, int, Any]]:
    """Every module's hooks and its instance forward (nnsight's controller, which a
    hooks run sets aside for its forward and must put back)."""
    return [
        (name, len(m._forward_pre_hooks), len(m._forward_hooks), m.__dict__.get("forward"))
        for name, m in model._module.named_modules()
    ]


def _interface_patched() -> bool:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return "get_interface" in ALL_ATTENTION_FUNCTIONS.__dict__


@pytest.mark.semantic
def test_no_hook_outlives_a_run(tiny_model: Load) -> None:
    from causalab_mini.model import StandardizedTransformer

    model = StandardizedTransformer("tiny:llama")  # its own: this test runs it hooked
    # the hooks engine does not run the scores or the pre-rotary query and key (calls
    # inside a forward that only nnsight's source reaches): it refuses them
    hooked_away = {"attention_scores", "attention_query_pre_rope", "attention_key_pre_rope"}
    addresses = [a for a in _addresses(model, (1,)) if a.component not in hooked_away]
    dispatched(model)  # (dispatch replaces the modules, and their controllers)
    before = _hooks(model)
    Plan.of(addresses).run(model, TEXTS, engine="hooks")
    assert _hooks(model) == before and not _interface_patched()
    place = locate(model, "attention_z", 1)
    with pytest.raises(WriteRefused):  # an error inside a hook
        Plan.of([locate(model, "block_input", 0)], [(place, torch.zeros(1))]).run(
            model, TEXTS, engine="hooks"
        )
    assert _hooks(model) == before and not _interface_patched()

    def interrupt(value: Any) -> Any:
        raise KeyboardInterrupt

    engine = HooksEngine()
    program = engine.lower(Plan.of([place]), model, edits=[(None, interrupt)])
    with pytest.raises(KeyboardInterrupt):
        engine.run(model, program, TEXTS)
    assert _hooks(model) == before and not _interface_patched()
    # traced with nnsight afterwards, it gives the tensors of a model never hooked
    fresh = StandardizedTransformer("tiny:llama")
    used = Plan.of(addresses).run(model, TEXTS)
    clean = Plan.of(_same(fresh, addresses)).run(fresh, TEXTS)
    for a, b in zip(addresses, _same(fresh, addresses), strict=True):
        assert torch.equal(used[a], clean[b]), a


@pytest.mark.semantic
def test_the_hooks_engine_after_a_trace_that_read_the_probabilities() -> None:
    # nnsight 0.7 leaves one-shot replacements of the attention function pending on a
    # module's operations after a trace that read its probabilities: unless the hooks
    # engine clears them (compat.clear_pending_operations), its wrapper of the
    # attention interface never runs, and its reads there are never made
    from causalab_mini.model import StandardizedTransformer

    # its own model (eager attention, probabilities on): no earlier test's traces
    model = StandardizedTransformer("tiny:llama", enable_attention_probs=True)
    probs = locate(model, "attention_probs", 1)
    query = locate(model, "attention_query", 1)
    first = Plan.of([probs]).run(model, TEXTS)  # the nnsight engine, first
    for reads in ([query, probs], [probs], [query]):
        want = Plan.of(reads).run(model, TEXTS)
        got = Plan.of(reads).run(model, TEXTS, engine="hooks")
        for address in reads:
            assert torch.equal(want[address], got[address]), address
    again = Plan.of([probs]).run(model, TEXTS, engine="hooks")
    assert torch.equal(again[probs], first[probs])


def _same(model: Any, addresses: list[Any]) -> list[Any]:
    return [locate(model, a.component, a.layer) for a in addresses]


def test_engine_refusals(tiny_model: Load) -> None:
    model = tiny_model("tiny:llama")
    plan = Plan.of([locate(model, "block_input", 1)])
    with pytest.raises(RemoteRefused, match=r"engine='hooks' runs the model here.*drop"):
        plan.run(model, TEXTS, engine="hooks", remote=True)
    with pytest.raises(ValueError, match="engine is one of 'nnsight', 'hooks'"):
        plan.run(model, TEXTS, engine="torch")
    with pytest.raises(ValueError, match="engine is one of"):
        interchange(
            model,
            [locate(model, "block_input", 1, position={"index": -1})],
            ["a"],
            ["b"],
            engine="x",
        )


@pytest.mark.semantic
def test_the_sweep_check_holds_and_notices_a_hooks_engine_that_differs(
    tiny_model: Load, monkeypatch: pytest.MonkeyPatch
) -> None:
    from causalab_mini import hooks
    from causalab_mini.tools import certify
    from causalab_mini.tools.checks import Context, engines

    model = tiny_model("tiny:llama", True)
    names = ("block_input", "attention_z", "attention_scores", "block_mid", "block_output")
    addresses = {(c, 1): locate(model, c, 1) for c in names}
    addresses[("logits", None)] = locate(model, "logits")
    ctx = Context(model, certify.sample_inputs(model), addresses, {})
    clean = list(engines.hooks_engine(ctx))
    assert clean and all(o.ok for o in clean), [o for o in clean if not o.ok]
    covered = {c for o in clean for c in o.components}
    assert {"block_input", "attention_z", "block_mid", "block_output", "logits"} <= covered
    assert {engines.READS, engines.WRITES, engines.HEAD, engines.POSITIONS} <= {
        o.description for o in clean
    }
    assert ctx.notes["attention_scores"]["engines"] == "nnsight"
    assert "softmax" in ctx.notes["attention_scores"]["hooks_refused"]
    assert ctx.notes["block_mid"]["engines"] == engines.BOTH
    apply = hooks._apply

    def off(step: dict[str, Any], call: Any) -> Any:  # a hooks engine one ulp-ish off
        value = apply(step, call)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value * (1 + 1e-6)
        return value

    monkeypatch.setattr(hooks, "_apply", off)
    tampered = list(engines.hooks_engine(Context(model, ctx.inputs, addresses, {})))
    assert any(not o.ok for o in tampered if o.description == engines.READS)


def test_a_batch_run_again_is_batched_again_where_it_changed(tiny_model: Load) -> None:
    """The hooks engine batches a batch of tensors once while it is unchanged: run
    again after an in-place edit of its ids, or with its tensors replaced in the
    mapping, it gives what the nnsight engine gives on the batch as it now is (never
    the first run's values)."""
    from causalab_mini.positions import encode, trace_inputs

    model = tiny_model("tiny:llama")
    batch = trace_inputs(model, encode(model, TEXTS))
    logits = locate(model, "logits")
    mid = locate(model, "block_mid", 1)
    plan = Plan.of([mid, logits])

    def both() -> tuple[Any, Any]:
        hooks = plan.run(model, batch, engine="hooks")
        want = plan.run(model, batch)
        for a in (mid, logits):
            assert torch.equal(hooks[a], want[a]), a
        return hooks[logits], hooks[mid]

    first, _ = both()
    again, _ = both()
    assert torch.equal(first, again)
    batch["input_ids"][0, -1] = (int(batch["input_ids"][0, -1]) + 1) % 512
    edited, _ = both()
    assert not torch.equal(edited[0], first[0]), "an in-place edit of the ids was not seen"
    batch["input_ids"] = batch["input_ids"].flip(0)
    batch["attention_mask"] = batch["attention_mask"].flip(0)
    batch["position_ids"] = batch["position_ids"].flip(0)
    flipped, _ = both()
    torch.testing.assert_close(flipped.flip(0), edited, rtol=1e-5, atol=1e-6)


@pytest.mark.semantic
def test_a_run_sets_nnsights_controllers_aside_and_runs_each_modules_own_body() -> None:
    """Outside a trace nnsight's controller only runs the module's body (the forward
    it found on the module); a hooks run sets the controllers aside for its forward
    and runs those bodies: a module whose body is an instance forward (a kernel's, a
    user's) runs that one, not its class's."""
    from causalab_mini.model import StandardizedTransformer

    model = StandardizedTransformer("tiny:llama")  # its own: its final norm is changed
    dispatched(model)  # (dispatch replaces the modules)
    norm = model._model.model.norm
    set_aside = {id(found[0]) for found in compat.controllers(model._model)}
    if compat.is_08():
        assert id(vars(norm)) in set_aside and id(vars(model._model)) in set_aside
    state = norm.__dict__.get("__nnsight__")
    if state is None:  # 0.6 / 0.7: no controllers, nothing set aside
        assert set_aside == set()
        return
    own = type(norm).forward
    state.original = state.body = lambda module, x: own(module, x) * 2.0 + 1.0
    place = locate(model, "ln_final")
    traced = Plan.of([place]).run(model, TEXTS)[place]
    before = _hooks(model)
    hooked = Plan.of([place]).run(model, TEXTS, engine="hooks")[place]
    assert torch.equal(traced, hooked)
    assert _hooks(model) == before  # the controllers are back
    state.original = state.body = own  # the class's body again: the read moves back
    plain = Plan.of([place]).run(model, TEXTS, engine="hooks")[place]
    assert torch.equal(traced, plain * 2.0 + 1.0)


@pytest.mark.semantic
def test_what_a_run_keeps_goes_with_the_model() -> None:
    """The programs, the prepared steps and the batches the hooks engine keeps for runs
    to come are the model's (its internals'): a model let go is collected, its modules
    with it, after runs on text, on a tensor batch and through an interchange."""
    import gc
    import weakref

    from causalab_mini.model import StandardizedTransformer

    def used() -> tuple[Any, Any]:
        model = StandardizedTransformer("tiny:llama")
        plan = Plan.of([locate(model, "block_output", 0), locate(model, "mlp_output", 1)])
        plan.run(model, TEXTS, engine="hooks")
        batch = model.tokenizer(TEXTS, padding=True, return_tensors="pt")
        tensors = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        plan.run(model, tensors, engine="hooks")
        plan.run(model, tensors, engine="hooks")  # (the batch and the program kept)
        assert model.internals.engine_cache["batched"] and model.internals.engine_cache["hooks"]
        patch = locate(model, "block_input", 1, position={"index": -1})
        interchange(model, [patch], TEXTS[:1], TEXTS[1:], engine="hooks")
        return weakref.ref(model), weakref.ref(model._model)

    model, module = used()
    gc.collect()
    assert model() is None and module() is None


@pytest.mark.semantic
def test_a_run_takes_the_layers_token_hooks_off_and_puts_them_back(tiny_model: Load) -> None:
    """The layers' token-shape hooks (what a flat place is viewed back with, in a
    trace) are off for a hooks run's forward, which refuses flat places, where each is
    its layer's one pre-hook, and every layer's pre-hooks are as they were after runs
    that succeed and raise; a flat read after them is viewed with its own batch's
    shape. A model without flat places has none."""
    from causalab_mini.internals import LayerTokens

    dense = tiny_model("tiny:llama")
    dispatched(dense)
    for i in range(dense.internals.num_layers):
        hooks = dense.internals.layer_envoy(i)._module._forward_pre_hooks.values()
        assert not any(isinstance(hook, LayerTokens) for hook in hooks)
    model = tiny_model("tiny:opt")
    dispatched(model)
    layers = [model.internals.layer_envoy(i)._module for i in range(model.internals.num_layers)]

    def pre_hooks() -> list[list[Any]]:
        return [list(m._forward_pre_hooks.values()) for m in layers]

    before = pre_hooks()
    assert all(any(isinstance(h, LayerTokens) for h in hooks) for hooks in before)
    # off only where it is the layer's one pre-hook (nnsight 0.6/0.7 keep their own)
    off = len(before[1]) == 1
    seen: list[bool] = []

    def look(module: Any, args: Any) -> None:  # (on the layer's attention: inside it)
        seen.append(any(isinstance(h, LayerTokens) for h in layers[1]._forward_pre_hooks.values()))

    handle = model.internals.layer_envoy(1)._module.self_attn.register_forward_pre_hook(look)
    try:
        plan = Plan.of([locate(model, "block_output", 1)])
        plan.run(model, TEXTS, engine="hooks")
        assert seen == [not off] and pre_hooks() == before
        plan.run(model, TEXTS)  # a trace: the hooks run in it
        assert seen == [not off, True]
    finally:
        handle.remove()

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("stopped in layer 2")

    handle = layers[2].register_forward_pre_hook(fail)
    with_fail = pre_hooks()
    try:
        with pytest.raises(RuntimeError, match="stopped in layer 2"):
            Plan.of([locate(model, "block_output", 2)]).run(model, TEXTS, engine="hooks")
        assert pre_hooks() == with_fail
    finally:
        handle.remove()
    assert pre_hooks() == before
    flat = locate(model, "mlp_output", 1)
    Plan.of([locate(model, "block_output", 1)]).run(model, TEXTS[:1], engine="hooks")
    got = Plan.of([flat]).run(model, TEXTS)[flat]
    ids = model.tokenizer(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    assert tuple(got.shape[:2]) == tuple(ids.shape)


@pytest.mark.semantic
def test_a_module_called_twice_or_never_is_refused_not_read() -> None:
    """A read's module called a second time in the forward is refused (the first
    call's tensor is not handed out as if it were the only one), with one read there
    or several; a read whose module never runs is refused after the forward."""
    from causalab_mini.model import StandardizedTransformer

    model = StandardizedTransformer("tiny:llama")  # its own: a layer's MLP is changed
    dispatched(model)
    mlp = model._model.model.layers[0].mlp
    activation = locate(model, "mlp_activation", 0)
    before = Plan.of([activation]).run(model, TEXTS, engine="hooks")[activation]

    def again(module: Any, args: Any, output: Any) -> None:
        module.act_fn(args[0])  # the activation's module runs a second time

    handle = mlp.register_forward_hook(again)
    try:
        for reads in ([activation], [activation, activation]):
            with pytest.raises(HooksRefused, match=r"SiLU.*runs more than once"):
                Plan.of(reads).run(model, TEXTS, engine="hooks")
    finally:
        handle.remove()
    assert torch.equal(Plan.of([activation]).run(model, TEXTS, engine="hooks")[activation], before)
    mlp.forward = lambda x: mlp.down_proj(mlp.up_proj(x))  # act_fn never called
    with pytest.raises(HooksRefused, match=r"mlp_activation.*never fired"):
        Plan.of([activation, locate(model, "block_output", 1)]).run(model, TEXTS, engine="hooks")


@pytest.mark.semantic
def test_hooks_put_in_torchs_tables_run_as_registered_ones_and_leave_none(
    tiny_model: Load, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine puts its hooks in each module's hook tables itself (torch's own
    counter for their ids): the reads equal those of hooks registered through torch's
    public API (the path taken where torch keeps hooks otherwise), every table is as it
    was after runs that succeed and raise, and a user's hook registered before is
    kept, runs, and is removed by its handle."""
    from causalab_mini import hooks as engine

    assert engine._torch_tables()
    model = tiny_model("tiny:llama")
    dispatched(model)
    tables = [
        getattr(m, name)
        for m in model._model.modules()
        for names in engine._DIRECT_NAMES.values()
        for name in names
    ]

    def snapshot() -> list[list[tuple[int, Any]]]:
        return [list(t.items()) for t in tables]

    mlp = model._model.model.layers[1].mlp
    own = list(mlp._forward_hooks.items())  # (nnsight 0.6/0.7 keep a hook of their own)
    calls: list[int] = []
    handle = mlp.register_forward_hook(lambda m, a, o: calls.append(1))
    before = snapshot()
    plan = Plan.of([locate(model, c, i) for i in range(2) for c in ("block_input", "mlp_output")])
    direct = plan.run(model, TEXTS, engine="hooks")
    assert snapshot() == before and calls == [1]
    # a write on each path: the read saved before it keeps its value, the write
    # reaches what comes after, and both paths give the same tensors
    first, out0, out1 = (
        locate(model, c, i)
        for c, i in (("block_input", 0), ("block_output", 0), ("block_output", 1))
    )
    value = direct[locate(model, "block_input", 1)] * 0.5 + 1
    write = Plan.of([first, out1], [(out0, value)])
    written = write.run(model, TEXTS, engine="hooks")
    monkeypatch.setattr(engine, "_DIRECT", [False])
    public = plan.run(model, TEXTS, engine="hooks")
    public_written = write.run(model, TEXTS, engine="hooks")
    assert snapshot() == before and calls == [1, 1, 1, 1]
    for address, got in public.items():
        assert torch.equal(direct[address], got), address
    clean = Plan.of([first, out1]).run(model, TEXTS)
    for got in (written, public_written):
        assert torch.equal(got[first], clean[first])  # read before the write: kept
        assert not torch.equal(got[out1], clean[out1])  # the write reached layer 1
        assert torch.equal(got[out1], written[out1])
    monkeypatch.setattr(engine, "_DIRECT", [True])

    def fail(module: Any, args: Any) -> None:
        raise RuntimeError("stopped")

    stop = model._model.model.layers[1].register_forward_pre_hook(fail)
    with_stop = snapshot()
    with pytest.raises(RuntimeError, match="stopped"):
        plan.run(model, TEXTS, engine="hooks")
    assert snapshot() == with_stop
    stop.remove()
    handle.remove()
    assert list(mlp._forward_hooks.items()) == own
