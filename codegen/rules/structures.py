"""block_structures.yaml: structures, layer kinds and the rules that pick a model's
structure (X007 on a rule naming no structure), and the rows a structure requires
(X007 on one that is not a row)."""

from __future__ import annotations

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
            if row not in ctx.reg.places:
                ctx.err(
                    bs,
                    d,
                    ("structures", name, "requires_rows", j),
                    "X007",
                    name,
                    f"requires_rows names {row!r}, which is not a row of places.yaml",
                )
