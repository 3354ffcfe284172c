"""TransformerLens hook names as places: ``place_of(model, "blocks.3.hook_resid_post")``
is the address of that tensor on this model (``locate(model, "block_output", 3)``);
``hook_name_of(address)`` is the name back.

The table is registry data (registry/transformer_lens.yaml, generated into
``causalab_mini.generated.transformer_lens``): a name means one component on every
family, unless the model's block structure or family says otherwise (a post-norm
block's ``attn.hook_out`` is before its post-norm, so it is not the attention's
contribution; a parallel block has no ``hook_resid_mid``). Where TransformerLens's
tensor has no place here (a norm's output before its gain, the values, per-head
results) the name is refused with what the tensor is and the nearest place, which is
never served in its stead. A hook TransformerLens holds per head, (batch, seq, heads,
head_dim), is handed on flat by the component, (batch, seq, heads * head_dim), the
layout SAELens flattens it to."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from causalab_mini.generated.transformer_lens import TL_HOOKS

from ..errors import CausalabError
from ..family import families_of

if TYPE_CHECKING:  # the locator is imported where a place is made (it brings torch)
    from ..locator import ComponentAddress

LAYER = "{layer}"
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


class HookNameRefused(CausalabError, LookupError):
    """A TransformerLens hook name this model cannot serve: unknown, refused on its
    family (what TransformerLens's tensor is, and the nearest place), or naming a
    place the model lacks."""


def split(hook_name: str) -> tuple[str, int | None]:
    """``"blocks.3.hook_z"`` -> (``"blocks.{layer}.hook_z"``, 3); a whole-model name
    has no layer."""
    m = _BLOCK.fullmatch(hook_name)
    if m is None:
        return hook_name, None
    return f"blocks.{LAYER}.{m.group(2)}", int(m.group(1))


def scopes(model: Any = None) -> list[str]:
    """The table's scopes that apply to ``model``, the most specific first: its model
    type, its families (the last matched first), its block structure, the default."""
    if model is None:
        return [""]
    model_type = getattr(model, "model_type", None)
    out = [f"model_type:{model_type}"] if model_type else []
    out += [f"family:{f.name}" for f in reversed(families_of(model))]
    structure = getattr(model, "block_structure", None)
    if structure:
        out.append(f"structure:{structure}")
    return [*out, ""]


def entry(model: Any, pattern: str) -> Mapping[str, Any] | None:
    """What the hook ``pattern`` (``{layer}`` for the index) is on ``model``: its
    table entry from the most specific scope that names it (None: unknown)."""
    for scope in scopes(model):
        found: Mapping[str, Any] | None = TL_HOOKS.get(scope, {}).get(pattern)
        if found is not None:
            return found
    return None


def hook_table(model: Any = None) -> dict[str, Mapping[str, Any]]:
    """Every hook name (``{layer}`` for the index) the table knows, with what it is on
    ``model`` (the default meaning without one)."""
    names = dict.fromkeys(n for scope in scopes(model) for n in TL_HOOKS.get(scope, {}))
    out: dict[str, Mapping[str, Any]] = {}
    for name in names:
        found = entry(model, name)
        if found is not None:
            out[name] = found
    return out


def _on(model: Any) -> str:
    families = ", ".join(f.name for f in families_of(model)) or "no family file"
    structure = getattr(model, "block_structure", None) or "block structure unknown"
    return f"{families} ({structure})"


def place_of(
    model: Any,
    hook_name: str,
    *,
    head: int | None = None,
    position: Any = None,
    featurizer: Any = None,
) -> ComponentAddress:
    """The address of TransformerLens's ``hook_name`` on ``model`` (``head``,
    ``position`` and ``featurizer`` as ``locate`` takes them), or ``HookNameRefused``
    with the reason, the family and what to write instead."""
    from ..locator import locate

    pattern, layer = split(hook_name)
    found = entry(model, pattern)
    if found is None:
        known = list(hook_table(model))
        close = difflib.get_close_matches(pattern, known, n=3)
        hint = f" Did you mean {', '.join(c.replace(LAYER, str(layer)) for c in close)}?"
        raise HookNameRefused(
            f"{hook_name!r} is no TransformerLens hook name the table knows "
            f"(registry/transformer_lens.yaml).{hint if close else ''} Known: {', '.join(known)}"
        )
    if "refused" in found:
        at = "" if layer is None else f", {layer}"
        raise HookNameRefused(
            f"{hook_name} on {_on(model)}: TransformerLens's tensor there is {found['refused']}. "
            f"No place here holds it, and none is put in its stead; the nearest is "
            f"{found['nearest']}: write locate(model, {found['nearest']!r}{at}) if that is "
            "the tensor you mean (a dictionary trained on the hook will not fit it)"
        )
    try:
        return locate(
            model, found["component"], layer, head, position=position, featurizer=featurizer
        )
    except (CausalabError, IndexError) as error:  # a layer the model lacks, a place
        raise HookNameRefused(
            f"{hook_name} is {found['component']} here, and on {_on(model)}: {error}"
        ) from error


def hook_name_of(address: Any, model: Any = None) -> str:
    """TransformerLens's name for ``address`` (a ``ComponentAddress``), as it is on
    ``model`` where one is given (else the meaning every family shares): the shortest
    name that means its component, with its layer. A head's name is its attention
    hook's (head h is index h of TransformerLens's heads axis)."""
    component, layer = address.component, address.layer
    names = [n for n, e in hook_table(model).items() if e.get("component") == component]
    if not names:
        raise HookNameRefused(
            f"{address}: TransformerLens has no hook whose tensor is {component} "
            f"{'on ' + _on(model) if model is not None else 'on every family'}; its hooks "
            "are the places registry/transformer_lens.yaml maps"
        )
    best = min(names, key=lambda n: (n.count("."), names.index(n)))
    return best if layer is None else best.replace(LAYER, str(layer))


__all__ = [
    "HookNameRefused",
    "entry",
    "hook_name_of",
    "hook_table",
    "place_of",
    "scopes",
    "split",
]
