"""A plan run at every step of ``generate``: ``Plan.generate`` (``causalab_mini.plan``).

Step 0's forward runs the prompt, so its positions resolve on the prompt's content
frame per row, exactly as ``Plan.run`` resolves them. Every later step's forward runs
one new token per row (the key-value cache holds the rest), the token being
generated (the one the step before produced, whose logits give this step's token),
and that token is what ``{"index": -1}`` names there (the last column where no cache
is kept); no other position
names a token of such a step, so any other spec is refused before anything runs.
An address without positions reads each step's whole tensor: the prompt's at step 0,
(batch, 1, ...) after.

It stops where transformers' ``generate`` stops with the same arguments: at EOS (every
row finished) or a stopping criterion, before ``max_new_tokens`` if it comes first, so
``steps`` and ``tokens`` hold the steps it ran. Nothing is added to what the caller
passes but ``logits_to_keep=0`` (step 0's logits cover the prompt, as in a trace);
``min_new_tokens=max_new_tokens`` runs every step whatever is generated.

``generate`` is handed ``input_ids`` and ``attention_mask`` only: transformers'
``generate`` counts ``position_ids`` from the attention mask itself (each left-padded
row from its first real token) and extends them step by step, so the ones
``positions.encode`` makes for one forward are not passed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import compat
from .engines import NnsightEngine
from .errors import CausalabError, RemoteRefused
from .lower import Target, lower
from .positions import (
    Encoded,
    Position,
    PositionError,
    check_frame,
    encode,
    parse,
    resolve,
    spec_of,
    stacked,
    text_of,
)

# the one token a step after the first has, in either spelling: the last content token
# ({"index": -1}) and the last token of the input ({"anchor": "last"}) are both it
LAST = ((Position(index=-1),), (Position(anchor="last"),))


class GenerationRefused(CausalabError, ValueError):
    """A plan that ``Plan.generate`` cannot run as written, with what to write."""


@dataclass(frozen=True, eq=False)
class Generation:
    """What ``Plan.generate`` returns: ``steps``, one {address: tensor} per generation
    step in order (step 0 ran the prompt), as many as generate ran (it stops at EOS as
    transformers' generate does, at most max_new_tokens); ``tokens``, the generated ids
    (batch, new tokens); ``sequences``, the prompt batch (padding included) followed by
    them, as ``generate`` returns it."""

    steps: tuple[dict[Any, Any], ...]
    tokens: Any
    sequences: Any


def _refuse_positions(plan: Any) -> None:
    """Refuse every position a step after the first does not have: all but
    ``{"index": -1}``, before anything runs."""
    for s in plan.steps:
        spec = s.address.position
        if spec and parse(spec) not in LAST:
            spec = spec_of(parse(spec))
            raise PositionError(
                f"{s.address} in generate: {text_of(spec)} names tokens of the prompt, and at "
                "step 1 and after each step's forward runs one new token per row (the token "
                'being generated), which only {"index": -1} and {"anchor": "last"} name: '
                "read it at step 0, on the prompt (Plan.of(...).run(model, texts) runs that "
                'forward), or address {"index": -1} or {"anchor": "last"}'
            )


def _refuse_whole_writes(plan: Any) -> None:
    for s in plan.steps:
        if s.write and not s.address.position:
            raise GenerationRefused(
                f"{s.address} in generate: a write of the whole tensor puts one value at "
                "every step, and the tensor there is the prompt's at step 0 and (batch, "
                '1, ...) after, so no value fits both: write at {"index": -1} (the token '
                "of each step), or write the whole place in Plan.run on the prompt"
            )


def _refuse_setup(kwargs: Mapping[str, Any]) -> None:
    if kwargs.get("remote") or kwargs.get("backend") is not None:
        raise RemoteRefused(
            "Plan.generate runs on the local nnsight engine only: a plan at generation "
            "steps is not sent to NDIF yet; run it locally (drop remote=/backend=), or "
            "run Plan.run(model, texts, remote=True) on the prompt"
        )
    if not compat.is_08():
        raise GenerationRefused(
            f"Plan.generate steps through generation with nnsight 0.8's tracer.iter, and "
            f"nnsight {compat.nnsight_version()} is installed: install nnsight>=0.8, or run "
            "Plan.run on the prompt (the forward of step 0)"
        )
    for key in ("num_beams", "num_return_sequences"):
        if kwargs.get(key, 1) != 1:
            raise GenerationRefused(
                f"Plan.generate with {key}={kwargs[key]}: the batch generate runs is then "
                "not the prompt batch the positions and tokens are counted on; generate "
                f"with {key}=1"
            )


def _batch(model: Any, inputs: Any, frame: str) -> Encoded:
    check_frame(inputs, frame)
    # generate appends each new token after the batch's last column: the prompt rows are
    # padded on the left, or refused where the family cannot pad a row exactly there
    encoded = (
        inputs if isinstance(inputs, Encoded) else encode(model, inputs, frame, padding_side="left")
    )
    decoder = "decoder_input_ids" in encoded.inputs  # an encoder-decoder's batch
    mask = encoded.inputs["decoder_attention_mask" if decoder else "attention_mask"]
    if mask is not None and not bool(mask[:, -1].all()):
        rows = [r for r in range(mask.shape[0]) if not int(mask[r, -1])]
        what, fix = (
            (
                "decoder prefixes of different lengths",
                "give prefixes of as many tokens, or generate each row alone",
            )
            if decoder
            else ("a right-padded batch", "pad on the left (model.tokenizer.padding_side = 'left')")
        )
        raise GenerationRefused(
            f"Plan.generate on {what} (rows {rows} end in padding): transformers generates "
            f"each row's next token after the batch's last column, which in those rows is "
            f"padding: {fix}"
        )
    return encoded


def _width(model: Any, step: int) -> int:
    """The number of tokens per row the forward of ``step`` (after the first) runs."""
    args, kwargs = model.inputs
    ids = kwargs.get("decoder_input_ids")  # an encoder-decoder's step: the decoder's
    if ids is None:
        ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        raise GenerationRefused(
            f"generate step {step}: the forward was given no input_ids, so the token being "
            "generated cannot be told: generate from text"
        )
    return int(ids.shape[1])


def keeps_logits(model: Any) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (transformers' own test)."""
    supports = getattr(getattr(model, "_model", model), "_supports_logits_to_keep", None)
    return bool(supports()) if callable(supports) else False


def generate(
    plan: Any,
    model: Any,
    inputs: Any,
    *,
    max_new_tokens: int,
    frame: str = "plain",
    **generate_kwargs: Any,
) -> Generation:
    """Run ``plan`` at every step of greedy or sampled generation on ``inputs`` (text,
    or ``positions.encode(model, texts)``): see the module's docstring and
    ``Plan.generate``."""
    import torch

    _refuse_setup(generate_kwargs)
    if type(max_new_tokens) is not int or max_new_tokens < 1:
        raise GenerationRefused(f"max_new_tokens is a positive int, not {max_new_tokens!r}")
    _refuse_positions(plan)
    _refuse_whole_writes(plan)
    encoded = _batch(model, inputs, frame)
    ids = encoded.inputs["input_ids"]
    specs = {s.address.position for s in plan.steps if s.address.position}
    first = {spec: stacked(resolve(model, encoded, spec), spec) for spec in specs}
    last = torch.zeros((ids.shape[0], 1), dtype=torch.long)  # filled at each step
    program0 = lower(plan, model, False, first, target=Target.TRACE)
    program = lower(plan, model, False, dict.fromkeys(specs, last), target=Target.TRACE)
    batch = {"input_ids": ids, "attention_mask": encoded.inputs["attention_mask"]}
    if "decoder_input_ids" in encoded.inputs:  # an encoder-decoder: the decoder's prefix
        ids = encoded.inputs["decoder_input_ids"]
        batch["decoder_input_ids"] = ids
        if encoded.inputs.get("decoder_attention_mask") is not None:
            batch["decoder_attention_mask"] = encoded.inputs["decoder_attention_mask"]
    if keeps_logits(model):
        # generate computes step 0's logits at the last column only (logits_to_keep=1);
        # 0 keeps every prompt position, so that they are the prompt's, as in Plan.run
        generate_kwargs.setdefault("logits_to_keep", 0)

    def at_step(step: int) -> None:
        if specs:
            last.fill_(_width(model, step) - 1)  # the token being generated

    saved, sequences = NnsightEngine().generate(
        model, (program0, program), batch, at_step, max_new_tokens, generate_kwargs
    )
    if sequences is None:
        raise GenerationRefused(
            f"generate ran {len(saved)} steps and returned no sequences: nnsight did not "
            "hand back generate's result; run Plan.run on the prompt instead"
        )
    steps_out = tuple(
        {  # a featurized read returns features (causalab_mini.featurizers)
            a: v if a.featurizer is None else a.featurizer.read(v)
            for a, v in zip(program0.reads, values, strict=True)
        }
        for values in saved
    )
    return Generation(steps=steps_out, tokens=sequences[:, ids.shape[1] :], sequences=sequences)


__all__ = ["Generation", "GenerationRefused", "generate", "keeps_logits"]
