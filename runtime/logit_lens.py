"""The logit lens that is the model's own head: ``model.lens(hidden)``.

nnterp's ``project_on_vocab`` is the final norm then the unembedding; a model may do
more after its last block (Gemma-2 soft-caps its logits, Cohere and Granite scale
them, MiniCPM3 divides the stream before the unembedding). The registry says, per
family, what the model applies (``lens`` in places.yaml and the family files:
generated ``DEFAULT_LENS`` and each family's ``lens``), and :func:`apply` runs exactly those
steps, inside a trace (on the values it reads) or outside one (on plain tensors). The
sweep certifies ``lens(layers_output[last]) == logits`` on every architecture; where a
family's head reads more than the stream, the lens is refused with the family's
reason.
"""

from __future__ import annotations

from typing import Any

from causalab_mini.address import IOType, Lens
from causalab_mini.generated import DEFAULT_LENS

from .errors import CausalabError
from .family import families_of


class LensRefused(CausalabError, RuntimeError):
    """The model's logits are not a function of the last block's output alone (or a
    step of its lens cannot be taken on this model); the message says why."""


def lens_of(model: Any) -> Lens:
    """The lens of ``model``: the last of its families that gives one, else the
    default (places.yaml)."""
    found = DEFAULT_LENS
    for family in families_of(model):
        if family.lens is not None:
            found = family.lens
    return found


def _where(model: Any) -> str:
    family = ", ".join(getattr(model, "families", ())) or "none (the default lens)"
    return f"{model.internals.model_class} (family: {family})"


def _refused(model: Any, why: str) -> LensRefused:
    return LensRefused(
        f"model.lens is refused on {_where(model)}: {why}. Read the model's own "
        "logits (model.logits) for the last layer, or the places the head reads"
    )


def _config_value(model: Any, key: str) -> Any:
    config = model.text_config
    if not hasattr(config, key):
        raise _refused(model, f"its lens reads config attribute {key!r}, which the config lacks")
    return getattr(config, key)


def apply(model: Any, hidden: Any) -> Any:
    """The logits the model would make from ``hidden`` standing for its last block's
    output (``layers_output[last]``): every step its lens names, in order."""
    from causalab_mini.internals import child

    lens = lens_of(model)
    if lens.unavailable is not None:
        raise _refused(model, lens.unavailable)
    if not lens.steps:
        raise _refused(model, "the registry gives no lens (places.yaml has no lens:)")
    value = hidden
    for step in lens.steps:
        if step.kind == "apply":
            place = model.internals[step.arg]
            why = place.unavailable_on(None)
            if why is not None:
                raise _refused(model, f"its lens applies {step.arg}, which is refused: {why}")
            row = place.row
            if row.io is not IOType.OUTPUT or row.source or row.select or row.scale:
                raise _refused(
                    model,
                    f"its lens applies {step.arg}, whose row is not a module's plain "
                    f"output ({row.describe()}): no module call gives that place",
                )
            module = child(model, row.module)
            if module is None:
                raise _refused(model, f"{step.arg}'s module {row.module!r} is not in the model")
            value = module(value)
        elif step.kind in ("multiply", "divide"):
            factor = _config_value(model, step.arg)
            if factor is not None:  # as the model: no scale where the config has none
                value = value * factor if step.kind == "multiply" else value / factor
        elif step.kind == "softcap":
            cap = _config_value(model, step.arg)
            if cap is not None:
                value = (value / cap).tanh() * cap
        elif step.kind == "vocab":
            size = _config_value(model, step.arg)
            if size is not None:
                value = value[..., :size]
        else:  # the schema admits no other kind
            raise _refused(model, f"its lens has a step of unknown kind {step.kind!r}")
    return value


__all__ = ["LensRefused", "apply", "lens_of"]
