"""families/*.yaml: the file is named for its family (X009) and the family is unique
(X001); its rows replace a default place, or add one with 'add: true' (X017) that
gives every field a new place needs (X005) at a free order (X002); a family without a
final norm refuses ln_final_output (X015); reasons fill in only {place} (X010). A row
may replace a row a structure declares: it applies on models of that structure."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from causalab_mini.address import Address

from .. import model
from ..loader import JsonPath
from .context import NEW_ROW_FIELDS, Context


def families(ctx: Context) -> None:
    reg = ctx.reg
    pl = ctx.file("places.yaml")
    seen: dict[str, str] = {}
    for rel, fam in ctx.families:
        d = ctx.disp(rel)
        data = fam.data
        name = data["family"]
        stem = Path(rel).stem
        if name != stem:
            ctx.err(
                fam,
                d,
                ("family",),
                "X009",
                name,
                f"family {name!r} is in {Path(rel).name}; name the file {name}.yaml or "
                f"write family: {stem}",
            )
        if name in seen:
            ctx.err(fam, d, ("family",), "X001", name, f"family {name!r} is also {seen[name]}")
            continue
        seen[name] = rel
        overrides: list[tuple[str, tuple[tuple[str, Any], ...]]] = []
        new_rows: list[tuple[str, Address]] = []
        if "versions" in data["match"]:
            ctx.versions(fam, d, ("match", "versions"), name, data["match"]["versions"])
        for key in ("interiors_unavailable", "structure_unknown_reason"):
            if key in data:
                ctx.reasons(fam, d, (key,), name, data[key])
        if "lens" in data:
            whole = {n for n, row in reg.places.items() if not row.per_layer} | {
                n
                for n, raw in data.get("addresses", {}).items()
                if raw.get("add") and raw.get("per_layer") is False
            }
            ctx.lens(fam, d, ("lens",), name, data["lens"], whole)
        for interior, raw in data.get("interiors", {}).items():
            if "needles" in raw:
                ctx.needles(fam, d, ("interiors", interior, "needles"), name, raw["needles"])
            if "interiors_unavailable" in data:
                ctx.err(
                    fam,
                    d,
                    ("interiors", interior),
                    "X017",
                    f"{name}:{interior}",
                    "the family refuses every interior (interiors_unavailable) and also "
                    "says where this one is: drop one of the two",
                    key=True,
                )
        for key, raw in data.get("operands", {}).items():
            if "needle" in raw:
                ctx.needles(fam, d, ("operands", key, "needle"), name, [raw["needle"]])
        for row, raw in data.get("addresses", {}).items():
            path: JsonPath = ("addresses", row)
            ctx.row_fields(fam, d, path, f"{name}:{row}", raw)
            declared_by = ctx.structure_rows_raw.get(row, (None,))[0]
            known = row in reg.places or declared_by is not None
            if ctx.file("block_structures.yaml") is None and not raw.get("add"):
                known = True  # perhaps a structure's row: its file failed its schema
            if pl is not None and known == bool(raw.get("add")):
                if raw.get("add"):
                    what = (
                        "a default place"
                        if declared_by is None
                        else f"a place of {declared_by} blocks (block_structures.yaml)"
                    )
                    message = (
                        f"{row!r} is {what}, so this row replaces it field by field; "
                        "drop 'add: true' (or give the new place a name of its own)"
                    )
                else:
                    names = [*reg.places, *ctx.structure_rows_raw]
                    close = difflib.get_close_matches(row, names, n=1, cutoff=0.6)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    message = (
                        f"{row!r} is not a default place: {hint}A row here replaces a default "
                        "place of the same name; to add a place of the family's own, say "
                        "'add: true' and give module, io, order and doc"
                    )
                ctx.err(fam, d, path, "X017", f"{name}:{row}", message, key=True)
                continue
            if pl is not None and not known:
                missing = [f for f in NEW_ROW_FIELDS if f not in raw]
                if missing:
                    known_names = ", ".join(reg.places)
                    ctx.err(
                        fam,
                        d,
                        path,
                        "X005",
                        f"{name}:{row}",
                        f"'add: true' makes {row!r} a new place, which must give "
                        f"{', '.join(missing)}; or replace one of: {known_names}",
                        key=True,
                    )
                    continue
                new_rows.append((row, model.address(raw)))
            else:
                overrides.append((row, tuple(model.address_fields(raw).items())))
        if data.get("rename", {}).get("ignore_ln_final"):
            ln_final = data.get("addresses", {}).get("ln_final_output", {})
            if not any(u.get("when") == "always" for u in ln_final.get("unavailable", ())):
                ctx.err(
                    fam,
                    d,
                    ("rename", "ignore_ln_final"),
                    "X015",
                    name,
                    "ignore_ln_final says the model has no final norm, so ln_final_output "
                    "must be refused: give it 'unavailable: [{when: always, reason: ...}]' "
                    "under addresses, naming what to read instead",
                )
        reg.families.append(model.family(data, rel, overrides, new_rows))
        # new rows' orders must not collide with the defaults'
        for row, address in new_rows:
            for other, existing in reg.places.items():
                if existing.per_layer == address.per_layer and existing.order == address.order:
                    ctx.err(
                        fam,
                        d,
                        ("addresses", row, "order"),
                        "X002",
                        f"{name}:{row}",
                        f"order {address.order} is already taken by {other!r}; pick a free order",
                    )
