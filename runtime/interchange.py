"""Interchange interventions: the value of a component at a position in a *source* run,
put into a *base* run at the same component, in one forward.

Every (base, source) pair is a row of one batch: the base rows first, then each
source's rows, tokenized together (so padding, BOS and ``position_ids`` are the
tokenizer's own, per row) and traced once per ``batch_size`` pairs. A patch reads the
whole place, moves the source rows' tokens at the patch's position into the base rows'
tokens at the same position spec (each row resolves it in its own content frame:
``{"span": "Paris", "index": -1}`` is the last token of "Paris" in either prompt, at
whatever index), and writes the place back; the source rows are never changed, so a
later patch still reads the clean source. Reads and the logits are the base run's
(and the sources', on request).

    result = interchange(
        model,
        [locate(model, "block_output", 3, position={"span": "Paris", "index": -1})],
        bases=["The Eiffel Tower is in Paris"],
        sources=["The Colosseum is in Rome, not Paris"],
    )
    result.logits          # (pairs, vocab): at each base row's last token as the model
                           # receives it (where it predicts the next token)
    result.reads[address]  # (pairs, ...): what each read address held in the base run
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from .engines import Engine, engine_for
from .geometry import ComponentError
from .locator import ComponentAddress, locate
from .plan import Plan, Step, featurized
from .positions import PositionError, encode, resolve, stacked, take, trace_inputs

NEXT = {"anchor": "last"}  # the token whose logits give the next token


@dataclass(frozen=True)
class Patch:
    """One interchange: ``address`` (with its positions) takes its value from source
    ``source`` of each pair (0: the first, where a pair has several)."""

    address: ComponentAddress
    source: int = 0


@dataclass
class InterchangeResult:
    """What the base runs read, by address, each (pairs, ...) in the order of the pairs;
    ``logits`` (pairs, vocab) at each base row's last token as the model receives it
    (``{"anchor": "last"}``: the end of the chat prompt in the chat frame, an EOS the
    tokenizer adds; where it predicts the next token); and, where asked,
    the same of every source (``sources[k]``: source k's reads and logits)."""

    reads: dict[ComponentAddress, Any] = field(default_factory=dict)
    logits: Any = None
    sources: list[InterchangeResult] = field(default_factory=list)


def handed_axis(address: ComponentAddress) -> int:
    """The sequence axis of the tensor ``read`` hands out at ``address`` (one head of a
    (batch, heads, queries, keys) place loses the head axis)."""
    assert address.sequence_axis is not None
    if address.head is not None and address.layout == "bhsk":
        return address.sequence_axis - 1
    return address.sequence_axis


def _patches(model: Any, patches: Sequence[Any], slots: int) -> list[Patch]:
    out = [
        p if isinstance(p, Patch) else Patch(*p) if isinstance(p, tuple) else Patch(p)
        for p in patches
    ]
    if not out:
        raise ComponentError("an interchange needs at least one patch: give a located address")
    seen: dict[tuple[Any, ...], Patch] = {}
    for p in out:
        if not p.address.position:
            raise ComponentError(
                f"patch {p.address} names no position: say which tokens move "
                '(locate(..., position={"index": -1}), or position="all")'
            )
        if not p.address.writable:
            raise ComponentError(
                f"patch {p.address}: {p.address.component} is read-only: {p.address.why_read_only}"
            )
        if not 0 <= p.source < slots:
            raise ComponentError(
                f"patch {p.address} takes source {p.source}, and each pair has {slots} "
                f"source{'' if slots == 1 else 's'} (0..{slots - 1})"
            )
        key = (p.address.component, p.address.layer, p.address.head, p.address.stream)
        if key in seen:
            raise ComponentError(
                f"two patches at one place ({p.address} and {seen[key].address}): give one "
                "patch with both positions (position=[...])"
            )
        seen[key] = p
    return out


_MEDIA_KEYS = ("pixel_values", "input_features", "input_values", "pixel_values_videos")


def _refuse_media(given: Any, what: str) -> None:
    """Refuse a batch of token ids (a processor's output: media placeholders among the
    text's tokens, pixel or audio values beside them) given as ``what``: interchange
    tokenizes bases and sources together into one batch of text rows, and a media batch
    cannot be joined row by row with its media values."""
    from collections.abc import Mapping

    if isinstance(given, Mapping) or hasattr(given, "keys"):
        media = [k for k in _MEDIA_KEYS if k in given]
        held = f" with {', '.join(media)}" if media else ""
        raise PositionError(
            f"interchange was given a batch of token ids{held} as {what}: it pairs texts, "
            "tokenized together into one batch, and does not join media inputs (image "
            "or audio placeholders and their pixel or audio values) row by row. Patch a "
            "media input in a trace of its own: read the source with "
            "Plan.of([address]).run(model, source_batch) and write that value with "
            "Plan.of([], [(address, value)]).run(model, base_batch) (positions resolve on "
            "the ids, media tokens outside the content), or give interchange the texts"
        )


def _pairs(
    bases: Sequence[Any], sources: Sequence[Any], one: Any = lambda s: False
) -> tuple[list[Any], list[list[Any]]]:
    """The bases, and per source slot its texts (one per base); ``one(s)`` says a tuple
    is one input (an encoder-decoder's pair), not several sources."""
    _refuse_media(bases, "bases")
    for source in sources if isinstance(sources, (list, tuple)) else [sources]:
        _refuse_media(source, "sources")
    if isinstance(bases, str) or isinstance(sources, str):
        raise PositionError("bases and sources are lists of texts, one source (or tuple) per base")
    if len(bases) != len(sources):
        raise PositionError(
            f"{len(bases)} bases and {len(sources)} sources: give one source (or one tuple of "
            "sources) per base"
        )
    if not bases:
        raise PositionError("no pairs: give at least one base and its source")
    # a source is one text, or one (source, decoder prefix) pair of an encoder-decoder;
    # a list (or a tuple that is not such a pair) holds several
    rows = [list(s) if isinstance(s, (list, tuple)) and not one(s) else [s] for s in sources]
    slots = {len(r) for r in rows}
    if len(slots) != 1:
        raise PositionError(
            f"every base needs the same number of sources, and they have {sorted(slots)}"
        )
    n = slots.pop()
    return list(bases), [[r[k] for r in rows] for k in range(n)]


def interchange(
    model: Any,
    patches: Sequence[Any],
    bases: Sequence[str],
    sources: Sequence[Any],
    *,
    reads: Sequence[ComponentAddress] = (),
    batch_size: int = 32,
    return_sources: bool = False,
    frame: str = "plain",
    engine: str | Engine = "nnsight",
) -> InterchangeResult:
    """Run every (base, source) pair with ``patches`` applied to the base (see the
    module's text); ``batch_size`` pairs per trace. ``patches`` are located addresses
    with positions (or ``Patch(address, source=k)`` where a pair has several sources:
    ``sources[i]`` is then a tuple). Returns the base runs' reads and last-token logits,
    and the sources' with ``return_sources``. ``engine="hooks"`` runs each chunk with
    plain torch hooks (``causalab_mini.hooks``) instead of an nnsight trace (or any
    local ``causalab_mini.engines.Engine``)."""
    runner = engine_for(engine)
    if type(batch_size) is not int or batch_size < 1:
        raise ValueError(f"batch_size is a positive int, not {batch_size!r}")
    from .seq2seq import is_pair

    base_texts, slot_texts = _pairs(bases, sources, lambda s: is_pair(model, s))
    plan = _patches(model, patches, len(slot_texts))
    logits_at = locate(model, "logits")
    chunks: list[InterchangeResult] = []
    for start in range(0, len(base_texts), batch_size):
        stop = start + batch_size
        chunks.append(
            _chunk(
                model,
                plan,
                list(reads),
                logits_at,
                base_texts[start:stop],
                [texts[start:stop] for texts in slot_texts],
                return_sources,
                frame,
                runner,
            )
        )
    out = _joined(chunks, len(slot_texts) if return_sources else 0)
    if any(a.featurizer is not None for a in out.reads):
        for result in (out, *out.sources):  # a featurized read returns features
            result.reads = featurized(result.reads)
    return out


def _joined(chunks: list[InterchangeResult], slots: int) -> InterchangeResult:
    import torch

    first = chunks[0]
    out = InterchangeResult(
        reads={a: _cat([c.reads[a] for c in chunks]) for a in first.reads},
        logits=torch.cat([c.logits for c in chunks]),
    )
    for k in range(slots):
        out.sources.append(_joined([c.sources[k] for c in chunks], 0))
    return out


def _cat(parts: list[Any]) -> Any:
    """Chunks of a read joined: one tensor where they stack, else every pair's own."""
    import torch

    if all(isinstance(p, torch.Tensor) for p in parts):
        try:
            return torch.cat(parts)
        except RuntimeError:  # other numbers of tokens per chunk
            pass
    return [row for p in parts for row in p]


def _row_index(model: Any, encoded: Any, address: ComponentAddress, rows: range) -> Any:
    """The (rows, n) token index of ``address``'s positions in ``rows``, or one index
    list per row where the rows name different numbers of tokens."""
    indices = resolve(model, encoded, address.position)
    mine = [indices[r] for r in rows]
    if len({len(r) for r in mine}) > 1:
        return mine
    return stacked(mine, address.position)


def _moves(
    model: Any,
    encoded: Any,
    plan: list[Patch],
    groups: list[range],
    bases: list[str],
    slots: list[list[str]],
) -> list[tuple[ComponentAddress, list[tuple[Any, int, Any]]]]:
    """Per patch, its address and, per base row, (the base's token indices, the source
    row, the source's token indices): as many tokens in both, or refused."""
    moves = []
    for p in plan:
        indices = resolve(model, encoded, p.address.position)
        source_rows = groups[p.source + 1]
        for i, row in enumerate(source_rows):
            if len(indices[i]) != len(indices[row]):
                raise PositionError(
                    f"patch {p.address}: the position names {len(indices[i])} tokens in base "
                    f"{bases[i]!r} and {len(indices[row])} in its source "
                    f"{slots[p.source][i]!r}; name as many in both (a span with an index, or "
                    "texts of as many tokens)"
                )
        pairs = [(indices[i], row, indices[row]) for i, row in enumerate(source_rows)]
        moves.append((p.address, pairs))
    return moves


Order = list[tuple[tuple[int, int | float], bool, int]]


def _order(moves: list[Any], wanted: list[Any], logits_at: ComponentAddress) -> Order:
    """What the trace does, in forward order: (rank, reads after writes at one rank,
    what: a patch (negative), a read (its index), or the logits (the last))."""
    steps: Order = [(m[0].rank, False, -1 - i) for i, m in enumerate(moves)]
    steps += [(a.rank, True, i) for i, (a, _) in enumerate(wanted)]
    steps.append((logits_at.rank, True, len(wanted)))
    steps.sort(key=lambda s: (s[0], s[1]))
    return steps


class _Chunk(NamedTuple):
    """What one batch of pairs runs: the steps in forward order, the patches' moves,
    the reads with their per-group indices, the logits' address, the rows of each
    group, each row's last content token, and the encoded batch."""

    steps: Order
    moves: list[Any]
    wanted: list[Any]
    logits_at: ComponentAddress
    groups: list[range]
    last: Any
    encoded: Any


def _patched(full: Any, pairs: list[Any], axis: int, featurizer: Any = None) -> Any:
    """``full`` (every row, as read hands it on) with each base row's tokens at the
    patch's positions taken from its source row (with a ``featurizer``, its selected
    features: ``featurizer.swap``); the source rows as they were."""
    patched = full.clone()
    rows = [i for i, (at, _, _) in enumerate(pairs) for _ in at]
    source_rows = [row for at, row, _ in pairs for _ in at]
    tokens = [t for at, _, _ in pairs for t in at]
    source_tokens = [t for _, _, source_at in pairs for t in source_at]
    # one indexed copy on views with the sequence second: writing the view writes patched
    seq = axis + 1
    moved = full.movedim(seq, 1)[source_rows, source_tokens]
    if featurizer is not None:
        moved = featurizer.swap(full.movedim(seq, 1)[rows, tokens], moved)
    patched.movedim(seq, 1)[rows, tokens] = moved
    return patched


def _results(
    values: dict[int, list[Any]],
    reads: list[ComponentAddress],
    groups: list[range],
    return_sources: bool,
) -> InterchangeResult:
    """The base run's result (the sources' in ``sources`` where asked for)."""
    results = []
    for g in range(len(groups) if return_sources else 1):
        results.append(
            InterchangeResult(
                reads={a: values[i][g] for i, a in enumerate(reads)},
                logits=values[len(reads)][g][:, 0],
            )
        )
    base = results[0]
    base.sources = results[1:]
    return base


def _chunk(
    model: Any,
    plan: list[Patch],
    reads: list[ComponentAddress],
    logits_at: ComponentAddress,
    bases: list[str],
    slots: list[list[str]],
    return_sources: bool,
    frame: str,
    engine: Engine,
) -> InterchangeResult:
    """One batch of pairs: the bases and their sources as rows of one run."""
    k = len(bases)
    encoded = encode(model, [*bases, *(t for texts in slots for t in texts)], frame)
    groups = [range(0, k), *(range(k * (s + 1), k * (s + 2)) for s in range(len(slots)))]
    moves = _moves(model, encoded, plan, groups, bases, slots)
    # the logits where each row predicts its next token: the last token of the input as
    # the model receives it (an EOS the tokenizer adds, the chat template's generation
    # prompt), in every frame (the base's, and each source's)
    last = stacked(resolve(model, encoded, NEXT), NEXT)
    wanted = [
        (a, [_row_index(model, encoded, a, g) if a.position else None for g in groups])
        for a in reads
    ]
    chunk = _Chunk(
        _order(moves, wanted, logits_at), moves, wanted, logits_at, groups, last, encoded
    )
    values = _run_chunk(model, chunk, engine)
    return _results(values, reads, groups, return_sources)


def _run_chunk(model: Any, chunk: _Chunk, engine: Engine) -> dict[int, list[Any]]:
    """One chunk as one lowered program, on any engine: a patch is a write whose value
    is made of the place's own tensor where it runs (``edit``), a read is cut into its
    groups of rows where it is made (``then``); per read (and the logits), its value
    per group."""
    steps, moves, wanted, logits_at, groups, last, encoded = chunk
    plan_steps: list[Step] = []
    edits: list[tuple[Any, Any]] = []
    order: list[int] = []
    for _, _, what in steps:
        if what < 0:
            address, pairs = moves[-1 - what]
            axis = handed_axis(address) - 1  # of one row
            plan_steps.append(Step(replace(address, position=(), featurizer=None), True, None))
            f = address.featurizer  # a featurized patch swaps its selected features
            edits.append(
                (lambda full, pairs=pairs, axis=axis, f=f: _patched(full, pairs, axis, f), None)
            )
            continue
        if what < len(wanted):
            address, read_at = wanted[what]
            read_axis = handed_axis(address) if address.position else None
            plan_steps.append(Step(replace(address, position=(), featurizer=None)))
            edits.append(
                (None, lambda full, at=read_at, ax=read_axis: _per_group(full, groups, at, ax))
            )
        else:
            lasts = [last[g.start : g.stop] for g in groups]
            plan_steps.append(Step(logits_at))
            edits.append((None, lambda full, at=lasts: _per_group(full, groups, at, 1)))
        order.append(what)
    program = engine.lower(Plan(tuple(plan_steps)), model, edits=edits)
    reads = engine.run(model, program, trace_inputs(model, encoded))
    return dict(zip(order, reads, strict=True))


def _per_group(full: Any, groups: list[range], indices: list[Any], axis: int | None) -> list[Any]:
    """``full`` (every row of the batch) cut into its groups of rows, each at its own
    positions where ``indices`` has them."""
    out: list[Any] = []
    for g, index in zip(groups, indices, strict=True):
        part = full[g.start : g.stop]
        if index is None or axis is None:
            out.append(part)
        elif isinstance(index, list):  # ragged: each row its own tokens, a tensor each
            out.append(
                [
                    part[i].movedim(axis - 1, 0)[at].movedim(0, axis - 1)
                    for i, at in enumerate(index)
                ]
            )
        else:
            out.append(take(part, index, axis))
    return out


def grid(*args: Any, **kwargs: Any) -> Any:
    """A (layer x position) patching grid at the cost of its forwards:
    ``causalab_mini.patching.grid`` (each source run once, a layer's cells as rows of
    as few forwards as ``batch_size`` allows)."""
    from .patching import grid as run

    return run(*args, **kwargs)


__all__ = ["InterchangeResult", "Patch", "grid", "handed_axis", "interchange"]
