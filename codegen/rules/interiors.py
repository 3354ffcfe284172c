"""interiors.yaml: names unique among rows and interiors (X001), call-shaped needles
(X004), version ranges (X006), orders in the gaps the rows leave (X002), and a module
row to look inside (X007); the gate calls' needles call-shaped (X004) and each listed
once (X001)."""

from __future__ import annotations

from .. import model
from .context import NEEDLE, Context


def interiors(ctx: Context) -> None:
    it = ctx.file("interiors.yaml")
    if it is None:
        return
    reg, d = ctx.reg, ctx.disp("interiors.yaml")
    pl = ctx.file("places.yaml")
    rows_raw = ctx.rows_raw
    taken = {raw["order"]: raw["name"] for raw in rows_raw.values() if raw.get("per_layer", True)}
    for name, (_, _, raw) in ctx.structure_rows_raw.items():
        if raw.get("per_layer", True):
            taken.setdefault(raw["order"], name)
    for i, raw in enumerate(it.data["interiors"]):
        name = raw["name"]
        if name in reg.interiors or name in rows_raw or name in ctx.structure_rows_raw:
            ctx.err(
                it,
                d,
                ("interiors", i, "name"),
                "X001",
                name,
                f"{name!r} is already a row or an interior; rename one",
            )
            continue
        ctx.needles(it, d, ("interiors", i, "needles"), name, raw["needles"])
        if "versions" in raw:
            ctx.versions(it, d, ("interiors", i, "versions"), name, raw["versions"])
        if raw["order"] in taken:
            ctx.err(
                it,
                d,
                ("interiors", i, "order"),
                "X002",
                name,
                f"order {raw['order']} is already taken by {taken[raw['order']]!r} inside a "
                "layer; interiors go in the gaps the rows leave",
            )
        taken[raw["order"]] = name
        within = rows_raw.get(raw["within"])
        if pl is not None and (within is None or within["io"] != "module"):
            ctx.err(
                it,
                d,
                ("interiors", i, "within"),
                "X007",
                name,
                f"within names {raw['within']!r}, which is not a module row of places.yaml "
                "(a row with io: module, such as attentions)",
            )
        reg.interiors[name] = model.interior(raw)
    for key, raw in it.data.get("operands", {}).items():
        if "needle" in raw:
            ctx.needles(it, d, ("operands", key, "needle"), f"operands.{key}", [raw["needle"]])
        reg.operands[key] = model.operand(raw)
    seen: set[str] = set()
    for i, raw in enumerate(it.data.get("gates", ())):
        needle = raw["needle"]
        label = f"gates[{i}]"
        if needle in seen:
            ctx.err(
                it,
                d,
                ("gates", i, "needle"),
                "X001",
                label,
                f"gate needle {needle!r} is listed above already; drop one",
            )
            continue
        seen.add(needle)
        if not NEEDLE.match(needle):
            ctx.err(
                it,
                d,
                ("gates", i, "needle"),
                "X004",
                label,
                f"gate needle {needle!r} is not call-shaped: write the callable as it is "
                "called in the source, ending in '(' (e.g. 'torch.sigmoid(')",
            )
            continue
        reg.gates.append((raw["kind"], needle))
