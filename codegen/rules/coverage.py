"""Structures against families: a structure's required rows are replaced by a family
of that structure (X008); every family has a block-structure rule (X014) or says why
none applies, and not both (X016); a family that traces a submodule
(``traced_module``) takes its structure and rows from the submodule's own families,
so it names its config and no container or row of its own (X024)."""

from __future__ import annotations

from .context import Context


def required_rows_replaced(ctx: Context) -> None:
    bs = ctx.file("block_structures.yaml")
    if bs is None:
        return
    reg, d = ctx.reg, ctx.disp("block_structures.yaml")
    for i, raw in enumerate(bs.data["rules"]):
        structure = reg.structures.get(raw["structure"])
        if structure is None or not structure.requires_rows:
            continue
        types = set(raw.get("model_types", ()))
        classes = set(raw.get("classes", ()))
        replaced: set[str] = set()
        for family in reg.families:
            if types & set(family.match.model_types) or classes & set(family.match.classes):
                replaced |= {row for row, _ in family.overrides}
        missing = [row for row in structure.requires_rows if row not in replaced]
        if missing:
            who = ", ".join(sorted(types | classes))
            ctx.err(
                bs,
                d,
                ("rules", i),
                "X008",
                f"rules[{i}]",
                f"{who}: the block is {structure.name}, where the default "
                f"{' and '.join(missing)} name{'s' if len(missing) == 1 else ''} a "
                f"different tensor; a family file matching {who} must replace "
                f"{', '.join(missing)} (see families/gemma2.yaml)",
            )


def every_family_has_a_structure(ctx: Context) -> None:
    bs = ctx.file("block_structures.yaml")
    if bs is None:
        return
    ruled_types = {t for raw in bs.data["rules"] for t in raw.get("model_types", ())}
    ruled_classes = {c for raw in bs.data["rules"] for c in raw.get("classes", ())}
    for rel, fam in ctx.families:
        match = fam.data["match"]
        types = set(match.get("model_types", ()))
        classes = set(match.get("classes", ()))
        name = fam.data["family"]
        ruled = types & ruled_types or classes & ruled_classes
        if ruled and "structure_unknown_reason" in fam.data:
            ctx.err(
                fam,
                ctx.disp(rel),
                ("structure_unknown_reason",),
                "X016",
                name,
                f"structure_unknown_reason says no block structure applies, and a rule in "
                f"block_structures.yaml gives {', '.join(sorted(ruled))} one; drop the "
                "reason or the rule",
            )
        if not types or ruled or "structure_unknown_reason" in fam.data:
            continue
        if "traced_module" in fam.data.get("rename", {}):
            continue  # the traced submodule's own rule gives the structure (X024)
        ctx.err(
            fam,
            ctx.disp(rel),
            ("match", "model_types"),
            "X014",
            name,
            f"no rule in block_structures.yaml gives {', '.join(sorted(types))} a block "
            "structure, so every structural place is refused on it; add a rule "
            "(`registry new-family <model_type>` verifies which structure holds)",
        )


# what a family that traces a submodule may not say itself: the submodule's families do
_TRACED_OWN = (
    "model_name",
    "layers_name",
    "embed_name",
    "attn_name",
    "mlp_name",
    "ln_final_name",
    "lm_head_name",
)


def traced_families_name_no_rows(ctx: Context) -> None:
    for rel, fam in ctx.families:
        rename = fam.data.get("rename", {})
        name = fam.data["family"]
        module, config = rename.get("traced_module"), rename.get("traced_config")
        if (module is None) != (config is None):
            given, missing = ("traced_module", "traced_config")[:: 1 if module else -1]
            ctx.err(
                fam,
                ctx.disp(rel),
                ("rename", given),
                "X024",
                name,
                f"{given} without {missing}: a traced submodule is named by its path "
                "(traced_module) and its config's attribute of the checkpoint's config "
                "(traced_config); give both or neither",
            )
        if module is None:
            continue
        own = [k for k in _TRACED_OWN if k in rename]
        own += ["addresses"] if fam.data.get("addresses") else []
        if own:
            ctx.err(
                fam,
                ctx.disp(rel),
                ("rename", own[0]) if own[0] != "addresses" else ("addresses",),
                "X024",
                name,
                f"the family traces the submodule {module!r}, whose own families give "
                f"its containers and rows, and it names {', '.join(own)}, which would not "
                "apply: move them to the family the submodule matches",
            )
