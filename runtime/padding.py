"""Which side a batch of rows of different lengths is padded on, per family.

A row of a batch must be computed as it would be alone. Whether padding on a side
keeps that is a fact of the family's forward (does it count positions from the
``position_ids`` or the attention mask it is given, or over the padded width), which
the sweep's ragged-batch check measures and the family file records
(``left_padding_unavailable`` / ``right_padding_unavailable``, each a reason). Here
the runtime reads it: it pads on the side the tokenizer pads on where that side is
exact for the family, on the other side where only that one is, and refuses a batch
of rows of different lengths where neither is (or where the caller needs a side the
family cannot pad on), with the family's reason and what to do instead."""

from __future__ import annotations

from typing import Any

from .errors import CausalabError

SIDES = ("left", "right")


class PaddingRefused(CausalabError, ValueError):
    """A batch of rows of different lengths that this family cannot pad exactly on the
    side asked for (or on either side), with the reason and the fix."""


def unavailable_sides(model: Any) -> dict[str, str]:
    """Side -> why a row padded there is not computed as the row alone, from the
    model's families (their ``forward`` facts); empty for a model without a resolution
    (a bare tokenizer)."""
    resolution = getattr(model, "resolution", None)
    if resolution is None:
        return {}
    facts = resolution.forward
    found = {
        "left": getattr(facts, "left_padding_unavailable", None),
        "right": getattr(facts, "right_padding_unavailable", None),
    }
    return {side: why for side, why in found.items() if why}


def _families(model: Any) -> str:
    resolution = getattr(model, "resolution", None)
    names = tuple(getattr(resolution, "families", ()) or ())
    return ", ".join(names) or type(getattr(model, "_model", model)).__name__


def exact_side(model: Any, preferred: str) -> str:
    """The side a ragged batch of ``model`` is padded on: ``preferred`` (the
    tokenizer's) where it is exact for the family, else the other side where that one
    is; ``preferred`` where neither is (``side_for`` refuses ragged batches then)."""
    refused = unavailable_sides(model)
    if preferred not in refused:
        return preferred
    other = next(s for s in SIDES if s != preferred)
    return other if other not in refused else preferred


def side_for(model: Any, preferred: str, lengths: list[int], required: str | None = None) -> str:
    """The side to pad rows of ``lengths`` tokens on (``preferred``: the tokenizer's;
    ``required``: a side the caller needs, e.g. generate's left). Rows of one length
    need no padding and take any side. Refused where the family's forward does not
    compute a padded row as the row alone on the side it would be padded on."""
    if len(set(lengths)) <= 1:
        return required or preferred
    refused = unavailable_sides(model)
    side = required or exact_side(model, preferred)
    if side not in refused:
        return side
    reasons = "; ".join(f"{s} padding: {refused[s]}" for s in SIDES if s in refused)
    if required is not None and any(s not in refused for s in SIDES):
        fix = (
            f"give rows of as many tokens, or run them one at a time (a batch of one row "
            f"needs no padding); {required} padding is what this call needs"
        )
    else:
        fix = "give rows of as many tokens, or run them one at a time (a batch of one row)"
    raise PaddingRefused(
        f"a batch of rows of different lengths ({lengths} tokens) on {_families(model)}: "
        f"a row padded on the {side} is not computed as it would be alone ({reasons}): "
        f"{fix}"
    )


__all__ = ["SIDES", "PaddingRefused", "exact_side", "side_for", "unavailable_sides"]
