"""transformer_lens.yaml (X025): every hook names a component of components.yaml (its
nearest one too, where it is refused), a structure of block_structures.yaml or a
family file; no name is given twice in one scope; ``{layer}`` stands in the names of
per-layer components and only there. Fills ``Registry.transformer_lens``: scope ->
hook name -> what it is (each alias its own key)."""

from __future__ import annotations

from typing import Any

from ..loader import JsonPath, Loaded
from .context import Context

FILE = "transformer_lens.yaml"
# a section of the file -> the prefix of its scopes in the generated table
SCOPE = {"structures": "structure", "families": "family", "model_types": "model_type"}


def transformer_lens(ctx: Context) -> None:
    tl = ctx.file(FILE)
    if tl is None:
        return
    data = tl.data
    scopes: list[tuple[str, JsonPath, list[dict[str, Any]]]] = [("", ("hooks",), data["hooks"])]
    known = {"structures": set(ctx.reg.structures), "families": {f.name for f in ctx.reg.families}}
    for section in ("structures", "families", "model_types"):
        for key, hooks in data.get(section, {}).items():
            # a model type need not be one the installed transformers has
            if section in known and key not in known[section]:
                what, where = (
                    ("block structure", "block_structures.yaml")
                    if section == "structures"
                    else ("family", "families/*.yaml")
                )
                msg = f"{key!r} is no {what} of the registry ({where}): name one it has"
                _err(ctx, tl, (section, key), key, msg, key=True)
                continue
            scopes.append((f"{SCOPE[section]}:{key}", (section, key), hooks))
    for scope, path, hooks in scopes:
        ctx.reg.transformer_lens[scope] = _scope(ctx, tl, path, hooks)


def _scope(
    ctx: Context, tl: Loaded, path: JsonPath, hooks: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(hooks):
        name = raw["name"]
        if not _hook_ok(ctx, tl, (*path, i), raw):
            continue
        entry = {k: " ".join(v.split()) if k == "refused" else v for k, v in raw.items()}
        entry.pop("aliases", None)
        for j, spelled in enumerate([name, *raw.get("aliases", [])]):
            if spelled in out:
                where = (*path, i, "name") if j == 0 else (*path, i, "aliases", j - 1)
                _err(ctx, tl, where, name, f"{spelled!r} is given twice here; keep one")
                continue
            out[spelled] = {**entry, "name": name}
    return out


def _hook_ok(ctx: Context, tl: Loaded, at: JsonPath, raw: dict[str, Any]) -> bool:
    """The components a hook names exist, and ``{layer}`` is in its name (and every
    alias) exactly when they are per-layer."""
    name, components = raw["name"], ctx.reg.components
    for key in ("component", "nearest"):
        target = raw.get(key)
        if target is not None and target not in components:
            _err(
                ctx,
                tl,
                (*at, key),
                name,
                f"{key} {target!r} is no component of components.yaml: name one it has",
            )
            return False
    target = str(raw.get("component") or raw.get("nearest"))
    per_layer = components[target].per_layer
    for spelled in [name, *raw.get("aliases", [])]:
        if ("{layer}" in spelled) != per_layer:
            want = "has {layer}" if per_layer else "has no {layer}"
            _err(
                ctx,
                tl,
                (*at, "name"),
                name,
                f"{spelled!r} names {target}, whose name "
                f"{want} (it is {'' if per_layer else 'not '}per layer): fix the name",
            )
            return False
    return True


def _err(
    ctx: Context, tl: Loaded, path: JsonPath, row: str, msg: str, *, key: bool = False
) -> None:
    ctx.err(tl, ctx.disp(FILE), path, "X025", row, msg, key=key)
