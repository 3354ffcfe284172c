"""block_structures.yaml: structures, layer kinds and the rules that pick a model's
structure (X007 on a rule naming no structure); the rows a structure requires (X007
on one that is not a row); the rows a structure declares, which take no default
row's name (X001) or order (X002), are unique across structures (X001), in forward
order (X011), module rows without source or select (X005)."""

from __future__ import annotations

from typing import Any

from .. import model
from .context import Context


def structures(ctx: Context) -> None:
    """Structures first: other files refer to them."""
    bs = ctx.file("block_structures.yaml")
    if bs is None:
        return
    reg, d = ctx.reg, ctx.disp("block_structures.yaml")
    for name, raw in bs.data["structures"].items():
        reg.structures[name] = model.block_structure(name, raw)
    for name, raw in bs.data["layer_kinds"].items():
        reg.layer_kinds[name] = model.layer_kind(name, raw)
    for i, raw in enumerate(bs.data["rules"]):
        if "versions" in raw:
            ctx.versions(bs, d, ("rules", i, "versions"), f"rules[{i}]", raw["versions"])
        if raw["structure"] not in reg.structures:
            ctx.err(
                bs,
                d,
                ("rules", i, "structure"),
                "X007",
                f"rules[{i}]",
                f"structure {raw['structure']!r} is not defined; use one of "
                f"{', '.join(reg.structures)} or define it under structures",
            )
            continue
        reg.rules.append(model.structure_rule(raw))


def required_rows_exist(ctx: Context) -> None:
    bs, pl = ctx.file("block_structures.yaml"), ctx.file("places.yaml")
    if bs is None or pl is None:
        return
    d = ctx.disp("block_structures.yaml")
    for name, raw in bs.data["structures"].items():
        for j, row in enumerate(raw.get("requires_rows", ())):
            if row not in ctx.reg.places and row not in ctx.structure_rows_raw:
                ctx.err(
                    bs,
                    d,
                    ("structures", name, "requires_rows", j),
                    "X007",
                    name,
                    f"requires_rows names {row!r}, which is not a row of places.yaml",
                )


def structure_places(ctx: Context) -> None:
    """The rows a structure declares (``places`` under the structure)."""
    bs = ctx.file("block_structures.yaml")
    if bs is None:
        return
    d = ctx.disp("block_structures.yaml")
    defaults = ctx.file("places.yaml") is not None
    default_orders = {
        (raw.get("per_layer", True), raw["order"]): name for name, raw in ctx.rows_raw.items()
    }
    for structure, spec in bs.data["structures"].items():
        declared: dict[str, Any] = {}
        last: int | None = None
        orders: dict[tuple[bool, int], str] = {}
        for i, raw in enumerate(spec.get("places", ())):
            name, path = raw["name"], ("structures", structure, "places", i)
            if defaults and name in ctx.rows_raw:
                ctx.err(
                    bs,
                    d,
                    (*path, "name"),
                    "X001",
                    name,
                    f"{name!r} is a default row of places.yaml; a structure's row adds a "
                    "place the defaults do not have: rename it, or replace the default row "
                    "in a family file",
                )
                continue
            first = ctx.structure_rows_raw.get(name)
            if first is not None and name not in declared and first[2] == raw:
                # the same row, declared alike by another structure (a YAML alias): one
                # place that blocks of both structures have
                declared[name] = raw
                ctx.structure_row_scopes.setdefault(name, [first[0]]).append(structure)
                ctx.reg.structure_places.setdefault(structure, {})[name] = model.address(raw)
                continue
            if name in ctx.structure_rows_raw or name in declared:
                other = (
                    ctx.structure_rows_raw[name][0] if name in ctx.structure_rows_raw else structure
                )
                ctx.err(
                    bs,
                    d,
                    (*path, "name"),
                    "X001",
                    name,
                    f"a row named {name!r} is already declared by structure {other!r} "
                    "with other fields; a row several structures have is declared alike "
                    "by each (a YAML alias), so make them equal or rename one",
                )
                continue
            ctx.row_fields(bs, d, path, name, raw)
            scope = (raw.get("per_layer", True), raw["order"])
            taken = default_orders.get(scope) or orders.get(scope)
            if taken is not None:
                ctx.err(
                    bs,
                    d,
                    (*path, "order"),
                    "X002",
                    name,
                    f"order {raw['order']} is already taken by {taken!r} "
                    f"({'inside a layer' if scope[0] else 'among whole-model places'}); a "
                    "structure's row goes in a gap the default rows leave",
                )
            orders[scope] = name
            if last is not None and raw["order"] <= last:
                ctx.err(
                    bs,
                    d,
                    (*path, "order"),
                    "X011",
                    name,
                    f"order {raw['order']} comes after {last} in {structure}'s places; rows "
                    "are listed in forward order, so move the row or fix its order",
                )
            last = raw["order"]
            if raw["io"] == "module" and (raw.get("source") or raw.get("select")):
                ctx.err(
                    bs,
                    d,
                    (*path, "io"),
                    "X005",
                    name,
                    "a module row (io: module) names the module itself; drop source and "
                    "select, or say input or output",
                )
            declared[name] = raw
            ctx.structure_rows_raw[name] = (structure, i, raw)
            ctx.reg.structure_places.setdefault(structure, {})[name] = model.address(raw)
