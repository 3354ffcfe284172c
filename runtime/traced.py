"""A checkpoint whose language model is a submodule of the class that loads it.

Some checkpoints load with a class that has no forward of its own (a speech-and-text
model whose ``generate`` runs a text "thinker", then a speech "talker"): the text is
written by one submodule, which is itself a transformers model with a forward, a
config and layers. A family says so (``rename: traced_module``, the submodule's path,
and ``traced_config``, the attribute of the checkpoint's config its config is): the
checkpoint is loaded whole with its own class, as it was saved (every tensor checked
in), and the named submodule is what is traced and addressed as the model. Its rows
are those of the families its own class and config match; the checkpoint's tokenizer
is the model's.

The loading goes through an auto class of its own (``traced_auto_class``): the
transformers auto class the checkpoint loads with, whose ``from_pretrained`` (the
weights) and ``from_config`` (nnsight's meta build) return the submodule of the
model they build. nnsight is given it as it is given any auto class, so the lazy
meta build and the load at the first trace both yield the submodule.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from .errors import CausalabError


class TracedModuleMissing(CausalabError, ValueError):
    """A family's ``traced_module`` (or ``traced_config``) names something the loaded
    model (or its config) does not have."""


def submodule(model: Any, path: str) -> Any:
    """The submodule of ``model`` at ``path`` (dotted), or ``TracedModuleMissing``
    naming the model's class, the part that is missing and the children it has."""
    found = model
    walked: list[str] = []
    for part in path.split("."):
        children = dict(found.named_children())
        if part not in children:
            where = f"{type(model).__name__}.{'.'.join(walked)}" if walked else type(model).__name__
            raise TracedModuleMissing(
                f"the family's traced_module {path!r} names a submodule "
                f"{type(model).__name__} does not have: {where} has no child {part!r} (its "
                f"children: {', '.join(children) or 'none'}); the text decoder this family "
                "traces is not in this model, so none of its places can be addressed: "
                "name the submodule that runs the text decoder in the family's "
                "traced_module (registry/families/*.yaml, rename), or load a checkpoint "
                "of the class the family describes"
            )
        found = children[part]
        walked.append(part)
    return found


def sub_config(config: Any, name: str, path: str | None = None) -> Any:
    """The config of the traced submodule: the attribute ``name`` of the checkpoint's
    ``config`` (``TracedModuleMissing`` where it has none)."""
    found = getattr(config, name, None)
    if found is None or not hasattr(found, "model_type"):
        raise TracedModuleMissing(
            f"the family traces the submodule {path or '?'!r}, whose config it says is "
            f"{type(config).__name__}.{name} (traced_config), and this checkpoint's config "
            f"has no such sub-config (its sub-configs: "
            f"{', '.join(getattr(config, 'sub_configs', None) or {}) or 'none'}): name the "
            "one the submodule is built from in the family's traced_config"
        )
    return found


@functools.cache
def traced_auto_class(base: Any, path: str) -> type[Any]:
    """A subclass of ``base`` (the class nnsight loads the checkpoint with: a
    transformers auto class, or a concrete class behind its two class methods,
    ``compat.loading_class``) whose ``from_pretrained`` and ``from_config`` build the
    whole model (as ``base`` does) and return its submodule at ``path``. Registered in
    this module under its name, so it pickles by reference."""

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        return submodule(base.from_pretrained(*args, **kwargs), path)

    def from_config(cls: Any, *args: Any, **kwargs: Any) -> Any:
        return submodule(base.from_config(*args, **kwargs), path)

    name = f"{base.__name__}Traced_{path.replace('.', '_')}"
    cls = type(
        name,
        (base,),
        {
            "from_pretrained": classmethod(from_pretrained),
            "from_config": classmethod(from_config),
            "__module__": __name__,
            "__doc__": f"{base.__name__}, returning the loaded model's submodule {path!r}",
            "traced_module": path,
        },
    )
    setattr(sys.modules[__name__], name, cls)
    return cls


def refuse_remote(model_class: str, path: str) -> None:
    """``remote=True`` is refused where a family traces a submodule, with why."""
    raise ValueError(
        f"remote=True cannot trace this model: its family traces the submodule {path!r} "
        f"of {model_class} (traced_module), which this process picks out of the model "
        "its own class loads. A server builds its model from the request's model key "
        "(the checkpoint's id and nnsight's task, with stock transformers classes): it "
        f"would run {model_class}, whose module tree holds the text decoder under "
        f"{path!r} and whose forward is not the decoder's. Run it here (without remote=True)"
    )


__all__ = ["TracedModuleMissing", "refuse_remote", "sub_config", "submodule", "traced_auto_class"]
