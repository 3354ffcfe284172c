"""Patching grids (``causalab_mini.interchange.grid``): every cell equals the one-cell
interchange of the same pair on ragged pairs (rows of different lengths), both engines
give the same grid, the sources run once, a cell's patch changes what comes after, a
layer the family lacks is left out with its reason, bad positions are refused
before anything runs, and a token budget per forward changes no cell (beyond float rounding), and the
forwards compute the logits at the columns the cells read only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import locate
from causalab_mini.errors import CausalabError
from causalab_mini.hooks import dispatched
from causalab_mini.interchange import grid, interchange
from causalab_mini.patching import CPU_BATCH_TOKENS, rows_per_forward
from causalab_mini.positions import PositionError, encode

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

# rows of different lengths, so padding enters every batch
BASES = ["The cat sat on the mat today", "A dog ran far", "Birds fly south in the winter"]
SOURCES = ["The dog sat on a rug here", "A cat ran fast", "Fish swim north in summer"]
SPECS = [{"index": 0}, {"index": 1}, {"index": -1}]


@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])  # a BOS, and none
def test_every_cell_is_the_one_cell_interchange(spec: str, tiny_model: Callable[..., Any]) -> None:
    model = tiny_model(spec)
    layers = list(range(model.internals.num_layers))
    by_engine = {}
    for engine in ("nnsight", "hooks"):
        result = grid(
            model, "block_output", layers, SPECS, BASES, SOURCES, engine=engine, batch_size=4
        )
        assert result.logits.shape[:3] == (len(layers), len(SPECS), len(BASES))
        # one forward for the sources, then ceil(9 cells / 4) per layer
        assert result.forwards == 1 + len(layers) * 3
        moved = 0
        for li, layer in enumerate(result.layers):
            for pi, position in enumerate(result.positions):
                address = locate(model, "block_output", layer, position=position)
                one = interchange(model, [address], BASES, SOURCES, engine=engine)
                cell = result.logits[li, pi]
                torch.testing.assert_close(cell, one.logits.detach(), rtol=1e-6, atol=1e-6)
                moved += int(not torch.allclose(cell, result.base_logits.detach()))
        assert moved > 0, "no cell changed the base's logits: the patch reached nothing"
        by_engine[engine] = result.logits
    assert torch.equal(by_engine["nnsight"], by_engine["hooks"])


def test_the_last_layer_at_the_last_token_gives_the_source(
    tiny_model: Callable[..., Any],
) -> None:
    model = tiny_model("tiny:llama")
    last = model.internals.num_layers - 1
    result = grid(model, "block_output", [last], [{"index": -1}], BASES, SOURCES)
    torch.testing.assert_close(
        result.logits[0, 0], result.source_logits.detach(), rtol=1e-5, atol=1e-5
    )


def test_a_metric_per_cell_and_a_layer_the_family_lacks(
    tiny_model: Callable[..., Any],
) -> None:
    model = tiny_model("tiny:gpt_neox")  # parallel blocks: no mid-stream
    target = torch.tensor([5, 7, 9])

    def logprob(logits: Any, pairs: Any) -> Any:
        return torch.log_softmax(logits, -1)[torch.arange(len(pairs)), target[pairs]]

    result = grid(model, "block_mid", [0, 1], "all", BASES[:2], SOURCES[:2], metric=logprob)
    assert result.layers == () and set(result.refused) == {0, 1}
    assert "parallel" in result.refused[0]
    result = grid(model, "block_input", [1], "all", BASES[:2], SOURCES[:2], metric=logprob)
    assert result.logits is None and result.values.shape == (1, len(result.positions), 2)
    assert torch.isfinite(result.values).all()


def test_bad_positions_are_refused_before_anything_runs(
    tiny_model: Callable[..., Any],
) -> None:
    model = tiny_model("tiny:llama")
    with pytest.raises(PositionError, match="one token"):
        grid(model, "block_output", [0], [{"span": "sat on"}], BASES[:1], SOURCES[:1])
    with pytest.raises(PositionError, match=r"list of position specs"):
        grid(model, "block_output", [0], {"index": 0}, BASES, SOURCES)
    with pytest.raises(PositionError, match="one source per base"):
        grid(model, "block_output", [0], "all", BASES, SOURCES[:1])
    with pytest.raises(CausalabError, match="batch_size"):
        grid(model, "block_output", [0], "all", BASES, SOURCES, batch_size=0)


def test_a_token_budget_bounds_each_forward_and_changes_no_cell(
    tiny_model: Callable[..., Any],
) -> None:
    model = tiny_model("tiny:llama")
    length = int(encode(model, [*BASES, *SOURCES]).inputs["input_ids"].shape[1])
    # 9 cells a layer: batch_size alone, then 2 rows' worth of tokens a forward
    whole = grid(model, "block_output", [0, 1], SPECS, BASES, SOURCES, engine="hooks")
    assert whole.forwards == 1 + 2
    budget = grid(
        model,
        "block_output",
        [0, 1],
        SPECS,
        BASES,
        SOURCES,
        engine="hooks",
        batch_tokens=2 * length + 1,
    )
    assert budget.forwards == 1 + 2 * 5
    # the cells are the same; the unembedding's matrix product runs on another number
    # of rows (the forwards keep the logits of the last column only), which may move
    # the last bits (measured: 1.9e-07 on logits of magnitude 0.6)
    torch.testing.assert_close(budget.logits, whole.logits, rtol=0, atol=1e-6)
    # a budget below one row still runs a row a forward
    assert rows_per_forward(model, length, 64, 1) == 1
    assert rows_per_forward(model, length, 4, 10**6) == 4
    # on CPU the default budget is CPU_BATCH_TOKENS
    assert rows_per_forward(model, 128, 64, None) == CPU_BATCH_TOKENS // 128
    # balanced: 96 cells at 44 rows a forward are three forwards of 32
    assert rows_per_forward(model, 23, 44, None, 96) == 32
    assert rows_per_forward(model, 23, 64, None, 5) == 5
    with pytest.raises(CausalabError, match="batch_tokens"):
        grid(model, "block_output", [0], "all", BASES, SOURCES, batch_tokens=0)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("spec", ["tiny:llama", "tiny:gpt2"])
def test_the_forwards_unembed_only_the_columns_the_cells_read(
    spec: str, side: str, tiny_model: Callable[..., Any]
) -> None:
    """Each forward computes logits at the batch's last columns only, as many as reach
    back to the earliest row's last token (one where the batch is padded on the left),
    and every cell is still its one-cell interchange: the column each row reads is
    found among those kept on either padding side."""
    model = tiny_model(spec)
    dispatched(model)  # the real modules (dispatch replaces the meta ones)
    before = model.tokenizer.padding_side
    model.tokenizer.padding_side = side
    try:
        _unembeds_the_columns_read(model, side)
    finally:
        model.tokenizer.padding_side = before


def _unembeds_the_columns_read(model: Any, side: str) -> None:
    encoded = encode(model, [*BASES, *SOURCES])
    mask = encoded.inputs["attention_mask"]
    assert bool((mask[:, 0] if side == "right" else mask[:, -1]).all())
    width = int(encoded.inputs["input_ids"].shape[1])
    earliest = min(f.real[-1] for f in encoded.frames)
    columns: list[int] = []
    head = model._model.get_output_embeddings()
    handle = head.register_forward_hook(lambda _m, _a, out: columns.append(int(out.shape[1])))
    try:
        result = grid(model, "block_output", [1], SPECS, BASES, SOURCES, engine="hooks")
    finally:
        handle.remove()
    assert columns == [width - earliest] * result.forwards
    assert columns[0] < width, "every column was unembedded"
    assert (columns[0] == 1) == (side == "left")
    for pi, position in enumerate(result.positions):
        address = locate(model, "block_output", 1, position=position)
        one = interchange(model, [address], BASES, SOURCES, engine="hooks")
        torch.testing.assert_close(result.logits[0, pi], one.logits, rtol=1e-6, atol=1e-6)
