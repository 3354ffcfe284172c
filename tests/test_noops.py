"""No silent no-ops (issue 20, items 1, 2, 4, 6): an in-place edit of a read reaches the
model as the assignment would, or raises; an assignment on the model writes the place
or raises; an order error says which places; the first trace after a load behaves
like the others; the package root exports what the README uses."""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

from .registry_cases import model_types

PROMPT = "The quick brown fox jumps"
EDITED = ("llama", "gpt2", "gemma2")


def _writable(model: Any, layer: int) -> list[tuple[str, int | None]]:
    out = []
    for name, place in model.internals.items():
        at = layer if place.per_layer else None
        if place.row.io.value == "module" or place.refuses_writes() is not None:
            continue
        if place.unavailable_on(at) is None:
            out.append((name, at))
    return out


def _clean(model: Any, name: str, at: int | None) -> tuple[Any, Any]:
    box: dict[str, Any] = {}
    with model.trace(PROMPT):
        box["x"] = model.internals[name][at].save()
        box["logits"] = model.logits.save()
    return box["x"], box["logits"]


def _add(x: Any) -> None:
    x[:, 2] += 0.5


def _assign(x: Any) -> None:
    x[:, 2] = torch.full_like(x[:, 2], 0.25)


def _mul(x: Any) -> None:
    x[:, 2].mul_(3.0)


def _zero(x: Any) -> None:
    x[:, 2].zero_()


SPELLINGS: dict[str, Callable[[Any], None]] = {
    "x[:, 2] += v": _add,
    "x[:, 2] = v": _assign,
    "x[:, 2].mul_()": _mul,
    "x[:, 2].zero_()": _zero,
}


@pytest.mark.semantic
@pytest.mark.parametrize("family", EDITED)
def test_an_in_place_edit_at_every_place_is_its_write(
    family: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = tiny_model(f"tiny:{family}", True)
    places = _writable(model, 1)
    assert {"layers_mid", "layers_output", "embeddings_output"} <= {n for n, _ in places}
    for name, at in places:
        clean, clean_logits = _clean(model, name, at)
        for spelling, edit in SPELLINGS.items():
            box: dict[str, Any] = {}
            with model.trace(PROMPT):
                box["before"] = model.internals[name][at].save()
                # the spelling a user writes: model.<name>[i] where the place has one
                read = (
                    getattr(model, name)[at] if isinstance(at, int) else model.internals[name][at]
                )
                edit(read)
                box["after"] = model.internals[name][at].save()
                box["logits"] = model.logits.save()
            with model.trace(PROMPT):  # the same edit, written by assignment
                copy = model.internals[name][at].clone()
                edit(copy)
                model.internals[name][at] = copy
                box["assigned"] = model.logits.save()
            where = f"{family} {name}[{at}] {spelling}"
            row = model.internals[name].row
            if row.snapshot or row.write == "in_place" or row.scale or row.io.value == "input":
                # a read is a copy there: a value saved before keeps its value
                assert torch.equal(box["before"], clean), f"{where}: a saved read changed"
            want = clean.clone()
            edit(want)
            assert torch.equal(box["after"], want), f"{where}: the read after is not the edit"
            moved = (box["after"] - clean).abs().flatten(2).sum(-1) if clean.dim() > 2 else None
            if moved is not None and clean.shape[1] > 2:
                assert moved[:, [0, 1, *range(3, clean.shape[1])]].eq(0).all(), where
            assert torch.equal(box["logits"], box["assigned"]), f"{where}: not the assignment"
            if not torch.equal(want, clean):
                assert not torch.equal(box["logits"], clean_logits), f"{where}: edit dropped"


@pytest.mark.semantic
def test_the_mid_stream_edit_reaches_the_block_output_at_that_position_only(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    # layers_mid is read at the pre-MLP norm's input and a read there is a copy: the
    # edit must reach layers_output, by exactly the delta where the MLP does not see it
    model = tiny_model("tiny:llama", True)
    box: dict[str, Any] = {}
    with model.trace(PROMPT):
        box["out0"] = model.layers_output[1].save()
    with model.trace(PROMPT):
        box["mid"] = model.layers_mid[1].save()
        model.layers_mid[1][:, 2] += 0.5
        box["out"] = model.layers_output[1].save()
    with model.trace(PROMPT):
        mid = model.layers_mid[1].clone()
        mid[:, 2] += 0.5
        model.layers_mid[1] = mid
        box["want"] = model.layers_output[1].save()
    changed = (box["out"] - box["out0"]).abs().sum(-1)[0]
    assert changed[2] > 0 and changed[[0, 1, 3]].eq(0).all()
    assert torch.equal(box["out"], box["want"])
    assert box["mid"].abs().sum() > 0


@pytest.mark.semantic
def test_an_in_place_edit_in_several_invokes_and_generation_steps(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model("tiny:llama", True)
    box: dict[str, Any] = {}
    with model.trace() as tracer:
        with tracer.invoke(PROMPT):
            box["one"] = model.logits.save()
        with tracer.invoke(PROMPT):
            box["before"] = model.layers_mid[1].save()
            model.layers_mid[1][:, 2] += 0.5
            box["two"] = model.logits.save()
    clean, clean_logits = _clean(model, "layers_mid", 1)
    assert torch.equal(box["one"], clean_logits)
    assert torch.equal(box["before"], clean) and not torch.equal(box["two"], clean_logits)

    def run(edit: bool) -> list[Any]:
        steps: list[Any] = []  # made before the trace: a list built inside it is gone after
        with model.generate(PROMPT, max_new_tokens=3, do_sample=False) as tracer:
            for _ in tracer.iter[:]:
                if edit:
                    model.layers_mid[1][:, -1] *= 3.0
                else:
                    mid = model.layers_mid[1].clone()
                    mid[:, -1] *= 3.0
                    model.layers_mid[1] = mid
                steps.append(model.logits.save())
        return steps

    edited, assigned = run(True), run(False)
    assert len(edited) == len(assigned) == 3
    assert all(torch.equal(a, b) for a, b in zip(edited, assigned, strict=True))


@pytest.mark.semantic
def test_an_in_place_edit_that_cannot_reach_the_model_raises(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    from causalab_mini import EditRefused, WriteRefused

    model = tiny_model("tiny:llama", True)
    with pytest.raises(EditRefused, match=r"run past layers_mid\[1\].*model.layers_mid\[1\] = x"):
        with model.trace(PROMPT):
            mid = model.layers_mid[1]
            model.layers_output[1].save()
            mid[:, 2] += 0.5
    with pytest.raises(EditRefused, match="another invoke"):
        with model.trace() as tracer:
            barrier = tracer.barrier(2)  # how one invoke hands a value to another
            with tracer.invoke(PROMPT):
                mid = model.layers_mid[1]
                barrier()
            with tracer.invoke(PROMPT):
                barrier()
                mid.zero_()
    with pytest.raises(WriteRefused, match="read-only"):
        with model.trace(PROMPT):
            model.logits[:, -1] = 0.0
    box2: dict[str, Any] = {}
    with model.trace(PROMPT):
        box2["mid"] = model.layers_mid[1].save()
    saved = box2["mid"]
    saved.zero_()  # after the trace: a plain tensor of one's own
    assert saved.abs().sum() == 0 and type(saved * 2) is torch.Tensor


@pytest.mark.xfail(
    strict=True,
    reason="known, not yet mended: at a place held as the model's own tensor (no copy), "
    "an in-place edit of a second read edits the tensor a first read of the same place "
    "saved; an assignment there (model.layers_output[0] = x) leaves it",
)
def test_an_in_place_edit_keeps_an_earlier_read_of_the_same_place(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model("tiny:llama", True)
    box: dict[str, Any] = {}
    with torch.no_grad():
        with model.trace(PROMPT):
            box["clean"] = model.layers_output[0].save()
        with model.trace(PROMPT):
            box["kept"] = model.layers_output[0].save()
            edited = model.layers_output[0]
            edited.mul_(1.5)
            box["after"] = model.layers_input[1].save()
    torch.testing.assert_close(box["after"], box["clean"] * 1.5)  # the edit reached the model
    assert torch.equal(box["kept"], box["clean"])


@pytest.mark.semantic
def test_an_in_place_edit_is_certified_by_the_sweep_check(
    tiny_model: Callable[..., StandardizedTransformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from causalab_mini import edits
    from causalab_mini.tools import checks as k

    model = tiny_model("tiny:llama", True)
    read = {
        (comp, 1 if model.internals[row].per_layer else None): None
        for row, comp in k.row_components().items()
        if row in model.internals
    }
    ctx = k.Context(model, c.sample_inputs(model), {}, read)
    clean = list(k.in_place_edits(ctx))
    assert clean and all(o.ok for o in clean), clean
    assert "block_mid" in {o.components[0] for o in clean}
    # a read handed out as a bare copy: the edit is dropped, and the check says so
    monkeypatch.setattr(edits, "hand_out", lambda t, edit, owned=False: t)
    assert not all(o.ok for o in k.in_place_edits(ctx))


# ---------------------------------------------------------------- assignments


@pytest.mark.semantic
def test_an_assignment_on_the_model_writes_the_place_or_says_the_spelling(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model("tiny:llama", True)
    before = set(model.__dict__)
    for stmt, match in [
        ("model.embeddings_output = e", r"spelled model\.token_embeddings"),
        ("model.layers_mid = e", r"model\.layers_mid\[layer\] = v"),
        ("model.block_mid = e", r"model\.layers_mid\[layer\] = v"),
        ("model.attention_z = e", r"locate\(model, 'attention_z', layer\)"),
        ("model.layer_output = e", r"Did you mean layers_output"),
    ]:
        with pytest.raises(AttributeError, match=match):
            with model.trace(PROMPT):
                e = model.token_embeddings  # noqa: F841 - used by stmt
                exec(stmt)
    assert set(model.__dict__) == before, "a trace body set something on the model"
    clean = _clean(model, "embeddings_output", None)
    box: dict[str, Any] = {}
    with model.trace(PROMPT):  # a spelling and a whole-model place name both write
        model.token_embeddings = model.token_embeddings * 2
        box["a"] = model.logits.save()
    with model.trace(PROMPT):
        model.lm_head_output = model.lm_head_output() * 0
        box["b"] = model.logits.save()
    assert not torch.equal(box["a"], clean[1]) and box["b"].abs().sum() == 0
    assert set(model.__dict__) == before


# ---------------------------------------------------------------- order


@pytest.mark.parametrize(
    ("first", "then", "asked"),
    [
        (("layers_output", 1), ("layers_mid", 1), r"layers_mid\[1\] \(rank \(1, 33\)\)"),
        (("logits", None), ("lm_head_output", None), r"lm_head_output\(\) \(rank"),
    ],
)
def test_an_order_error_names_both_places_their_ranks_and_the_fix(
    first: tuple[str, int | None],
    then: tuple[str, int | None],
    asked: str,
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    from causalab_mini import compat

    OutOfOrderError = compat.out_of_order_error()  # nested in Mediator on 0.6/0.7
    assert OutOfOrderError is not None
    model = tiny_model("tiny:llama", True)
    later = model.internals.rank(*first)
    with pytest.raises(OutOfOrderError) as caught:
        with model.trace(PROMPT):
            model.internals[first[0]][first[1]].save()
            model.internals[then[0]][then[1]].save()
    text = str(caught.value)
    assert re.search(asked, text), text
    assert f"(rank {later})" in text and "forward order" in text and "Plan" in text
    assert "LlamaForCausalLM" in text


def _first_trace_cases() -> list[Any]:
    cases = [case.param() for case in model_types()]
    if not any("tiny:xlnet" == p.values[0] and not p.marks for p in cases):
        cases.append(pytest.param("tiny:xlnet", id="xlnet-first-trace"))
    return cases


def _everything(model: Any) -> list[tuple[tuple[int, int], str, Any]]:
    """Every available place and component of ``model``, in forward order."""
    from causalab_mini import ComponentError, locate
    from causalab_mini.generated import COMPONENTS

    internals = model.internals
    out: list[tuple[tuple[int, int], str, Any]] = []
    for name, place in internals.items():
        if place.row.io.value == "module":
            continue
        for at in range(internals.num_layers) if place.per_layer else [None]:
            if place.unavailable_on(at) is None:
                out.append((internals.rank(name, at), "place", (name, at)))
    for name, spec in COMPONENTS.items():
        for at in range(internals.num_layers) if spec.per_layer else [None]:
            try:
                address = locate(model, name, at)
            except (ComponentError, LookupError):
                continue
            out.append((address.rank, "component", address))
    out.sort(key=lambda item: (item[0], item[1]))
    return out


def _one_trace(model: Any, plan: list[tuple[tuple[int, int], str, Any]]) -> Any:
    from causalab_mini import read

    saved: list[Any] = []
    try:
        with model.trace(c.sample_inputs(model)):
            for _, kind, what in plan:
                if kind == "place":
                    saved.append(model.internals[what[0]][what[1]].save())
                else:
                    saved.append(read(model, what).save())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return saved


@pytest.mark.parametrize("spec", _first_trace_cases())
def test_the_first_trace_after_a_load_behaves_like_the_others(spec: str) -> None:
    model = StandardizedTransformer(spec, enable_attention_probs=True)  # a fresh load
    plan = _everything(model)
    first, second = _one_trace(model, plan), _one_trace(model, plan)
    if isinstance(second, str) or isinstance(first, str):
        assert first == second, f"first trace: {first}\nlater trace: {second}"
        return
    assert len(first) == len(second) == len(plan)
    for (_, _, what), a, b in zip(plan, first, second, strict=True):
        assert torch.equal(a, b), what


# ---------------------------------------------------------------- the root


def test_the_root_exports_what_the_readme_uses_and_no_module_shadows_a_function() -> None:
    import importlib
    import pkgutil

    import causalab_mini
    from causalab_mini import Plan, StandardizedTransformer, locate
    from causalab_mini.plan import Plan as PlanClass

    assert callable(locate) and not isinstance(locate, types.ModuleType)
    assert Plan is PlanClass and StandardizedTransformer.__name__ == "StandardizedTransformer"
    for error in (
        "PlaceUnavailable",
        "WriteRefused",
        "EditRefused",
        "PlaceOutOfOrder",
        "RenameError",
        "OperationNotFound",
        "ComponentError",
    ):
        assert issubclass(getattr(causalab_mini, error), BaseException), error
    submodules = {m.name for m in pkgutil.iter_modules(causalab_mini.__path__)}
    for name in submodules:  # imported: each binds itself on the package
        importlib.import_module(f"causalab_mini.{name}")
    assert not submodules & set(causalab_mini.__all__), submodules & set(causalab_mini.__all__)
    for name in causalab_mini.__all__:
        assert not isinstance(getattr(causalab_mini, name), types.ModuleType), name
    from causalab_mini import locate as again

    assert again is locate
