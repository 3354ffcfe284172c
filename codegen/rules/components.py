"""components.yaml: unique names (X001), a row or interior that exists (X007), and a
component that agrees with what it names (X013)."""

from __future__ import annotations

from causalab_mini.address import IOType

from .. import model
from .context import Context


def components(ctx: Context) -> None:
    co = ctx.file("components.yaml")
    if co is None:
        return
    reg, d = ctx.reg, ctx.disp("components.yaml")
    pl, it = ctx.file("places.yaml"), ctx.file("interiors.yaml")
    for i, raw in enumerate(co.data["components"]):
        name = raw["name"]
        if name in reg.components:
            ctx.err(
                co,
                d,
                ("components", i, "name"),
                "X001",
                name,
                f"component {name!r} is already defined above; rename one",
            )
            continue
        if "row" in raw:
            kind, target = "boundary", raw["row"]
            if pl is not None and target not in reg.places:
                ctx.err(
                    co,
                    d,
                    ("components", i, "row"),
                    "X007",
                    name,
                    f"row {target!r} is not in places.yaml; name one of its rows",
                )
                continue
            row = reg.places.get(target)
            per_layer = row.per_layer if row else raw["per_layer"]
            rank = row.order if row else 0
        else:
            kind, target = "interior", raw["interior"]
            if it is not None and target not in reg.interiors:
                ctx.err(
                    co,
                    d,
                    ("components", i, "interior"),
                    "X007",
                    name,
                    f"interior {target!r} is not in interiors.yaml; name one of its "
                    f"interiors ({', '.join(reg.interiors)})",
                )
                continue
            interior = reg.interiors.get(target)
            per_layer, rank = True, interior.order if interior else 0
            row = None
        if raw["per_layer"] != per_layer:
            ctx.err(
                co,
                d,
                ("components", i, "per_layer"),
                "X013",
                name,
                f"per_layer is {raw['per_layer']} but {target} is "
                f"{'per layer' if per_layer else 'whole-model'}; the component table "
                "is what to fix",
            )
        if (raw["per_head"] == "none") != ("layout" not in raw):
            ctx.err(
                co,
                d,
                ("components", i, "per_head"),
                "X013",
                name,
                "a per-head component says how its tensor is held (layout: bhsd, bshd, bsf "
                "or bhsk) and a component that is not per head has no layout",
            )
        if (
            kind == "boundary"
            and row is not None
            and (row.read_only is not None or row.io is IOType.MODULE)
            and raw["writable"]
        ):
            ctx.err(
                co,
                d,
                ("components", i, "writable"),
                "X013",
                name,
                f"writable is true but {target} refuses writes "
                f"({row.read_only or 'it is a module, not a tensor'}); write "
                "'writable: false' with a why_read_only in the component's words",
            )
        if not raw["writable"] and "why_read_only" not in raw:
            ctx.err(
                co,
                d,
                ("components", i, "writable"),
                "X013",
                name,
                "a read-only component says why: add why_read_only with the reason "
                "and what to write instead",
            )
        reg.components[name] = model.component(raw, kind, target, rank)
