"""structural.yaml: entries belong to structural rows (X007, X012), every structural
row has an entry (X012) with candidates or a reason for every structure (X003); a row
a structure declares has an entry for that structure only (X012, X003)."""

from __future__ import annotations

from causalab_mini.address import StructuralEntry

from .. import model
from .context import Context


def candidates(ctx: Context) -> None:
    st, pl = ctx.file("structural.yaml"), ctx.file("places.yaml")
    if st is None or pl is None:
        return
    reg, d = ctx.reg, ctx.disp("structural.yaml")
    for place, per_structure in st.data["places"].items():
        declared_by = ctx.structure_rows_raw.get(place, (None,))[0]
        row = reg.places.get(place) or reg.row(place)
        if row is None and ctx.file("block_structures.yaml") is None:
            continue  # perhaps a structure's row: its file failed its schema
        if row is None:
            ctx.err(
                st,
                d,
                ("places", place),
                "X007",
                place,
                f"{place!r} is not a row of places.yaml or of a structure's places; "
                'structural entries belong to rows whose module is "{name}"',
                key=True,
            )
            continue
        if not row.is_structural:
            where = "places.yaml" if declared_by is None else f"{declared_by}'s places"
            ctx.err(
                st,
                d,
                ("places", place),
                "X012",
                place,
                f"row {place!r} names a fixed module ({row.module!r}); "
                f'write module: "{{name}}" in {where} or drop this entry',
                key=True,
            )
            continue
        # the structures the row exists on: all, or the one that declares it
        scope = (
            list(reg.structures)
            if declared_by is None
            else ctx.structure_row_scopes.get(place, [declared_by])
        )
        entries: dict[str, StructuralEntry] = {}
        for structure, entry in per_structure.items():
            if reg.structures and structure not in reg.structures:
                ctx.err(
                    st,
                    d,
                    ("places", place, structure),
                    "X007",
                    place,
                    f"structure {structure!r} is not defined in block_structures.yaml; "
                    f"use one of {', '.join(reg.structures)}",
                    key=True,
                )
                continue
            if declared_by is not None and structure not in scope:
                ctx.err(
                    st,
                    d,
                    ("places", place, structure),
                    "X012",
                    place,
                    f"{place} is a row of {', '.join(scope)} only (block_structures.yaml "
                    f"declares it under {declared_by}'s places), so a {structure} block "
                    f"never has it; drop the {structure} entry",
                    key=True,
                )
                continue
            if "reason" in entry:
                ctx.reasons(st, d, ("places", place, structure, "reason"), place, entry["reason"])
            entries[structure] = model.structural_entry(entry)
        for structure in scope:
            if structure not in per_structure:
                ctx.err(
                    st,
                    d,
                    ("places", place),
                    "X003",
                    place,
                    f"structure {structure!r} has neither candidates nor a reason for "
                    f"{place}; add '{structure}: {{candidates: [...]}}' or "
                    f"'{structure}: {{reason: ...}}'",
                    key=True,
                )
        reg.structural[place] = entries
    for place, row in reg.places.items():
        if row.is_structural and place not in st.data["places"]:
            i = list(ctx.rows_raw).index(place)
            ctx.err(
                pl,
                ctx.disp("places.yaml"),
                ("places", i, "module"),
                "X012",
                place,
                f"{place} is resolved from the module tree but structural.yaml has no "
                "entry for it; add its candidates per structure there",
            )
    bs = ctx.file("block_structures.yaml")
    for place, (structure, i, raw) in ctx.structure_rows_raw.items():
        if bs is not None and "{name}" in raw["module"] and place not in st.data["places"]:
            ctx.err(
                bs,
                ctx.disp("block_structures.yaml"),
                ("structures", structure, "places", i, "module"),
                "X012",
                place,
                f"{place} is resolved from the module tree but structural.yaml has no "
                f"entry for it; add its candidates on {structure} there",
            )
