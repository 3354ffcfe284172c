"""Ragged batches (issue 32): a row of a batch of rows of different lengths is computed
as it would be alone, on every family, or refused before it runs. Tiny BART's decoder
counts its learned positions over the padded width (the family file's
left_padding_unavailable, measured by the sweep's ragged-batch check), so it is padded
on the right, and left padding is refused there; GPT-2 and Llama hold on both sides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import compat
from causalab_mini import positions as P
from causalab_mini.components import Plan, locate
from causalab_mini.errors import CausalabError
from causalab_mini.model import StandardizedTransformer
from causalab_mini.padding import PaddingRefused, unavailable_sides
from causalab_mini.tools.checks import ragged
from causalab_mini.tools.checks.base import Context

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

Load = Callable[..., StandardizedTransformer]
TEXTS = ["The cat sat on the mat by the door", "Hello, world!", "Rome is the capital"]


def _rows_as_alone(model: Any, side: str | None = None) -> float:
    last = locate(model, "block_output", model.num_layers - 1)
    encoded = P.encode(model, TEXTS, padding_side=side)
    got = Plan.of([last]).run(model, encoded)[last]
    worst = 0.0
    for r, text in enumerate(TEXTS):
        alone = Plan.of([last]).run(model, P.encode(model, [text]))[last][0]
        real = encoded.inputs["attention_mask"][r].bool()
        worst = max(worst, ragged.relative(got[r][real], alone))
    return worst


def test_a_family_that_ignores_position_ids_pads_on_the_right(tiny_model: Load) -> None:
    model = tiny_model("tiny:bart")
    assert "left" in unavailable_sides(model)
    assert model.tokenizer.padding_side == "right"
    assert _rows_as_alone(model) <= ragged.RTOL
    with pytest.raises(PaddingRefused, match="left padding: measured"):
        P.encode(model, TEXTS, padding_side="left")
    # rows of one length need no padding and take either side
    P.encode(model, [TEXTS[1], TEXTS[1]], padding_side="left")


def test_a_left_padded_id_batch_is_refused_where_the_family_cannot_pad_there(
    tiny_model: Load,
) -> None:
    model = tiny_model("tiny:bart")
    ids = dict(model.tokenizer(TEXTS, padding=True, padding_side="left", return_tensors="pt"))
    at = locate(model, "block_output", 0, position={"index": -1})
    with pytest.raises(PaddingRefused, match="padded on the left"):
        Plan.of([at]).run(model, ids)


def test_generate_refuses_a_ragged_batch_the_family_cannot_left_pad(tiny_model: Load) -> None:
    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight>=0.8")
    model = tiny_model("tiny:bart")
    last = locate(model, "block_output", 0, position={"index": -1})
    with pytest.raises(CausalabError, match="left padding"):
        Plan.of([last]).generate(model, TEXTS, max_new_tokens=2, do_sample=False)


@pytest.mark.parametrize("spec", ["tiny:gpt2", "tiny:llama"])
def test_families_that_count_from_position_ids_hold_on_both_sides(
    spec: str, tiny_model: Load
) -> None:
    model = tiny_model(spec)
    assert unavailable_sides(model) == {}
    for side in ("left", "right"):
        assert _rows_as_alone(model, side) <= ragged.RTOL


def _outcomes(model: Any) -> dict[str, tuple[bool, str]]:
    addresses = {("block_output", model.num_layers - 1): object(), ("block_input", 1): object()}
    with model.trace("The quick brown fox"):
        held = model.layers_input[1].save()
    ctx = Context(
        model=model,
        inputs={"input_ids": torch.zeros(1, 3, dtype=torch.long)},
        addresses=addresses,
        v={("block_input", 1): held},
    )
    found = list(ragged.ragged_batches(ctx)) + list(ragged.ragged_interchange(ctx))
    return {o.description: (o.ok, o.detail) for o in found}


def test_the_sweep_check_measures_the_refusal_and_fails_without_it(
    tiny_model: Load, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model("tiny:bart")
    held = _outcomes(model)
    assert all(ok for ok, _ in held.values()), held
    assert ragged.REFUSED.format(side="left") in held
    # without the family's fact the left side is measured, and fails: a padded row's
    # block_output is not the row's alone
    monkeypatch.setattr("causalab_mini.padding.unavailable_sides", lambda m: {})
    bare = _outcomes(model)
    ok, detail = bare[ragged.MEASURED.format(side="left")]
    assert not ok and "max relative error" in detail


def test_the_sweep_check_passes_both_sides_on_gpt2(tiny_model: Load) -> None:
    held = _outcomes(tiny_model("tiny:gpt2"))
    for side in ("left", "right"):
        for name in (ragged.MEASURED, ragged.READS, ragged.WRITES):
            assert held[name.format(side=side)][0], held
    assert held[ragged.SWAPPED][0], held


def test_the_docs_list_every_family_refused_on_a_side() -> None:
    """docs/positions.md's table of refused sides is the registry's (families whose file
    says left_padding_unavailable or right_padding_unavailable)."""
    from pathlib import Path

    from causalab_mini.generated import FAMILIES

    text = (Path(__file__).resolve().parents[1] / "docs" / "positions.md").read_text()
    table = text.split("<!-- padding-refusals -->", 1)[1].strip().split("\n\n", 1)[0]
    rows = {
        tuple(cell.strip() for cell in line.strip("|").split("|"))
        for line in table.splitlines()[2:]
    }
    want = {
        (name, side)
        for name, family in FAMILIES.items()
        for side in ("left", "right")
        if getattr(family.forward, f"{side}_padding_unavailable", None)
    }
    assert rows == want
