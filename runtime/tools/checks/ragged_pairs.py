"""The sweep's ragged-batch checks on encoder-decoders (``causalab_mini.seq2seq``):
pairs (source, decoder prefix) whose sources and prefixes differ in length, padded as
the runtime pads them (both on the right), each row equal to the pair run alone within
``ragged.RTOL`` relative on the decoder's places (the last block's output, reads at
positions counted in the decoder's input, a write at one decoder token) and on the
encoder's (the last encoder block's output, counted in the encoder's input); and the
interchange identity on pairs of different lengths, both ways."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.tools.checks.base import CheckResult
from causalab_mini.tools.checks.ragged import SPECS, relative, settled

DECODER = (
    "ragged pairs: each row's decoder block_output and reads at positions are the pair's alone"
)
ENCODER = "ragged pairs: each row's encoder output is the pair's alone (encoder frame)"
WRITE = "ragged pairs: a write at one decoder token gives each row its alone result"
SWAPPED = (
    "interchange on pairs of different lengths (both ways, decoder frame): the source's logits"
)

# the inputs a pair of texts makes (an encoder-decoder fed by text alone)
TEXT = {"input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"}

PAIRS = (
    ("The cat sat on the mat by the door", "The dog"),
    ("Hello, world!", "Rome is the capital of Italy"),
    ("Please open the window", "Good morning"),
)


def _alone(model: Any, pair: tuple[str, str], plan: Any) -> dict[Any, Any]:
    from causalab_mini.positions import encode

    return dict(plan.run(model, encode(model, [pair])))


def ragged_pairs(ctx: Any) -> Iterator[CheckResult]:
    """The checks of this module; one that raises is a failed outcome naming the error
    (the family's other components keep their certificates), never a crashed sweep."""
    try:
        yield from _ragged_pairs(ctx)
    except Exception as exc:
        detail = f"could not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        yield CheckResult.of(("block_output",), DECODER, False, detail)


def _ragged_pairs(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.padding import SIDES, unavailable_sides
    from causalab_mini.plan import Plan
    from causalab_mini.positions import encode, resolve
    from causalab_mini.seq2seq import DecoderInputMissing, is_encoder_decoder

    model = ctx.model
    if not is_encoder_decoder(model) or getattr(model, "tokenizer", None) is None:
        return
    if ("block_output", ctx.n - 1) not in ctx.addresses or set(ctx.inputs) - TEXT:
        return  # (an encoder that reads an image or audio: pairs of texts do not feed it)
    if len(unavailable_sides(model)) == len(SIDES):
        return  # the family refuses ragged batches, with the measured reason
    try:
        out = locate(model, "block_output", ctx.n - 1)
        reads = [locate(model, "block_output", ctx.n - 1, position=s) for s in SPECS]
        encoded = encode(model, list(PAIRS))
    except (ComponentError, DecoderInputMissing):
        # a refused place, or a decoder whose start token is no config fact (PLBart
        # starts each row from its own language id): pairs of texts are refused there,
        # with the reason, and a caller gives decoder_input_ids
        return
    plan = Plan.of([out, *reads])

    def measure() -> float:
        batch = plan.run(model, encoded)
        errors = []
        for r, pair in enumerate(PAIRS):
            alone = _alone(model, pair, plan)
            real = encoded.inputs["decoder_attention_mask"][r].bool()
            errors.append(relative(batch[out][r][real], alone[out][0]))
            errors += [relative(batch[a][r : r + 1], alone[a]) for a in reads]
        return float(max(errors))

    ok, detail = settled(model, measure)
    yield CheckResult.of(("block_output",), DECODER, ok, detail)
    yield from _encoder(ctx, encoded, resolve)
    yield from _write(ctx, encoded)
    yield from _swapped(ctx)


def _encoder(ctx: Any, encoded: Any, resolve: Any) -> Iterator[CheckResult]:
    from causalab_mini.positions import encode, stacked, take, trace_inputs

    model = ctx.model
    if "encoder_layers_output" not in model.internals:
        return
    place = model.internals["encoder_layers_output"]
    if place.unavailable_on(0) is not None:
        return
    index = stacked(resolve(model, encoded, {"index": -1}, stack="encoder"), {"index": -1})

    def measure() -> float:
        with model.trace(trace_inputs(model, encoded)):
            whole = place.read(0).save()
        errors = []
        for r, pair in enumerate(PAIRS):
            one = encode(model, [pair])
            with model.trace(trace_inputs(model, one)):
                alone = place.read(0).save()
            n = int(encoded.inputs["attention_mask"][r].sum())
            # (the real tokens of each: LED pads its encoder's input to its window)
            errors.append(relative(whole[r, :n], alone[0, :n]))
            at = stacked(resolve(model, one, {"index": -1}, stack="encoder"), {"index": -1})
            errors.append(relative(take(whole, index, 1)[r : r + 1], take(alone, at, 1)))
        return float(max(errors))

    ok, detail = settled(model, measure)
    yield CheckResult.of(("block_output",), ENCODER, ok, detail)


def _write(ctx: Any, encoded: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.plan import Plan
    from causalab_mini.positions import encode

    model = ctx.model
    layer = min(1, ctx.n - 1)
    if not ctx.have("block_input", layer=layer):
        return
    try:
        at = locate(model, "block_input", layer, position={"index": 1})
        after = locate(model, "block_output", layer)
    except ComponentError:
        return
    width = ctx.v[("block_input", layer)].shape[-1]
    import torch

    def measure() -> float:
        dtype = next(model._model.parameters()).dtype
        value = torch.ones((len(PAIRS), 1, width), dtype=dtype)
        written = Plan.of([after], [(at, value)]).run(model, encoded)[after]
        errors = []
        for r, pair in enumerate(PAIRS):
            one = encode(model, [pair])
            single = Plan.of([after], [(at, value[r : r + 1])]).run(model, one)[after]
            keep = encoded.inputs["decoder_attention_mask"][r].bool()
            errors.append(relative(written[r][keep], single[0]))
        return float(max(errors))

    ok, detail = settled(model, measure)
    yield CheckResult.of(("block_input",), WRITE, ok, detail)


def _swapped(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.interchange import interchange
    from causalab_mini.tools.certify import close

    model = ctx.model
    if model.resolution.checks.interchange_unavailable is not None:
        return
    try:
        last = locate(model, "block_output", ctx.n - 1, position={"anchor": "last"})
    except ComponentError:
        return
    bases, sources = [PAIRS[0], PAIRS[1]], [PAIRS[1], PAIRS[0]]
    result = interchange(model, [last], bases, sources, return_sources=True)
    ok, err = close(result.logits, result.sources[0].logits)
    yield CheckResult.of(("block_output",), SWAPPED, ok, err)


__all__ = ["ragged_pairs"]
