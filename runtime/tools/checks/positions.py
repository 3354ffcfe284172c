"""The sweep's checks of positions and interchange interventions, on real tensors of
every architecture the text frame feeds (a model whose forward needs inputs beside the
token ids, a drafter's target states, or ids of another shape than the tokenizer's,
Kyutai-STT's text token and audio codes per position, is fed by ``sample_inputs`` and
not by text: these checks do not apply there, and say nothing).

- a read at ``{"index": -1}`` is the last content token of the whole read, per row;
- a write at one token of ``block_input`` changes ``block_output`` of that layer at
  that token and after it, never before, and a read saved before it keeps its value;
- every content token of the first block's input moved from a source reproduces the
  source's logits, and the last block's output at the last token reproduces the
  source's last-token logits (``causalab_mini.interchange``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.tools.certify import ATOL, close
from causalab_mini.tools.checks.base import CheckResult

# sentences of the tiny tokenizer's corpus; pairs of as many tokens are found per model
SENTENCES = (
    "The cat sat on the mat",
    "The dog slept by the door",
    "Rome is the capital of Italy",
    "Berlin is the capital of Germany",
    "Good morning! Good night.",
    "Hello, world! How are you?",
    "The weather is nice today",
    "She said that he would come",
    "Please open the window",
    "They were happy because",
    "The quick brown fox",
    "Every layer adds an update",
)

READ = "a read at {'index': -1} is each row's last content token of the whole read"
WRITE = "a write at one token changes block_output there and after, never before"
WRITE_AHEAD = "a write at one token changes block_output there (a family that attends ahead)"
ALL_TOKENS = "interchange: every token of block_input[0] from the source gives its logits"
LAST_TOKEN = "interchange: block_output[last] at the last token gives the source's logits there"


def text_fed(ctx: Any) -> bool:
    """Whether the model's forward runs on text alone: no side inputs, and token ids
    of the tokenizer's shape, (batch, seq) (not a text token and audio codes per
    position, a side input of the ids themselves)."""
    ids = ctx.inputs.get("input_ids")
    return set(ctx.inputs) <= {"input_ids", "attention_mask"} and getattr(ids, "ndim", 2) == 2


def equal_length_pairs(
    model: Any, texts: tuple[str, ...] | list[str] = SENTENCES
) -> tuple[list[str], list[str]] | None:
    """(bases, sources): pairs of ``texts`` with as many content tokens under the
    model's tokenizer (the first two of each length), or None where no two have."""
    from causalab_mini.positions import resolve

    by: dict[int, list[str]] = {}
    for text in texts:
        by.setdefault(len(resolve(model, [text], "all")[0]), []).append(text)
    pairs = [(v[0], v[1]) for v in by.values() if len(v) >= 2]
    if not pairs:
        return None
    bases, sources = zip(*pairs, strict=True)
    return list(bases), list(sources)


def position_reads_and_writes(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.plan import Plan
    from causalab_mini.positions import encode, put, resolve, stacked, take

    if not text_fed(ctx) or ("block_input", 0) not in ctx.addresses:
        return
    model = ctx.model
    layer = min(1, ctx.n - 1)
    texts = list(SENTENCES[:2])
    try:
        last = locate(model, "block_output", layer, position={"index": -1})
        whole = locate(model, "block_output", layer)
        at = locate(model, "block_input", layer, position={"index": 2})
        place = locate(model, "block_input", layer)
        earlier = locate(model, "block_input", 0)
    except ComponentError:
        return
    clean = Plan.of([earlier, place, whole, last]).run(model, texts)
    index = stacked(resolve(model, texts, last.position), last.position)
    ok, err = close(clean[last], take(clean[whole], index, 1))
    yield CheckResult.of(("block_output",), READ, ok, err)
    value = clean[place].new_ones((len(texts), 1, clean[place].shape[-1]))
    written = Plan.of([earlier, place, whole], [(at, value)]).run(model, texts)
    where = stacked(resolve(model, texts, at.position), at.position)
    kept = bool((written[earlier] == clean[earlier]).all())
    back = bool((written[place] == put(clean[place], where, 1, value)).all())
    # padding is no token of the text (a fully masked query's output is the kernel's
    # to choose): the real tokens before the written one must not move
    real = encode(model, texts).inputs["attention_mask"].bool()
    moved = (written[whole] - clean[whole]).abs().amax(-1)
    before = max(
        float(moved[r, : int(where[r, 0])][real[r, : int(where[r, 0])]].max())
        for r in range(len(texts))
    )
    there = min(float(moved[r, int(where[r, 0])]) for r in range(len(texts)))
    ahead = model.resolution.checks.attends_ahead
    # a real token before the written one keeps its value (to the checks' tolerance: a
    # mixture of experts groups tokens by expert, and another value at one token
    # regroups the others' products at rounding level); the written one moves
    ok = kept and back and there > ATOL and (ahead is not None or before <= ATOL)
    detail = f"kept={kept} read back={back} before={before:.3g} at={there:.3g}"
    yield CheckResult.of(("block_input",), WRITE if ahead is None else WRITE_AHEAD, ok, detail)


def interchange_identities(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.interchange import interchange

    if not text_fed(ctx) or ("block_input", 0) not in ctx.addresses:
        return
    model = ctx.model
    if model.resolution.checks.interchange_unavailable is not None:
        return  # the family file says why (docs/families.md)
    try:
        first = locate(model, "block_input", 0, position="all")
        # the token whose logits interchange reads (the last of the input as the model
        # receives it: an EOS the tokenizer adds, where it adds one)
        last = locate(model, "block_output", ctx.n - 1, position={"anchor": "last"})
    except ComponentError:
        return
    pairs = equal_length_pairs(model)
    if pairs is not None:
        result = interchange(model, [first], *pairs, return_sources=True)
        ok, err = close(result.logits, result.sources[0].logits)
        yield CheckResult.of(("block_input",), ALL_TOKENS, ok, err)
    result = interchange(
        model, [last], list(SENTENCES[:3]), list(SENTENCES[3:6]), return_sources=True
    )
    ok, err = close(result.logits, result.sources[0].logits)
    yield CheckResult.of(("block_output",), LAST_TOKEN, ok, err)


__all__ = ["interchange_identities", "position_reads_and_writes", "text_fed"]
