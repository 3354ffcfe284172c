"""Positions in a content frame: which tokens of an input a study means.

A position is pure data, written the way documents write it::

    {"index": 0}                   the first content token
    {"index": -1}                  the last content token
    {"span": "fox"}                the tokens covering that text (it must occur once)
    {"span": "fox", "index": -1}   the last token of that span
    {"anchor": "bos"}              the special token the tokenizer put first
    {"anchor": "eos"}              the special token the tokenizer put last
    {"anchor": "last"}             the last token of the row as the model receives it
                                   (an EOS, the chat template's generation prompt
                                   included): the token whose logits give the next one
    {"anchor": "image"}            every token an image's features fill (its placeholders)
    {"anchor": "audio"}            every token an audio's features fill, likewise
    {"anchor": "video"}            every token a video's features fill, likewise
    "all"                          every content token
    [ ... ]                        several of these, in the order given

The content frame is every token of a row that the user's text produced: the tokens
the tokenizer adds (BOS, EOS, separators) and padding are outside it, read from the
loaded tokenizer's own special-tokens mask and offsets, never from a table of
families. So ``{"index": 0}`` is the first word on a tokenizer that prepends ``<s>``
and on one that prepends nothing, and on a left-padded short row alike. The ``chat``
frame renders the tokenizer's chat template around a user message and keeps only the
message's tokens as content (the template's scaffolding is outside it).

A batch of token ids (a processor's output: an image's placeholder tokens among the
text's) is a frame too: its image tokens (the placeholder id the model's family names,
registry family field ``media_tokens``, read from the loaded config) are the ``image``
anchor and outside the content, so ``{"index": -1}`` is the last text token with or
without an image in the input.

``encode`` tokenizes texts into the batch a trace runs (with ``position_ids`` counted
from each row's first real token, so an absolute-position model sees each row as it
would alone, whatever the padding side and the nnsight release); ``resolve`` gives the
token indices a position names, per row of that batch. Nothing is clamped: a position
the input does not have is refused with the position, the row and what to write.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import plain
from .errors import CausalabError

ANCHORS = ("bos", "eos", "last", "image", "audio", "video")
# anchors that name every token of a medium (the placeholders its features fill), not one
MEDIA_ANCHORS = ("image", "audio", "video")
FRAMES = ("plain", "chat")


class PositionError(CausalabError, ValueError):
    """A position that the input does not have, or that is not well written."""


@functools.total_ordering
@dataclass(frozen=True)
class Position:
    """One position spec, as data: ``index`` alone counts content tokens (negative
    from the end); ``span`` names text that must occur once (``index`` then counts
    the span's tokens); ``anchor`` is a special token the tokenizer added; ``every``
    is every content token."""

    index: int | None = None
    span: str | None = None
    anchor: str | None = None
    every: bool = False

    def __post_init__(self) -> None:
        kinds = sum(
            (self.anchor is not None, self.every, self.index is not None or bool(self.span))
        )
        if self.span is not None and not self.span:
            raise PositionError('{"span": ""} names no text: write the words the span covers')
        if kinds != 1:
            raise PositionError(
                f"{self.spec()!r} mixes kinds of position: write one of "
                '{"index": i}, {"span": "text"} (with an optional "index"), '
                '{"anchor": "bos"|"eos"|"last"|"image"|"audio"|"video"} or "all"'
            )
        if self.anchor is not None and self.anchor not in ANCHORS:
            raise PositionError(
                f"unknown anchor {self.anchor!r}: the anchors are {', '.join(ANCHORS)}"
            )
        if self.index is not None and type(self.index) is not int:
            raise PositionError(
                f"an index is an int, and {self.index!r} is a {type(self.index).__name__}"
            )

    def _key(self) -> tuple[Any, ...]:
        return (
            self.every,
            self.anchor or "",
            self.span or "",
            self.index is not None,
            self.index or 0,
        )

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self._key() < other._key()

    def spec(self) -> Any:
        """The position as a document writes it."""
        if self.every:
            return "all"
        if self.anchor is not None:
            return {"anchor": self.anchor}
        out: dict[str, Any] = {}
        if self.span is not None:
            out["span"] = self.span
        if self.index is not None:
            out["index"] = self.index
        return out

    def __str__(self) -> str:
        return text_of(self.spec())


def text_of(spec: Any) -> str:
    if isinstance(spec, str):
        return repr(spec)
    if isinstance(spec, (list, tuple)):
        return "[" + ", ".join(text_of(s) for s in spec) + "]"
    inner = ", ".join(f"{k!r}: {v!r}" for k, v in spec.items())
    return "{" + inner + "}"


_KEYS = frozenset({"index", "span", "anchor"})


def parse(spec: Any) -> tuple[Position, ...]:
    """A position spec (a dict, ``"all"``, a ``Position`` or a list of them) as a
    tuple of ``Position``; refuses unknown keys, wrong types, an empty list and a
    list that names the same position twice."""
    if isinstance(spec, Position):
        return (spec,)
    if isinstance(spec, str):
        if spec == "all":
            return (Position(every=True),)
        raise PositionError(
            f'unknown position {spec!r}: write "all", {{"index": i}}, '
            '{"span": "text"} or {"anchor": "bos"|"eos"|"last"|"image"|"audio"|"video"}'
        )
    if isinstance(spec, Mapping):
        extra = set(spec) - _KEYS
        if extra:
            raise PositionError(
                f"position {dict(spec)!r} has unknown keys {sorted(extra)}: a position "
                "takes index, span and anchor"
            )
        if "anchor" in spec and len(spec) > 1:
            raise PositionError(
                f"position {dict(spec)!r}: an anchor stands alone (write "
                f'{{"anchor": {spec["anchor"]!r}}})'
            )
        span = spec.get("span")
        if span is not None and not isinstance(span, str):
            raise PositionError(f"a span is text, and {span!r} is a {type(span).__name__}")
        return (Position(index=spec.get("index"), span=span, anchor=spec.get("anchor")),)
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise PositionError("an empty list of positions names no token: name at least one")
        out: list[Position] = []
        for item in spec:
            out.extend(parse(item))
        seen: set[Position] = set()
        for p in out:
            if p in seen:
                raise PositionError(
                    f"the list of positions names {p} twice: name each position once"
                )
            seen.add(p)
        return tuple(out)
    raise PositionError(
        f'a position is a dict, "all" or a list of them, not a {type(spec).__name__}'
    )


# ---------------------------------------------------------------------- frames


@dataclass(frozen=True)
class Frame:
    """One row of a batch as positions see it: every token (in the batch's own
    coordinates, padding included), which of them are content, and the anchors."""

    text: str
    tokens: tuple[str, ...]
    content: tuple[int, ...]  # batch indices of the content tokens, in order
    offsets: tuple[tuple[int, int], ...]  # per token, character offsets into ``text``
    anchors: Mapping[str, int] = field(default_factory=dict)
    real: tuple[int, ...] = ()  # batch indices the attention mask keeps
    # medium (image) -> batch indices of its placeholder tokens (outside the content);
    # a medium the model has no placeholder for is absent, with why in ``no_media``
    media: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    no_media: Mapping[str, str] = field(default_factory=dict)
    has_text: bool = True  # False: built from token ids (no text to find a span in)

    def describe(self, row: int | None = None) -> str:
        head = f"row {row}: " if row is not None else ""
        return f"{head}{self.text!r}"


@dataclass(frozen=True)
class Encoded:
    """A tokenized batch, ready for a trace (``inputs``), with the frame of each row."""

    inputs: Mapping[str, Any]
    frames: tuple[Frame, ...]
    frame: str = "plain"
    # an encoder-decoder's batch: ``frames`` are the decoder's rows, these the encoder's
    encoder_frames: tuple[Frame, ...] = ()


def _tokenizer_of(model: Any) -> Any:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None and hasattr(model, "convert_ids_to_tokens"):
        tokenizer = model  # a tokenizer itself
    if tokenizer is None:
        raise PositionError(
            "positions are resolved with the model's tokenizer, and this model has none: "
            "load it with its tokenizer (a checkpoint directory with tokenizer files)"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise PositionError(
            f"positions read token offsets, which only a fast tokenizer gives, and "
            f"{type(tokenizer).__name__} is not one: load the fast tokenizer (use_fast=True)"
        )
    return tokenizer


def media_token_ids(model: Any) -> tuple[dict[str, int], dict[str, str]]:
    """Medium (image, audio, video) -> the placeholder token id of ``model``'s inputs, read from its
    loaded config at the attributes its families' ``media_tokens`` field names (the
    first one set, on the config or its text config); and, for each medium it has none
    for, why (one line)."""
    from .family import families_of

    matched = families_of(model)
    families = tuple(f.name for f in matched)
    module = getattr(model, "_model", None)
    config = getattr(module, "config", None)
    configs = [c for c in (config, getattr(model, "text_config", None)) if c is not None]
    found: dict[str, int] = {}
    why: dict[str, str] = {}
    for medium in MEDIA_ANCHORS:
        names = [n for f in matched for n in f.media_tokens.get(medium, ())]
        if not names:
            fams = ", ".join(families) or "none"
            why[medium] = (
                f"the model's families ({fams}) name no {medium} placeholder token (registry "
                f"family field media_tokens): its inputs hold no {medium} tokens"
            )
            continue
        value = next(
            (getattr(c, n) for n in names for c in configs if getattr(c, n, None) is not None),
            None,
        )
        if isinstance(value, int) and not isinstance(value, bool):
            found[medium] = value
        else:
            why[medium] = (
                f"the loaded config sets none of {', '.join(names)} (the {medium} "
                "placeholder token id its family names): it has no such tokens"
            )
    return found, why


def media_token_id(model: Any, medium: str = "audio") -> int:
    """The id of ``medium``'s placeholder token on a loaded ``model`` (the wrapper writes
    the medium's projected features into the stream at the tokens of this id, after
    ``embeddings_output`` and before ``layers_input[0]``): read from the loaded config
    at the attributes the family's ``media_tokens`` names (``media_token_ids``, the one
    reader). Refused with the reason where the families name none, or the
    config sets none of them."""
    from .errors import PlaceUnavailable

    if medium not in MEDIA_ANCHORS:
        raise ValueError(
            f"unknown medium {medium!r}: the media whose placeholders a family row can "
            f"name are {', '.join(MEDIA_ANCHORS)}"
        )
    found, why = media_token_ids(model)
    if medium not in found:
        cls = type(model._model).__name__
        raise PlaceUnavailable(f"no {medium} placeholder on {cls}: {why[medium]}")
    return found[medium]


def _texts(inputs: Any) -> list[str]:
    if isinstance(inputs, str):
        texts = [inputs]
    elif isinstance(inputs, Sequence) and all(isinstance(t, str) for t in inputs):
        texts = list(inputs)
    else:
        raise PositionError(
            "positions are resolved on text (a string or a list of strings), so that a "
            f"span can be found in it; got a {type(inputs).__name__}. Pass the text, and "
            "run the trace on positions.encode(model, texts).inputs"
        )
    if not texts:
        raise PositionError("the input has no rows: give at least one text")
    for i, text in enumerate(texts):
        if not text:
            raise PositionError(
                f"row {i} is the empty text, which has no content token: give it words"
            )
    return texts


def _chat_render(tokenizer: Any, text: str) -> tuple[str, tuple[int, int]]:
    """The chat template rendered around ``text`` as the user message, and the
    characters of the rendering that are the message."""
    if not getattr(tokenizer, "chat_template", None):
        raise PositionError(
            f"the chat frame renders the tokenizer's chat template, and "
            f"{type(tokenizer).__name__} has none: use the plain frame (frame='plain')"
        )

    def render(message: str) -> str:
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        return str(out)

    rendered = render(text)
    # the template's scaffolding is what two renderings of other messages share
    a, b = render("\x00A\x00"), render("\x00B\x00")
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(a), len(b)) - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    start, end = prefix - 1, len(rendered) - (suffix - 1)  # back over the shared \x00
    if rendered[start:end] != text:
        raise PositionError(
            "the chat template does not put the user message into the rendering as "
            "written (it changes or repeats it), so its tokens cannot be told apart: use "
            "the plain frame"
        )
    return rendered, (start, end)


def encode(
    model: Any, inputs: Any, frame: str = "plain", padding_side: str | None = None
) -> Encoded:
    """Tokenize ``inputs`` (a text or a list of texts) into the batch a trace runs:
    ``input_ids``, ``attention_mask`` and ``position_ids`` (each row counted from its
    first real token, so padding moves no position), padded on the tokenizer's side
    where that is exact for the model's family, else on the other side
    (``causalab_mini.padding``: rows of different lengths the family cannot pad exactly
    are refused); ``padding_side`` demands a side. And each row's frame (``plain``:
    everything the user wrote; ``chat``: the user message inside the tokenizer's chat
    template)."""
    if frame not in FRAMES:
        raise PositionError(f"unknown frame {frame!r}: the frames are {', '.join(FRAMES)}")
    import torch

    tokenizer = _tokenizer_of(model)
    media, no_media = media_token_ids(model)
    from . import seq2seq

    if seq2seq.is_encoder_decoder(model):
        return _encode_pairs(model, tokenizer, inputs, frame, (media, no_media))
    if isinstance(inputs, Mapping) and "input_ids" in inputs:
        if frame != "plain":
            raise PositionError(
                f"a batch of token ids has no chat template rendering to find: the {frame} "
                "frame takes text; use the plain frame"
            )
        _check_padded_ids(model, inputs, padding_side)
        return _encode_ids(tokenizer, inputs, media, no_media)
    texts = _texts(inputs)
    windows: list[tuple[int, int]] = []
    if frame == "chat":
        rendered = [_chat_render(tokenizer, t) for t in texts]
        sources = [r for r, _ in rendered]
        windows = [w for _, w in rendered]
        add_special = False  # the template writes its own specials
    else:
        sources = texts
        add_special = True
    batch = _tokenized(model, tokenizer, sources, add_special, padding_side)
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    mask = torch.tensor(batch["attention_mask"], dtype=torch.long)
    specials = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    frames = [
        _row_frame(
            tokenizer,
            batch,
            row,
            (texts[row], sources[row]),
            frame,
            windows,
            specials,
            media,
            no_media,
        )
        for row in range(len(sources))
    ]
    out = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_of(mask)}
    return Encoded(inputs=out, frames=tuple(frames), frame=frame)


def position_ids_of(mask: Any) -> Any:
    """Each token's position counted from its row's first real token (0 on the pads
    before it), from the batch's attention mask: as the rows alone count them."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def check_frame(inputs: Any, frame: str) -> None:
    """Refuse a ``frame`` the inputs cannot be run in: an unknown frame, an encoded
    batch of another frame, and (outside the plain frame) anything but text."""
    if frame not in FRAMES:
        raise PositionError(f"unknown frame {frame!r}: the frames are {', '.join(FRAMES)}")
    if isinstance(inputs, Encoded):
        if inputs.frame != frame:
            raise PositionError(
                f"frame={frame!r} was given with a batch encoded in the {inputs.frame} frame: "
                f"encode it in that frame (positions.encode(model, texts, frame={frame!r})) "
                f"or pass frame={inputs.frame!r}"
            )
        return
    if frame != "plain" and not (
        isinstance(inputs, str)
        or (isinstance(inputs, (list, tuple)) and all(isinstance(t, str) for t in inputs))
    ):
        raise PositionError(
            f"frame={frame!r} renders text (each string as the user message of the chat "
            f"template), and the inputs are a {type(inputs).__name__}: give the texts, or "
            "run the batch as given in the plain frame (frame='plain')"
        )


def _encode_pairs(
    model: Any, tokenizer: Any, inputs: Any, frame: str, media: tuple[Any, Any]
) -> Encoded:
    """An encoder-decoder's batch (``causalab_mini.seq2seq``): the encoder's rows and the
    decoder's, each with its frames (``frames`` the decoder's, ``encoder_frames`` the
    encoder's), both padded on the right."""
    import torch

    from . import seq2seq

    found, no_media = media
    if isinstance(inputs, Mapping) and "input_ids" in inputs:
        seq2seq.check_ids(model, inputs)
        encoder = _encode_ids(tokenizer, inputs, found, no_media)
        mask = inputs.get("decoder_attention_mask")
        given = {"input_ids": inputs["decoder_input_ids"]}
        decoder = _encode_ids(
            tokenizer, given if mask is None else {**given, "attention_mask": mask}, {}, {}
        )
        return Encoded(dict(inputs), decoder.frames, "plain", encoder.frames)
    if frame != "plain":
        raise PositionError(
            f"the {frame} frame renders one text, and {type(model._model).__name__} is an "
            "encoder-decoder fed pairs (source, decoder prefix): use the plain frame"
        )
    sources, prefixes = seq2seq.pairs(model, inputs)
    sources = _texts(sources)
    batch = _tokenized(model, tokenizer, sources, True, "right")
    specials = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id}
    encoder_frames = tuple(
        _row_frame(tokenizer, batch, r, (t, t), "plain", [], specials, found, no_media)
        for r, t in enumerate(sources)
    )
    dec = seq2seq.decoder_batch(model, tokenizer, prefixes)
    frames = []
    for row, prefix in enumerate(prefixes):
        real = [i for i, m in enumerate(dec["attention_mask"][row]) if m]
        frames.append(
            Frame(
                text=prefix,
                tokens=tuple(tokenizer.convert_ids_to_tokens(dec["input_ids"][row])),
                content=tuple(i for i in real if not dec["special_tokens_mask"][row][i]),
                offsets=tuple(dec["offset_mapping"][row]),
                anchors={"bos": 0},  # the decoder start token
                real=tuple(real),
                no_media=no_media,
            )
        )
    tensors = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "decoder_input_ids": dec["input_ids"],
        "decoder_attention_mask": dec["attention_mask"],
    }
    out = {k: torch.tensor(v, dtype=torch.long) for k, v in tensors.items()}
    return Encoded(out, tuple(frames), "plain", encoder_frames)


def _tokenized(
    model: Any, tokenizer: Any, sources: list[str], add_special: bool, required: str | None
) -> Any:
    """``sources`` tokenized into one batch, as lists (a frame reads them token by token),
    padded on the side ``padding.side_for`` gives (refused where the family cannot pad
    rows of different lengths exactly)."""
    from .padding import side_for

    def padded(side: str) -> Any:
        return tokenizer(
            sources,
            padding=True,
            padding_side=side,
            add_special_tokens=add_special,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )

    preferred = str(tokenizer.padding_side)
    try:  # most batches pad on the tokenizer's own side: tokenized once
        batch = padded(preferred)
    except ValueError:  # no pad token: refused below as before, or after the side
        batch = None
    if batch is not None:
        lengths = [sum(row) for row in batch["attention_mask"]]
    else:
        lengths = [len(r) for r in tokenizer(sources, add_special_tokens=add_special)["input_ids"]]
    side = side_for(model, preferred, lengths, required)
    return batch if batch is not None and side == preferred else padded(side)


def _check_padded_ids(model: Any, inputs: Mapping[str, Any], required: str | None) -> None:
    """Refuse a batch of token ids padded on a side the model's family does not compute
    a padded row exactly on (``causalab_mini.padding``): the batch is run as given."""
    import torch

    from .padding import side_for

    mask = inputs.get("attention_mask")
    if mask is None:
        return
    mask = torch.as_tensor(mask)
    if mask.dim() != 2 or bool(mask.all()):
        return
    side = "left" if bool((mask[:, 0] == 0).any()) else "right"
    side_for(model, side, [int(n) for n in mask.sum(-1)], required or side)


def _encode_ids(
    tokenizer: Any, inputs: Mapping[str, Any], media: Mapping[str, int], no_media: Mapping[str, str]
) -> Encoded:
    """The frames of a batch given as token ids (a processor's output, an image's
    placeholders among the text's tokens): real tokens are the attention mask's (all,
    without one), the tokenizer's special tokens and each medium's placeholders are
    outside the content, the bos/eos anchors are special tokens at a row's ends. The
    inputs are the batch as given (its other keys, pixel_values, kept)."""
    import torch

    ids = torch.as_tensor(inputs["input_ids"])
    if ids.dim() != 2:
        raise PositionError(
            f"input_ids of shape {tuple(ids.shape)}: a batch of token ids is (batch, seq)"
        )
    mask = inputs.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
    frames: list[Frame] = []
    for row in range(ids.shape[0]):
        tokens = [int(t) for t in ids[row]]
        real = [i for i in range(len(tokens)) if int(mask[row, i])]
        if not real:
            raise PositionError(f"row {row} of the token batch is all padding: give it tokens")
        special = tokenizer.get_special_tokens_mask(tokens, already_has_special_tokens=True)
        placed = {m: tuple(i for i in real if tokens[i] == t) for m, t in media.items()}
        in_media = {i for p in placed.values() for i in p}
        content = [i for i in real if not special[i] and i not in in_media]
        anchors = {
            name: at
            for name, at in (("bos", real[0]), ("eos", real[-1]))
            if special[at] and at not in in_media
        }
        if not content:
            raise PositionError(f"row {row} of the token batch has no text token: give it words")
        text = tokenizer.decode([tokens[i] for i in content])
        frames.append(
            Frame(
                text=text,
                tokens=tuple(tokenizer.convert_ids_to_tokens(tokens)),
                content=tuple(content),
                offsets=tuple((0, 0) for _ in tokens),
                anchors=anchors,
                real=tuple(real),
                media=placed,
                no_media=no_media,
                has_text=False,
            )
        )
    return Encoded(inputs=dict(inputs), frames=tuple(frames), frame="plain")


def _row_frame(
    tokenizer: Any,
    batch: Any,
    row: int,
    texts: tuple[str, str],
    frame: str,
    windows: list[tuple[int, int]],
    specials: dict[str, Any],
    media: Mapping[str, int],
    no_media: Mapping[str, str],
) -> Frame:
    """Row ``row`` of a tokenized batch as a frame: its real tokens, its content (the
    tokens of the text, ``texts`` = (text, source): not the tokenizer's specials nor a
    medium's placeholders, or, in the chat frame, inside the user message's window of
    the rendered source), offsets, anchors and each medium's placeholders."""
    text, source = texts
    ids = batch["input_ids"][row]
    special = batch["special_tokens_mask"][row]
    real = [i for i, m in enumerate(batch["attention_mask"][row]) if m]
    spans = [(int(a), int(b)) for a, b in batch["offset_mapping"][row]]
    if frame == "chat":
        lo, hi = windows[row]
        content = [
            i for i in real if spans[i][1] > spans[i][0] and spans[i][0] < hi and spans[i][1] > lo
        ]
        spans = [(max(a - lo, 0), max(min(b, hi) - lo, 0)) for a, b in spans]
    else:
        content = [i for i in real if not special[i]]
        text = source
    placed = {m: tuple(i for i in real if ids[i] == t) for m, t in media.items()}
    in_media = {i for p in placed.values() for i in p}
    content = [i for i in content if i not in in_media]
    anchors = _anchors(frame, real, content, ids, special, specials)
    if not content:
        raise PositionError(
            f"row {row} ({text!r}) has no content token after tokenization: give it words"
        )
    return Frame(
        text=text,
        tokens=tuple(tokenizer.convert_ids_to_tokens(ids)),
        content=tuple(content),
        offsets=tuple(spans),
        anchors=anchors,
        real=tuple(real),
        media=placed,
        no_media=no_media,
    )


def _anchors(
    frame: str,
    real: list[int],
    content: list[int],
    ids: Any,
    special: Any,
    specials: Mapping[str, int | None],
) -> dict[str, int]:
    """The special tokens at either end of a row: in the plain frame the ones the
    tokenizer added (its special-tokens mask), in the chat frame the template's own
    BOS and EOS tokens outside the message."""
    inside = set(content)
    out: dict[str, int] = {}
    for name, at in (("bos", real[0]), ("eos", real[-1])):
        if at in inside:
            continue
        if frame == "plain" and int(special[at]):
            out[name] = at
        elif frame == "chat" and specials[name] is not None and int(ids[at]) == specials[name]:
            out[name] = at
    return out


def trace_inputs(model: Any, encoded: Encoded) -> dict[str, Any]:
    """The batch to trace: ``encoded.inputs``, without ``position_ids`` where the model's
    forward takes none (its positions then come from the mask, or it has none)."""
    import inspect

    inputs = dict(encoded.inputs)
    module = getattr(model, "_model", model)
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return inputs
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if "position_ids" not in parameters and not takes_any:
        inputs.pop("position_ids", None)  # a batch given as ids may have none
    return inputs


def _one(position: Position, frame: Frame, row: int) -> list[int]:
    if position.every:
        return list(frame.content)
    if position.anchor in MEDIA_ANCHORS:
        medium = position.anchor
        if medium in frame.no_media:
            raise PositionError(f"{position}: {frame.no_media[medium]}")
        placed = list(frame.media.get(medium, ()))
        if not placed:
            raise PositionError(
                f"{position}: {frame.describe(row)} holds no {medium} token; feed the input with its "
                f"{medium} (the processor's batch, placeholders included) or address text"
            )
        return placed
    if position.anchor == "last":
        return [frame.real[-1]]  # the last token the attention mask keeps
    if position.anchor is not None:
        at = frame.anchors.get(position.anchor)
        if at is None:
            raise PositionError(
                f"{position}: the tokenizer added no {position.anchor.upper()} token to "
                f'{frame.describe(row)}; address a content token instead ({{"index": 0}} or '
                f'{{"index": -1}})'
            )
        return [at]
    tokens = list(frame.content)
    if position.span is not None:
        tokens = _span(position, frame, row)
    if position.index is None:
        return tokens
    n = len(tokens)
    i = position.index
    if i >= n or i < -n:
        what = f"the span {position.span!r}" if position.span is not None else frame.describe(row)
        first, last = 0, n - 1
        raise PositionError(
            f"{position} is outside {what}, which has {n} content token"
            f"{'' if n == 1 else 's'} (indices {first}..{last}, or {-n}..-1 from the end); "
            "nothing is clamped: write an index in that range"
        )
    return [tokens[i]]


def _span(position: Position, frame: Frame, row: int) -> list[int]:
    assert position.span is not None
    if not frame.has_text:
        raise PositionError(
            f"{position}: row {row} was given as token ids, which carry no text to find "
            "a span in; address it by index, or encode the text"
        )
    text, span = frame.text, position.span
    found = []
    start = text.find(span)
    while start >= 0:
        found.append(start)
        start = text.find(span, start + 1)
    if not found:
        raise PositionError(
            f"{position}: {span!r} does not occur in {frame.describe(row)}; write a span "
            "that is in the text"
        )
    if len(found) > 1:
        raise PositionError(
            f"{position}: {span!r} occurs {len(found)} times in {frame.describe(row)} "
            f"(at characters {found}); write a longer span that occurs once"
        )
    lo, hi = found[0], found[0] + len(span)
    content = set(frame.content)
    covering = [
        i
        for i in frame.real
        if frame.offsets[i][1] > frame.offsets[i][0]
        and frame.offsets[i][0] < hi
        and frame.offsets[i][1] > lo
    ]
    if any(i not in content for i in covering) or not covering:
        raise PositionError(
            f"{position}: the span {span!r} in {frame.describe(row)} is split by a token "
            "the tokenizer added; write a span inside the content"
        )
    if covering != list(range(covering[0], covering[-1] + 1)):
        raise PositionError(
            f"{position}: the tokens covering {span!r} in {frame.describe(row)} are not "
            "contiguous; write a span inside the content"
        )
    return covering


def resolve(
    model: Any, inputs: Any, position: Any, frame: str = "plain", stack: str = "decoder"
) -> list[list[int]]:
    """The token indices ``position`` names in each row of the batch a trace runs on
    ``inputs`` (a text, a list of texts, a batch of token ids, or an ``Encoded`` from
    ``encode``): one list
    per row, in the order the position spec gives, in the batch's own coordinates
    (padding counted). Refuses, with the position, the row and what to write, any
    position a row does not have. On an encoder-decoder's batch the positions count in
    the decoder's input (where every component is), or with ``stack="encoder"`` in the
    encoder's (its ``encoder_layers_*`` places)."""
    positions = parse(position)
    encoded = inputs if isinstance(inputs, Encoded) else encode(model, inputs, frame)
    frames = encoded.frames
    if stack == "encoder":
        frames = encoded.encoder_frames
        if not frames:
            raise PositionError(
                "stack='encoder' counts positions in an encoder-decoder's encoder input, and "
                "this batch has none (the model runs one stack): leave stack unset"
            )
    elif stack != "decoder":
        raise PositionError(f"unknown stack {stack!r}: 'decoder' (the default) or 'encoder'")
    out: list[list[int]] = []
    for row, fr in enumerate(frames):
        indices: list[int] = []
        for p in positions:
            for i in _one(p, fr, row):
                if i in indices:
                    raise PositionError(
                        f"{text_of(spec_of(positions))} names token {i} of "
                        f"{fr.describe(row)} twice ({fr.tokens[i]!r}); name each token once"
                    )
                indices.append(i)
        out.append(indices)
    return out


def stacked(indices: Sequence[Sequence[int]], position: Any) -> Any:
    """``indices`` (one list per row, from ``resolve``) as a (batch, n) index tensor,
    refused where the rows name different numbers of tokens (they would not stack
    into one tensor)."""
    import torch

    counts = [len(r) for r in indices]
    if len(set(counts)) > 1:
        raise PositionError(
            f"{text_of(spec_of(parse(position)))} names a different number of tokens in each "
            f"row ({counts}), so the positions do not stack into one tensor: address a fixed "
            'number of tokens per row ({"index": i}, or a span with an index)'
        )
    return torch.tensor([list(r) for r in indices], dtype=torch.long)


# the tokens of a tensor at positions, and a copy with them replaced: one definition,
# in the module whose functions a server runs (plain), used here and there alike
take = plain.take_positions
put = plain.put_positions


def spec_of(positions: Iterable[Position]) -> Any:
    specs = [p.spec() for p in positions]
    return specs[0] if len(specs) == 1 else specs


def describe_frame(encoded: Encoded) -> str:
    """Each row's tokens, their content index (and from the end) and the anchors: what
    ``registry positions`` prints."""
    lines: list[str] = []
    for row, fr in enumerate(encoded.frames):
        lines.append(f"row {row} ({encoded.frame} frame): {fr.text!r}")
        content = {t: k for k, t in enumerate(fr.content)}
        anchors = {v: k for k, v in fr.anchors.items()}
        anchors.update({i: m for m, placed in fr.media.items() for i in placed})
        n = len(fr.content)
        for i, token in enumerate(fr.tokens):
            if i in content:
                k = content[i]
                tag = f"index {k:>3} / {k - n:>4}"
            elif i in anchors:
                tag = f"anchor {anchors[i]}"
            elif i not in fr.real:
                tag = "padding"
            elif encoded.frame == "chat":
                tag = "template (not content)"
            else:
                tag = "added by the tokenizer"
            lines.append(f"  {i:>4}  {token!r:<24} {tag}")
    return "\n".join(lines)


__all__ = [
    "ANCHORS",
    "FRAMES",
    "MEDIA_ANCHORS",
    "Encoded",
    "Frame",
    "Position",
    "PositionError",
    "check_frame",
    "describe_frame",
    "encode",
    "media_token_id",
    "media_token_ids",
    "parse",
    "position_ids_of",
    "put",
    "resolve",
    "spec_of",
    "stacked",
    "take",
    "text_of",
    "trace_inputs",
]
