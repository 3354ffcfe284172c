"""The view of the registry that ``docs/places.md`` and ``docs/families.md`` show.

Built from the same typed rows ``registry gen`` compiles into ``generated/``; the
templates (``places.md.j2``, ``families.md.j2``) hold the layout only.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from causalab_mini.address import Address, Condition, IOType, Unavailable

from .model import FamilyDef, Registry

_IDENTITY = re.compile(r"\w+")


def md(text: object) -> str:
    """Text for one markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def condition_text(when: Condition) -> str:
    if when.kind == "always":
        return "always"
    if when.kind == "attention_probs_disabled":
        return "the model is loaded without enable_attention_probs=True"
    if when.kind == "layer_kind":
        return f"on a layer of kind {when.layer_kind}"
    parts = [f"{k}={v!r}" for k, v in when.config]
    parts += [f"{k}!={v!r}" for k, v in when.config_not]
    return "config " + ", ".join(parts)


@dataclass(frozen=True)
class Refusal:
    when: str
    reason: str


@dataclass(frozen=True)
class PlaceView:
    name: str
    doc: str
    rank: str
    scope: str
    where: str
    write: str
    identities: tuple[tuple[str, str], ...]  # (identity, structures it holds on)
    per_structure: tuple[tuple[str, str, str], ...]  # (structure, short cell, full text)
    refusals: tuple[Refusal, ...]
    extras: tuple[str, ...]  # scale, snapshot, versions, source


def _refusals(items: tuple[Unavailable, ...], name: str) -> tuple[Refusal, ...]:
    return tuple(Refusal(condition_text(u.when), u.message(name)) for u in items)


def _rank(row: Address) -> str:
    if row.per_layer:
        return f"(i, {row.order})"
    return f"(-1, {row.order})" if row.order < 0 else f"(n, {row.order})"


def _extras(row: Address) -> tuple[str, ...]:
    out = []
    if row.source:
        out.append("operations inside the forward: " + " → ".join(f"`{n}`" for n in row.source))
    if row.scale:
        factor = row.scale if isinstance(row.scale, (int, float)) else f"config.{row.scale}"
        out.append(f"multiplied by {factor}")
    if row.heads_through:
        out.append(
            f"computed from `{row.heads_through}` at this module: each head's slice through "
            "its own columns of the module's weight, bias left out (read-only)"
        )
    if row.routing:
        stated = ", ".join(f"{k} {v}" for k, v in row.routing)
        out.append(f"router weights made from the logits as stated: {stated}")
    if row.seq_first:
        out.append("held (seq, batch, ...) by the model: read and written as (batch, seq, ...)")
    if row.leading_positions is not None:
        lead = row.leading_positions
        axes = ", ".join(str(a) for a in lead.axes)
        out.append(
            f"the config.{lead.config} positions the forward puts before the tokens "
            f"(axes {axes}) are left out of reads and kept by writes"
        )
    if row.trailing_streams is not None:
        streams = row.trailing_streams
        axes = ", ".join(str(a) for a in streams.axes)
        out.append(
            f"the config.{streams.config} streams after the tokens' own (axes {axes}) are "
            "left out of reads and kept by writes"
        )
    if row.snapshot:
        out.append("read as a copy (the forward modifies it in place later)")
    if row.write == "in_place":
        out.append(
            "read as a copy: a write overwrites the tensor the block carries on, and a "
            "value read before it keeps what it was"
        )
    if row.read_only:
        out.append(f"read-only: {row.read_only}")
    if row.flat_tokens:
        out.append(
            "held flat by the block, (batch*seq, ...): read as (batch, seq, ...) with the "
            "layer input's batch and sequence, written through the same view"
        )
    for package, spec in row.versions:
        out.append(f"holds for {package} {spec}")
    return tuple(out)


def places(registry: Registry) -> list[PlaceView]:
    structures = list(registry.structures)
    holds: dict[str, list[str]] = {}
    for name, structure in registry.structures.items():
        for text in structure.identities:
            holds.setdefault(text, []).append(name)
    out = []
    for name, row in registry.all_rows().items():
        declared_by = registry.structure_of(name)
        identities = tuple(
            (text, ", ".join(names))
            for text, names in holds.items()
            if name in _IDENTITY.findall(text)
        )
        cells = []
        for structure in structures:
            if declared_by is not None and structure != declared_by:
                cells.append((structure, "—", f"only a {declared_by} block has {name}"))
                continue
            entry = registry.structural.get(name, {}).get(structure)
            required = name in registry.structures[structure].requires_rows
            if entry is not None and entry.reason is not None:
                reason = entry.reason.replace("{place}", name)
                cells.append((structure, "—", reason))
            elif entry is not None:
                names = " · ".join(f"`{c}`" for c in entry.candidates)
                cells.append(
                    (structure, names, f"the one of {', '.join(entry.candidates)} the layer has")
                )
            elif required:
                cells.append(
                    (structure, "✎ family row", "a family of this structure replaces the row")
                )
            else:
                cells.append((structure, "✓", "the default row"))
        extras = _extras(row)
        if declared_by is not None:
            extras = (
                f"a row of {declared_by} blocks only (block_structures.yaml, under "
                f"{declared_by}'s places): a model whose block is not {declared_by} has no "
                f"{name}",
                *extras,
            )
        out.append(
            PlaceView(
                name=name,
                doc=row.doc,
                rank=_rank(row),
                scope="per layer" if row.per_layer else "whole model",
                where=row.describe(),
                write=(
                    "refused"
                    if row.read_only or row.io is IOType.MODULE
                    else "in place"
                    if row.write == "in_place"
                    else "replace"
                ),
                identities=identities,
                per_structure=tuple(cells),
                refusals=_refusals(row.unavailable, name),
                extras=extras,
            )
        )
    return out


@dataclass(frozen=True)
class FamilyRow:
    name: str
    cell: str  # · default, ✎ replaced, ✗ refused always, ~ refused under a condition, + new
    where: str
    changed: str
    refusals: tuple[Refusal, ...]


@dataclass(frozen=True)
class FamilyView:
    name: str
    file: str
    doc: str
    match: str
    structures: str
    structure_short: str
    containers: str
    rows: tuple[FamilyRow, ...]
    interiors_unavailable: str | None
    structure_unknown_reason: str | None = None
    # (interior, where the family reads it, what it holds there) for its own interiors
    interiors: tuple[tuple[str, str, str], ...] = ()
    # (operand, where the checks read it)
    operands: tuple[tuple[str, str], ...] = ()


def _interior_where(registry: Registry, name: str, fields: dict[str, Any]) -> str:
    """``self._attn(`` → arg 0 in ``self_attn.attention``: where a family's interior is."""
    base = registry.interiors.get(name)
    needles = fields.get("needles", base.needles if base else ())
    if "arg" in fields or "returns" in fields:
        arg, returns = fields.get("arg"), fields.get("returns")
    else:
        arg, returns = (base.arg, base.returns) if base else (None, None)
    take = f"argument {arg}" if arg is not None else f"return {returns}"
    module = fields.get("module") or (f"the {base.within} row" if base else "")
    text = " → ".join(f"`{n}`" for n in needles) + f", {take}, in {module}"
    if fields.get("layout"):
        text += f", held {fields['layout']}"
    return text


def _operand_where(operand: Any) -> str:
    if operand.value is not None:
        return f"{operand.value:g}"
    if operand.input is not None:
        return f"the attention module's argument `{operand.input}`"
    if operand.attribute is not None:
        return f"the attention module's `{operand.attribute}`"
    if operand.returns is not None:
        return f"`{operand.needle}` return {operand.returns}"
    parts = [f"argument {operand.arg}"] if operand.arg is not None else []
    if operand.kwarg:
        parts.append(f"keyword `{operand.kwarg}`")
    return f"`{operand.needle}` " + " or ".join(parts)


def _structures_for(registry: Registry, family: FamilyDef) -> str:
    traced = dict(family.rename).get("traced_module")
    if traced:  # its block is the submodule's: the families that match it say which
        return f"the traced submodule `{traced}`'s, as its own families give it"
    found = []
    for rule in registry.rules:
        m = rule.match
        if set(m.model_types) & set(family.match.model_types) or set(m.classes) & set(
            family.match.classes
        ):
            when = ", ".join(f"{k}={v}" for k, v in m.config)
            text = rule.structure + (f" when {when}" if when else "")
            if text not in found:
                found.append(text)
    return "; ".join(found) or "no rule (every structural place is refused)"


def _match(family: FamilyDef) -> str:
    parts = []
    if family.match.model_types:
        parts.append("model_type " + ", ".join(f"`{t}`" for t in family.match.model_types))
    if family.match.classes:
        parts.append("class " + ", ".join(f"`{c}`" for c in family.match.classes))
    if family.match.config:
        parts.append("config " + ", ".join(f"{k}={v}" for k, v in family.match.config))
    return "; ".join(parts)


def _cell(changed: dict[str, Any], row: Address) -> str:
    kinds = {u.when.kind for u in row.unavailable} if "unavailable" in changed else set()
    if "always" in kinds:
        return "✗"
    mark = "✎" if set(changed) - {"doc", "unavailable"} else ""
    if kinds:
        mark += "~"
    return mark or "✎"


def families(registry: Registry) -> list[FamilyView]:
    out = []
    for family in sorted(registry.families, key=lambda f: f.name):
        rows = []
        for name, fields in family.overrides:
            changed = dict(fields)
            base = registry.row(name)
            assert base is not None, name  # lint: a family row replaces a row there is
            row = dataclasses.replace(base, **changed)
            shown = [k for k in changed if k not in ("doc", "unavailable")]
            rows.append(
                FamilyRow(
                    name=name,
                    cell=_cell(changed, row),
                    where=row.describe() if row.io is not IOType.MODULE or shown else "",
                    changed=", ".join(shown),
                    refusals=_refusals(row.unavailable, name) if "unavailable" in changed else (),
                )
            )
        for name, row in family.new_rows:
            rows.append(
                FamilyRow(name, "+", row.describe(), "new row", _refusals(row.unavailable, name))
            )
        out.append(
            FamilyView(
                name=family.name,
                file=family.file,
                doc=family.doc,
                match=_match(family),
                structures=_structures_for(registry, family),
                structure_short=" / ".join(
                    dict.fromkeys(
                        r.structure
                        for r in registry.rules
                        if set(r.match.model_types) & set(family.match.model_types)
                        or set(r.match.classes) & set(family.match.classes)
                    )
                )
                or "—",
                containers=", ".join(f"{k}=`{v}`" for k, v in family.rename),
                rows=tuple(rows),
                interiors_unavailable=(
                    family.interiors_unavailable.replace("{place}", "each interior")
                    if family.interiors_unavailable
                    else None
                ),
                structure_unknown_reason=(
                    family.structure_unknown_reason.replace("{place}", "each structural place")
                    if family.structure_unknown_reason
                    else None
                ),
                interiors=tuple(
                    (
                        name,
                        _interior_where(registry, name, dict(fields))
                        if set(dict(fields)) - {"note"}
                        else "as the default",
                        dict(fields).get("note", ""),
                    )
                    for name, fields in family.interiors
                ),
                operands=tuple((name, _operand_where(o)) for name, o in family.operands),
            )
        )
    return out


def query_notes(views: list[FamilyView]) -> list[tuple[str, str]]:
    """(family, note) where a family's attention_query is not its query projection's
    output as rotated (a query scaled before the call, split from a fused projection)."""
    return [
        (view.name, note)
        for view in views
        for name, _, note in view.interiors
        if name == "attention_query" and note
    ]


def matrix(registry: Registry, views: list[FamilyView]) -> list[tuple[str, list[str]]]:
    """place -> one cell per family (in the order of ``views``)."""
    names = list(registry.all_rows())
    for view in views:
        names += [r.name for r in view.rows if r.name not in names]
    out = []
    for name in names:
        cells = []
        for view in views:
            found = next((r.cell for r in view.rows if r.name == name), "·")
            cells.append(found)
        out.append((name, cells))
    return out


def context(registry: Registry) -> dict[str, Any]:
    views = families(registry)
    return {
        "place_views": places(registry),
        "structure_names": list(registry.structures),
        "structure_defs": registry.structures,
        "interior_defs": registry.interiors,
        "family_views": views,
        "family_matrix": matrix(registry, views),
        "query_notes": query_notes(views),
    }
