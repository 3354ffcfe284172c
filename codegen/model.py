"""The typed registry: what `registry lint` makes of the YAML rows, and what `registry
gen`, the docs and the tools read. The one place rows become types (like torchgen's
``model.py``); it imports only the row types of ``causalab_mini.address``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from causalab_mini.address import (
    Address,
    BlockStructure,
    Component,
    FamilyMatch,
    Interior,
    LayerKind,
    StructuralEntry,
    StructureRule,
)

__all__ = ["FamilyDef", "Registry"]


@dataclass(frozen=True)
class FamilyDef:
    name: str
    file: str
    doc: str
    match: FamilyMatch
    rename: tuple[tuple[str, str | bool | tuple[str, ...]], ...]
    # row -> typed field values that differ from the default row (replace()), or a
    # whole new row where the name is not a default row
    overrides: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    new_rows: tuple[tuple[str, Address], ...]
    # why the four interiors do not exist on this family, where they do not
    interiors_unavailable: str | None = None
    # why no block structure applies to this family (the reason of every structural
    # place), where none does
    structure_unknown_reason: str | None = None


@dataclass
class Registry:
    root: Path
    sources: dict[str, bytes] = field(default_factory=dict)
    places: dict[str, Address] = field(default_factory=dict)
    structures: dict[str, BlockStructure] = field(default_factory=dict)
    rules: list[StructureRule] = field(default_factory=list)
    layer_kinds: dict[str, LayerKind] = field(default_factory=dict)
    structural: dict[str, dict[str, StructuralEntry]] = field(default_factory=dict)
    interiors: dict[str, Interior] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict)
    families: list[FamilyDef] = field(default_factory=list)
