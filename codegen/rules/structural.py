"""structural.yaml: entries belong to structural rows (X007, X012), every structural
row has an entry (X012) with candidates or a reason for every structure (X003)."""

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
        if place not in reg.places:
            ctx.err(
                st,
                d,
                ("places", place),
                "X007",
                place,
                f"{place!r} is not a row of places.yaml; structural entries belong to "
                'rows whose module is "{name}"',
                key=True,
            )
            continue
        if not reg.places[place].is_structural:
            ctx.err(
                st,
                d,
                ("places", place),
                "X012",
                place,
                f"row {place!r} names a fixed module ({reg.places[place].module!r}); "
                'write module: "{name}" in places.yaml or drop this entry',
                key=True,
            )
            continue
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
            if "reason" in entry:
                ctx.reasons(st, d, ("places", place, structure, "reason"), place, entry["reason"])
            entries[structure] = model.structural_entry(entry)
        for structure in reg.structures:
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
