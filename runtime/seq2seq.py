"""Inputs of an encoder-decoder (T5, BART loaded whole): the encoder reads one text
and the decoder another, so a batch is a list of pairs ``(source, decoder_prefix)``
(or token ids with ``decoder_input_ids``). The decoder's input is the model's decoder
start token (its config's ``decoder_start_token_id``) followed by the prefix's tokens
as the tokenizer makes them without special tokens: what ``generate`` feeds it, the
prefix continuing where the start token leaves off. Both are padded on the right (a
padded row is then computed as alone: the decoder is causal, the encoder masks its
padding).

Positions count in the frame of the stack a place is in: every component (the
registry's layers are the decoder's) in the decoder's input, whose content is the
prefix's tokens and whose ``bos`` anchor is the start token; the encoder's places
(``encoder_layers_*``) in the encoder's input (``positions.resolve(..., stack=
"encoder")``). A text with no decoder input is refused with this module's
``DecoderInputMissing``, never left to transformers' own error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import CausalabError


class DecoderInputMissing(CausalabError, ValueError):
    """An encoder-decoder given no input for its decoder, with how to give one."""


def is_encoder_decoder(model: Any) -> bool:
    """Whether the loaded model runs an encoder and a decoder (its config says so)."""
    config = getattr(getattr(model, "_model", None), "config", None)
    return bool(getattr(config, "is_encoder_decoder", False))


def _name(model: Any) -> str:
    return type(getattr(model, "_model", model)).__name__


def _missing(model: Any, given: str) -> DecoderInputMissing:
    return DecoderInputMissing(
        f"{_name(model)} is an encoder-decoder, and {given}: its decoder needs an input of "
        'its own. Give pairs [(source, decoder_prefix), ...] (the prefix may be "": the '
        "decoder then runs its start token alone), or token ids with decoder_input_ids "
        "(and decoder_attention_mask)"
    )


def decoder_start(model: Any) -> int:
    """The token the decoder starts from: the config's (or generation config's)
    ``decoder_start_token_id``, else the config attribute the family file names
    (``decoder_start_config``); refused where none sets one."""
    module = getattr(model, "_model", None)
    for config in (getattr(module, "config", None), getattr(module, "generation_config", None)):
        value = getattr(config, "decoder_start_token_id", None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    resolution = getattr(model, "resolution", None)
    path = getattr(getattr(resolution, "forward", None), "decoder_start_config", None)
    if path:  # the family file: where its own right shift finds the start token
        value = getattr(module, "config", None)
        for part in path.split("."):
            value = getattr(value, part, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise DecoderInputMissing(
        f"{_name(model)}'s config sets no decoder_start_token_id, so the token its decoder "
        "starts from is unknown: give decoder_input_ids yourself (starting with the "
        "token the checkpoint's training used), or set config.decoder_start_token_id"
    )


def pairs(model: Any, inputs: Any) -> tuple[list[str], list[str]]:
    """(sources, decoder prefixes) of ``inputs``: a pair or a list of pairs of texts."""
    if isinstance(inputs, tuple) and len(inputs) == 2 and all(isinstance(t, str) for t in inputs):
        inputs = [inputs]
    if isinstance(inputs, str):
        raise _missing(model, f"it was given the text {inputs!r} alone")
    if not isinstance(inputs, Sequence) or not inputs:
        raise _missing(model, f"it was given a {type(inputs).__name__}")
    out: tuple[list[str], list[str]] = ([], [])
    for row, item in enumerate(inputs):
        if isinstance(item, str):
            raise _missing(model, f"row {row} is the text {item!r} alone")
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise _missing(model, f"row {row} is a {type(item).__name__}")
        source, prefix = item
        if not isinstance(source, str) or not isinstance(prefix, str):
            raise _missing(model, f"row {row} is not a pair of texts")
        out[0].append(source)
        out[1].append(prefix)
    return out


def is_pair(model: Any, item: Any) -> bool:
    """Whether ``item`` is one (source, decoder prefix) pair of an encoder-decoder."""
    return (
        is_encoder_decoder(model)
        and isinstance(item, tuple)
        and len(item) == 2
        and all(isinstance(t, str) for t in item)
    )


def check_ids(model: Any, inputs: Mapping[str, Any]) -> None:
    """Refuse a batch of token ids with no ``decoder_input_ids`` on an encoder-decoder."""
    if is_encoder_decoder(model) and "decoder_input_ids" not in inputs:
        raise _missing(model, "the batch of token ids has no decoder_input_ids")


def decoder_batch(model: Any, tokenizer: Any, prefixes: list[str]) -> dict[str, Any]:
    """The decoder's input for ``prefixes``: the start token, then each prefix's tokens
    (no special tokens), padded on the right; as lists, with offsets into the prefix
    and a special-tokens mask (the start token special), for the frames."""
    start = decoder_start(model)
    batch = tokenizer(
        prefixes,
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    rows = [[start, *ids] for ids in batch["input_ids"]]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else start
    return {
        "input_ids": [r + [pad] * (width - len(r)) for r in rows],
        "attention_mask": [[1] * len(r) + [0] * (width - len(r)) for r in rows],
        "offset_mapping": [
            [(0, 0), *(tuple(o) for o in offs)] + [(0, 0)] * (width - len(offs) - 1)
            for offs in batch["offset_mapping"]
        ],
        "special_tokens_mask": [
            [1, *(0 for _ in ids)] + [1] * (width - len(ids) - 1) for ids in batch["input_ids"]
        ],
    }


__all__ = [
    "DecoderInputMissing",
    "check_ids",
    "decoder_batch",
    "decoder_start",
    "is_encoder_decoder",
    "is_pair",
    "pairs",
]
