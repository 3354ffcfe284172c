"""The cross-row pass of `registry lint`, one module per group of codes (like Home
Assistant's hassfest): each rule is a function of the lint ``Context`` that adds
diagnostics and fills in the typed registry. ``RULES`` runs in order: a rule may read
what an earlier one built (structures before the rows that name them, rows before
the components that name them)."""

from __future__ import annotations

from collections.abc import Callable

from . import (
    components,
    coverage,
    families,
    identities,
    interiors,
    places,
    structural,
    structures,
    tiny,
    transformer_lens,
)
from .context import Context

Rule = Callable[[Context], None]

RULES: tuple[Rule, ...] = (
    structures.structures,
    places.default_rows,
    structures.structure_places,
    identities.identities,
    structural.candidates,
    structures.required_rows_exist,
    interiors.interiors,
    components.components,
    families.families,
    coverage.required_rows_replaced,
    coverage.every_family_has_a_structure,
    coverage.traced_families_name_no_rows,
    tiny.tiny,
    transformer_lens.transformer_lens,
)


def run(ctx: Context) -> None:
    for rule in RULES:
        rule(ctx)


__all__ = ["RULES", "Context", "Rule", "run"]
