"""tiny.yaml: sizes that fit together (X018), keep_off naming keys of the generic
table (X007). A model type need not be one the installed transformers has (an
override for a type it lacks is simply not used), so none is checked against it."""

from __future__ import annotations

from .. import model
from .context import Context


def tiny(ctx: Context) -> None:
    ti = ctx.file("tiny.yaml")
    if ti is None:
        return
    d = ctx.disp("tiny.yaml")
    data = ti.data
    sizes = data["sizes"]
    checks = (
        (
            "head_dim",
            sizes["head_dim"] * sizes["heads"] == sizes["hidden"],
            f"head_dim ({sizes['head_dim']}) times heads ({sizes['heads']}) must be hidden "
            f"({sizes['hidden']}); write head_dim: {sizes['hidden'] // sizes['heads']}"
            if sizes["hidden"] % sizes["heads"] == 0
            else f"hidden ({sizes['hidden']}) is not a multiple of heads ({sizes['heads']}); "
            "pick sizes where it is",
        ),
        (
            "kv_heads",
            sizes["heads"] % sizes["kv_heads"] == 0,
            f"heads ({sizes['heads']}) is not a multiple of kv_heads ({sizes['kv_heads']}): "
            "grouped-query attention shares each key/value head among a whole number of "
            "query heads; pick a divisor of heads",
        ),
        (
            "experts_per_token",
            sizes["experts_per_token"] <= sizes["experts"],
            f"experts_per_token ({sizes['experts_per_token']}) exceeds experts "
            f"({sizes['experts']}); a token is routed to at most every expert",
        ),
        (
            "reserved_ids",
            sizes["reserved_ids"] < sizes["vocab"],
            f"reserved_ids ({sizes['reserved_ids']}) must leave the tokenizer part of the "
            f"vocabulary ({sizes['vocab']}); make it smaller",
        ),
    )
    for key, holds, message in checks:
        if not holds:
            ctx.err(ti, d, ("sizes", key), "X018", "sizes", message)
    for i, key in enumerate(data["keep_off"]):
        if key not in data["generic"]:
            ctx.err(
                ti,
                d,
                ("keep_off", i),
                "X007",
                "keep_off",
                f"keep_off names {key!r}, which is not a key of generic; keep_off leaves "
                "generic keys alone where the class defaults them off",
            )
    ctx.reg.tiny = model.tiny(data)
