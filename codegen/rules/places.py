"""places.yaml, the default rows: unique names (X001), one order per scope (X002), in
forward order (X011), module rows without source or select (X005), and the checks of
every row's fields."""

from __future__ import annotations

from .. import model
from .context import Context


def default_rows(ctx: Context) -> None:
    pl = ctx.file("places.yaml")
    if pl is None:
        return
    d = ctx.disp("places.yaml")
    last: int | None = None
    orders: dict[tuple[bool, int], str] = {}
    for i, raw in enumerate(pl.data["places"]):
        name = raw["name"]
        if name in ctx.rows_raw:
            ctx.err(
                pl,
                d,
                ("places", i, "name"),
                "X001",
                name,
                f"a row named {name!r} is already defined above; rename one",
            )
            continue
        ctx.rows_raw[name] = raw
        ctx.row_fields(pl, d, ("places", i), name, raw)
        per_layer = raw.get("per_layer", True)
        scope = (per_layer, raw["order"])
        if scope in orders:
            ctx.err(
                pl,
                d,
                ("places", i, "order"),
                "X002",
                name,
                f"order {raw['order']} is already taken by {orders[scope]!r} "
                f"({'inside a layer' if per_layer else 'among whole-model places'}); "
                "give each place its own order",
            )
        orders[scope] = name
        if last is not None and raw["order"] <= last:
            ctx.err(
                pl,
                d,
                ("places", i, "order"),
                "X011",
                name,
                f"order {raw['order']} comes after {last} in the file; rows are "
                "listed in forward order, so move the row or fix its order",
            )
        last = raw["order"]
        if raw["io"] == "module" and (raw.get("source") or raw.get("select")):
            ctx.err(
                pl,
                d,
                ("places", i, "io"),
                "X005",
                name,
                "a module row (io: module) names the module itself; drop source and "
                "select, or say input or output",
            )
        ctx.reg.places[name] = model.address(raw)
    if "lens" in pl.data:
        whole = {n for n, row in ctx.reg.places.items() if not row.per_layer}
        ctx.lens(pl, d, ("lens",), "lens", pl.data["lens"], whole)
        ctx.reg.lens = model.lens(pl.data["lens"])
