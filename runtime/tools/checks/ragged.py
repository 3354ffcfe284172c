"""The sweep's ragged-batch checks: a row of a batch of rows of different lengths is
computed as it would be alone, on each padding side, or the family refuses that side
(``left_padding_unavailable`` / ``right_padding_unavailable`` in its file, which these
checks measure: a refusal that does not hold is a failure too).

Per side, three rows of different lengths padded there:
- measured: the last block's output at every real token of each row, run as the
  trace's own batch with ``position_ids`` counted from each row's first real token,
  equals the row run alone within ``RTOL`` relative (max |a-b| / max |alone|);
- where the side is not refused: reads at positions (``{"index": 0}``,
  ``{"index": -1}``, ``{"anchor": "last"}``) are the row's alone, and a write at one
  token gives each row what the same write gives the row alone;
- where it is refused: ``positions.encode`` refuses the batch on that side.
And the interchange identity "the last block's output at the last token gives the
source's logits" on pairs whose base and source differ in length, both ways."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.tools.checks.base import CheckResult
from causalab_mini.tools.checks.positions import SENTENCES, text_fed

RTOL = 1e-5  # relative to the largest value of the row alone

MEASURED = "ragged batch, {side} padding: each row's block_output is the row's alone"
REFUSED = "ragged batch, {side} padding: refused where a row is not as alone"
READS = "ragged batch, {side} padding: reads at positions are the row's alone"
WRITES = "ragged batch, {side} padding: a write at one token gives each row its alone result"
SWAPPED = "interchange on pairs of different lengths (both ways): the source's logits"

SIDES = ("left", "right")
SPECS = ({"index": 0}, {"index": -1}, {"anchor": "last"})


def relative(got: Any, alone: Any) -> float:
    """max |got - alone| / max |alone| (0 where both are zero)."""
    scale = float(alone.detach().abs().max())
    worst = float((got.detach().float() - alone.detach().float()).abs().max())
    return worst / scale if scale else worst


# float32 rounding in a row, measured against the same row in float64: a padding
# error stays when the weights are float64, rounding goes
EXACT = 1e-12


def settled(model: Any, measure: Any) -> tuple[bool, str]:
    """``measure()`` (the worst relative error of rows in a batch against the rows
    alone) within ``RTOL``; where it is over, measured again with the model's weights
    in float64 (restored after: float32 -> float64 -> float32 is exact): a padding
    error stays there, float32 rounding (large activations: the moved build's scaled
    weights, a family that does not scale its attention logits) goes. (ok, detail)."""
    worst = measure()
    if worst <= RTOL:
        return True, f"max relative error {worst:.3g}"
    exact = in_float64(model, measure)
    if exact is not None and exact <= EXACT:
        return True, (
            f"max relative error {worst:.3g} in float32 and {exact:.1g} with the weights in "
            "float64: rounding, not padding"
        )
    more = "" if exact is None else f" ({exact:.3g} with the weights in float64)"
    return False, f"max relative error {worst:.3g}{more}"


def in_float64(model: Any, measure: Any) -> float | None:
    """``measure()`` with the model's weights and buffers in float64, then as they were;
    None where the model is not all float32 (nothing to compare with)."""
    import torch

    module = getattr(model, "_model", model)
    floats = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if floats != {torch.float32}:
        return None
    module.to(torch.float64)
    try:
        return float(measure())
    finally:
        module.to(torch.float32)


def ragged_texts(model: Any, count: int = 3) -> list[str] | None:
    """``count`` sentences of the corpus with different numbers of tokens under the
    model's tokenizer (as it tokenizes a row alone), or None where there are not as
    many lengths."""
    from causalab_mini.positions import encode

    by: dict[int, str] = {}
    for text in SENTENCES:
        n = int(encode(model, [text]).inputs["input_ids"].shape[1])
        by.setdefault(n, text)
    if len(by) < count:
        return None
    lengths = sorted(by)
    picks = [lengths[0], lengths[len(lengths) // 2], lengths[-1]][:count]
    return [by[n] for n in picks]


def _raw_batch(model: Any, texts: list[str], side: str) -> tuple[dict[str, Any], Any]:
    """The rows padded on ``side`` as the trace receives them (position ids counted from
    each row's first real token), without the runtime's choice of side: what the
    family's forward makes of that padding."""
    import torch

    from causalab_mini.positions import Encoded, position_ids_of, trace_inputs

    tokenizer = model.tokenizer
    batch = tokenizer(texts, padding=True, padding_side=side, return_tensors="pt")
    mask = batch["attention_mask"]
    inputs = {
        "input_ids": batch["input_ids"],
        "attention_mask": mask,
        "position_ids": position_ids_of(mask),
    }
    fed = trace_inputs(model, Encoded(inputs=inputs, frames=()))
    return fed, mask.bool() if isinstance(mask, torch.Tensor) else mask


def _whole(model: Any, address: Any, inputs: Any) -> Any:
    from causalab_mini.plan import Plan

    return Plan.of([address]).run(model, inputs)[address]


def ragged_batches(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.padding import PaddingRefused, unavailable_sides
    from causalab_mini.positions import encode

    if not text_fed(ctx) or ("block_output", ctx.n - 1) not in ctx.addresses:
        return
    model = ctx.model
    texts = ragged_texts(model) if getattr(model, "tokenizer", None) is not None else None
    if texts is None:
        return
    try:
        out = locate(model, "block_output", ctx.n - 1)
        layer = min(1, ctx.n - 1)
        written_at = locate(model, "block_input", layer, position={"index": 1})
        after = locate(model, "block_output", layer)
        reads = [locate(model, "block_output", layer, position=spec) for spec in SPECS]
    except ComponentError:
        return
    alone = [_whole(model, out, encode(model, [t])) for t in texts]
    refused = unavailable_sides(model)
    for side in SIDES:
        fed, real = _raw_batch(model, texts, side)
        got = _whole(model, out, fed)
        worst = max(relative(got[r][real[r]], alone[r][0]) for r in range(len(texts)))
        lengths = [int(m.sum()) for m in real]
        detail = f"max relative error {worst:.3g} over rows of {lengths} tokens"
        if side in refused:
            try:
                encode(model, texts, padding_side=side)
                said = False
            except PaddingRefused:
                said = True
            ok = worst > RTOL and said
            name = REFUSED.format(side=side)
            yield CheckResult.of(("block_output",), name, ok, f"{detail}; refused={said}")
            continue
        yield CheckResult.of(("block_output",), MEASURED.format(side=side), worst <= RTOL, detail)
        yield from _at_positions(ctx, texts, side, reads, (written_at, after, layer))


def _at_positions(
    ctx: Any, texts: list[str], side: str, reads: list[Any], write: tuple[Any, Any, int]
) -> Iterator[CheckResult]:
    """Reads at positions, and a write at one token, on the rows padded on ``side``
    (the runtime's own batch), each row against the row alone."""
    from causalab_mini.plan import Plan
    from causalab_mini.positions import encode

    model = ctx.model
    encoded = encode(model, texts, padding_side=side)
    batch = Plan.of(reads).run(model, encoded)
    errs = []
    for r, text in enumerate(texts):
        single = Plan.of(reads).run(model, encode(model, [text], padding_side=side))
        errs += [relative(batch[a][r : r + 1], single[a]) for a in reads]
    detail = f"max relative error {max(errs):.3g}"
    yield CheckResult.of(("block_output",), READS.format(side=side), max(errs) <= RTOL, detail)
    written_at, after, layer = write
    if not ctx.have("block_input", layer=layer):
        return
    value = batch[reads[0]].new_ones((len(texts), 1, ctx.v[("block_input", layer)].shape[-1]))
    written = Plan.of([after], [(written_at, value)]).run(model, encoded)[after]
    werrs = []
    for r, text in enumerate(texts):
        one = encode(model, [text], padding_side=side)
        single = Plan.of([after], [(written_at, value[r : r + 1])]).run(model, one)[after]
        keep = encoded.inputs["attention_mask"][r].bool()
        werrs.append(relative(written[r][keep], single[0]))
    detail = f"max relative error {max(werrs):.3g}"
    yield CheckResult.of(("block_input",), WRITES.format(side=side), max(werrs) <= RTOL, detail)


def ragged_interchange(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.interchange import interchange
    from causalab_mini.padding import PaddingRefused

    if not text_fed(ctx) or ("block_output", ctx.n - 1) not in ctx.addresses:
        return
    model = ctx.model
    if model.resolution.checks.interchange_unavailable is not None:
        return  # the family file says why (docs/families.md)
    if getattr(model, "tokenizer", None) is None:
        return
    texts = ragged_texts(model, 2)
    if texts is None:
        return
    try:
        last = locate(model, "block_output", ctx.n - 1, position={"anchor": "last"})
    except ComponentError:
        return
    short, long = texts
    try:
        result = interchange(model, [last], [short, long], [long, short], return_sources=True)
    except PaddingRefused as exc:  # neither side exact: the refusal is the outcome
        yield CheckResult.refused(("block_output",), SWAPPED, f"refused: {exc}")
        return
    from causalab_mini.tools.certify import close

    ok, err = close(result.logits, result.sources[0].logits)
    yield CheckResult.of(("block_output",), SWAPPED, ok, err)


__all__ = ["ragged_batches", "ragged_interchange", "ragged_texts", "relative"]
