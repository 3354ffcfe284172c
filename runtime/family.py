"""What the registry makes of one model: the families that match its classes, model
type and config, their facts merged (then the user's), every row that
applies (the defaults, the rows of its block structure, each matching family's, then
the user's), and its block structure. ``resolve`` is the one place this is decided;
``StandardizedTransformer`` asks it before the load (from the checkpoint's config, for
nnterp's container names) and after it (from the loaded class), and keeps the answer
as ``model.resolution``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from causalab_mini.address import (
    PARTS,
    Address,
    CheckFacts,
    Containers,
    Family,
    ForwardFacts,
    Loading,
    RenameConfig,
)
from causalab_mini.generated import (
    BLOCK_STRUCTURE_RULES,
    DEFAULT_ADDRESSES,
    FAMILIES,
    STRUCTURE_ADDRESSES,
)

# every row some structure declares: a family row that replaces one applies only on a
# model whose block is of that structure
_STRUCTURE_ROWS = frozenset(name for rows in STRUCTURE_ADDRESSES.values() for name in rows)


@dataclass(frozen=True)
class Resolution:
    """The registry's answer for one model (see the module's text)."""

    families: tuple[str, ...]
    rows: Mapping[str, Address]
    structure: str | None
    # the matching families themselves, in registry order (``families`` their names)
    matched: tuple[Family, ...] = ()
    # their facts merged, later families winning, then the user's (``merged``)
    containers: Containers = field(default_factory=Containers)
    loading: Loading = field(default_factory=Loading)
    forward: ForwardFacts = field(default_factory=ForwardFacts)
    checks: CheckFacts = field(default_factory=CheckFacts)


def families_of(model: Any) -> tuple[Family, ...]:
    """The families a loaded model matched (``model.resolution``), in registry order:
    what the locator, the internals and the lens ask a family for."""
    resolution = getattr(model, "resolution", None)
    return resolution.matched if resolution is not None else ()


def structure_for(class_names: tuple[str, ...], model_type: str | None, config: Any) -> str | None:
    """The block structure the first matching rule gives (None: no rule matches)."""
    for rule in BLOCK_STRUCTURE_RULES:
        if rule.match.matches(class_names, model_type, config):
            structure: str = rule.structure
            return structure
    return None


def families_for(class_names: tuple[str, ...], model_type: str | None, config: Any) -> list[str]:
    """The families whose match holds, in registry order."""
    return [
        name
        for name, family in FAMILIES.items()
        if family.match.matches(class_names, model_type, config)
    ]


def merged(families: list[str], user: RenameConfig | None) -> RenameConfig:
    """The families' facts (each part field by field), later ones winning, then the
    user's; no rows (``addresses`` empty)."""
    configs: list[RenameConfig | Family] = [
        *(FAMILIES[f] for f in families),
        *([user] if user else []),
    ]
    parts: dict[str, Any] = {}
    for part, kind in PARTS.items():
        values: dict[str, Any] = {}
        for config in configs:
            given = getattr(config, part)
            for f in dataclasses.fields(given):
                value = getattr(given, f.name)
                if value is not None:
                    values[f.name] = value
        parts[part] = kind(**values)
    return RenameConfig(**parts)


def resolve(
    class_names: tuple[str, ...],
    model_type: str | None,
    config: Any,
    user: RenameConfig | None = None,
) -> Resolution:
    """The families, merged container names, rows and block structure of a model with
    these classes, model type and (text) config, with the user's ``RenameConfig``
    applied last."""
    structure = structure_for(class_names, model_type, config)
    own = STRUCTURE_ADDRESSES.get(structure, {}) if structure is not None else {}
    rows = {**DEFAULT_ADDRESSES, **own}
    families = families_for(class_names, model_type, config)
    for name in families:
        rows.update(
            (row_name, row)
            for row_name, row in FAMILIES[name].addresses.items()
            if row_name not in _STRUCTURE_ROWS or row_name in own
        )
    if user is not None:
        rows.update(user.addresses)
    facts = merged(families, user)
    return Resolution(
        tuple(families),
        rows,
        structure,
        tuple(FAMILIES[name] for name in families),
        facts.containers,
        facts.loading,
        facts.forward,
        facts.checks,
    )


# the Loading fields that say which class loads a checkpoint: of the model that holds a
# traced submodule, never of the submodule's families
_LOADING = ("auto_class", "model_class", "key_mapping")


def resolve_traced(
    outer: Resolution,
    class_names: tuple[str, ...],
    model_type: str | None,
    config: Any,
    user: RenameConfig | None = None,
) -> Resolution:
    """The answer for a submodule traced as the model (``outer``'s families name it:
    ``traced_module``): the rows and block structure of the families the submodule's
    own classes, model type and (text) config match, with the families of the model
    that loads it beside them (what loads the checkpoint: its auto class, the
    submodule's path), theirs winning where both say, then the user's."""
    inner = resolve(class_names, model_type, config, None)
    families = (*inner.families, *(f for f in outer.families if f not in inner.families))
    rows = dict(inner.rows)
    if user is not None:
        rows.update(user.addresses)
    # the checkpoint loads with the class of the model that holds the submodule (its
    # families', else its group's auto class) and their key renamings, never with
    # those the submodule's families name
    loads = merged(list(outer.families), user).loading
    facts = merged(list(families), user)
    return Resolution(
        families,
        rows,
        inner.structure,
        tuple(FAMILIES[name] for name in families),
        facts.containers,
        dataclasses.replace(facts.loading, **{key: getattr(loads, key) for key in _LOADING}),
        facts.forward,
        facts.checks,
    )


__all__ = [
    "Resolution",
    "families_for",
    "families_of",
    "merged",
    "resolve",
    "resolve_traced",
    "structure_for",
]
