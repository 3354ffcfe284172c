"""Interiors of families whose attention computes in its own forward (families/*.yaml,
interiors and operands): every such family's query, key, scores and z certify by the
same interior checks as the shared attention function's, and those checks fail when
the query is wrong or an operand the family states (a scaling, a bias) is left out.
The families come from the generated tables."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from causalab_mini.generated import FAMILY_INTERIORS, FAMILY_OPERANDS, INTERIORS
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c
from causalab_mini.tools.sweep import Result

from .registry_cases import family_cases

# the families whose interiors are calls of their own (not only a note on the default's)
OWN = {
    family
    for family, interiors in FAMILY_INTERIORS.items()
    for name, interior in interiors.items()
    if (interior.needles, interior.module) != (INTERIORS[name].needles, INTERIORS[name].module)
}
INLINE = [case.param(case, id=case.model_type) for f, case in family_cases() if f in OWN]
# (case, operand) for every scaling or bias a family states
STATED = [
    case.param(case, name, id=f"{case.model_type}-{name}")
    for f, case in family_cases()
    if f in FAMILY_OPERANDS
    for name in FAMILY_OPERANDS[f]
    if name in ("scaling", "bias")
]

pytestmark = [pytest.mark.slow, pytest.mark.semantic]
INTERIOR_NAMES = ("attention_query", "attention_key", "attention_scores", "attention_z")


def test_the_inline_families_are_found() -> None:
    assert {"bloom", "gpt_neo"} <= OWN
    assert INLINE and STATED


@pytest.mark.parametrize("case", INLINE)
def test_an_inline_familys_interiors_certify(
    case: object, certified: Callable[[str], Result]
) -> None:
    result = certified(case.spec)  # type: ignore[attr-defined]
    assert result.outcome == "certified", result.reason
    for name in INTERIOR_NAMES:
        item = result.components[name]
        assert item["state"] == "ok", (name, item)
    assert (
        "softmax(attention_scores) == attention_probs"
        in result.components["attention_scores"]["checks"]
    )
    assert "attention_z == attention_probs · V" in result.components["attention_z"]["checks"]
    assert any("q·kᵀ" in check for check in result.components["attention_query"]["checks"])


def _interior_values(model: StandardizedTransformer, layer: int) -> tuple[dict, dict, dict]:
    from causalab_mini.components import Plan, locate
    from causalab_mini.tools.checks import recompute

    inputs = c.sample_inputs(model)
    names = [*INTERIOR_NAMES, "attention_probs"]
    addresses = {(n, layer): locate(model, n, layer) for n in names}
    out = Plan.of(reads=addresses.values()).run(model, inputs)
    values = {key: out[a] for key, a in addresses.items()}
    raw = recompute.raw_outputs_of(model, inputs, addresses)
    return addresses, values, raw


def _qk_ok(model: StandardizedTransformer, values: dict, raw: dict, layer: int) -> list[bool]:
    from causalab_mini.tools.checks import recompute

    return [
        o.ok
        for o in recompute.interior_checks(model, values, raw, layer)
        if "attention_query" in o.components
    ]


@pytest.mark.parametrize("case", INLINE)
def test_a_wrong_query_fails_the_check(
    case: object, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = tiny_model(case.spec, probs=True)  # type: ignore[attr-defined]
    _, values, raw = _interior_values(model, 1)
    assert _qk_ok(model, values, raw, 1) == [True]
    tampered = {**values, ("attention_query", 1): values[("attention_query", 1)] * 1.1}
    assert _qk_ok(model, tampered, raw, 1) == [False]


@pytest.mark.parametrize(("case", "operand"), STATED)
def test_a_stated_operand_left_out_fails_the_check(
    case: object, operand: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    model = tiny_model(case.spec, probs=True)  # type: ignore[attr-defined]
    _, values, raw = _interior_values(model, 1)
    assert (operand, 1) in raw
    without = {k: v for k, v in raw.items() if k != (operand, 1)}
    assert _qk_ok(model, values, without, 1) == [False]


# every interior of every inline family; in the README's tier the first family only
WRITES = [
    pytest.param(
        p.values[0],
        name,
        id=f"{p.id}-{name}",
        marks=[] if i == 0 else [pytest.mark.wide],
    )
    for i, p in enumerate(INLINE)
    for name in INTERIOR_NAMES
]


@pytest.mark.parametrize(("case", "name"), WRITES)
def test_a_write_at_an_inline_interior_reads_back_and_reaches_the_output(
    case: object, name: str, tiny_model: Callable[..., StandardizedTransformer]
) -> None:
    # a write goes through the family's own call site (an argument, or a tuple or list
    # the call returns) and changes what the block hands on
    import torch

    from causalab_mini.components import Plan, locate

    model = tiny_model(case.spec, probs=True)  # type: ignore[attr-defined]
    inputs = c.sample_inputs(model)
    here, out = locate(model, name, 1), locate(model, "block_output", 1)
    earlier = locate(model, "block_input", 1)  # read before the write: keeps its value
    before = Plan.of(reads=[earlier, here, out]).run(model, inputs)
    value = before[here] * 0.5
    after = Plan.of(reads=[earlier, here, out], writes=[(here, value)]).run(model, inputs)
    assert torch.equal(after[here], value)
    assert torch.equal(after[earlier], before[earlier])
    assert not torch.allclose(after[out], before[out])
