"""block_structures.yaml: every identity is in the grammar the checks read (X019: a
row, "w * a", "m @ x", "k * a", or "module(b)" alone) and names only rows a block of
its structure has (the default rows and the structure's own): an identity naming a
row that no block has would never be checked."""

from __future__ import annotations

from causalab_mini.address import identity_term_rows, parse_identity_terms

from .context import Context


def identities(ctx: Context) -> None:
    bs = ctx.file("block_structures.yaml")
    if bs is None or ctx.file("places.yaml") is None:
        return
    d = ctx.disp("block_structures.yaml")
    for structure, spec in bs.data["structures"].items():
        own = set(ctx.reg.structure_places.get(structure, {}))
        known = set(ctx.reg.places) | own
        for i, text in enumerate(spec["identities"]):
            path = ("structures", structure, "identities", i)
            try:
                left, terms = parse_identity_terms(text)
            except ValueError as exc:
                ctx.err(bs, d, path, "X019", structure, f"{exc}; see the file's header")
                continue
            names = [left, *(n for t in terms for n in identity_term_rows(t))]
            unknown = [n for n in dict.fromkeys(names) if n not in known]
            if unknown:
                ctx.err(
                    bs,
                    d,
                    path,
                    "X019",
                    structure,
                    f"identity {text!r} names {', '.join(repr(n) for n in unknown)}, which "
                    f"no {structure} block has (a default row of places.yaml or a row under "
                    f"{structure}'s places): fix the name, or declare the row",
                )
