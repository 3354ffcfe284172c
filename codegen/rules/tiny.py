"""tiny.yaml: sizes that fit together (X018), keep_off naming keys of the generic
table (X007), side inputs that can be made (X020), groups that can each take model
types, the causal LMs' first (X021), tokenizers of a kind the builder knows, naming
chat templates that exist (X023). A model type need not be one the installed
transformers has (an override for a type it lacks is simply not used), so none is
checked against it."""

from __future__ import annotations

from typing import Any

from .. import model
from ..loader import Loaded
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
    for model_type, inputs in data.get("side_inputs", {}).items():
        if model_type in data["not_buildable"]:
            ctx.err(
                ti,
                d,
                ("side_inputs", model_type),
                "X020",
                model_type,
                f"{model_type} has side inputs and is in not_buildable: a type the tiny "
                "builder refuses is never fed them; drop one of the two rows",
                key=True,
            )
        for name, spec in inputs.items():
            paths = [
                dim["config"]
                for dim in spec.get("shape", ())
                if isinstance(dim, dict) and "config" in dim
            ]
            field = "shape"
            if "per_layer_type" in spec:  # @layer in the shape, never in the type list
                paths, field = [spec["per_layer_type"]], "per_layer_type"
            wrong = [p for p in paths if "@layer" in p.split(".")]
            if wrong:
                ctx.err(
                    ti,
                    d,
                    ("side_inputs", model_type, name, field),
                    "X020",
                    model_type,
                    f"side input {name!r} reads {wrong[0]!r}, whose @layer indexes the first "
                    "layer of each layer type: only a shape under per_layer_type may use it "
                    "(the per_layer_type path itself names the whole list)",
                )
    groups = list(data.get("groups", {}).items())
    if groups and groups[0][1]["auto_class"] != "AutoModelForCausalLM":
        name = groups[0][0]
        ctx.err(
            ti,
            d,
            ("groups", name, "auto_class"),
            "X021",
            name,
            f"the first group ({name}) is built with {groups[0][1]['auto_class']}: the first "
            "group is the causal LMs (AutoModelForCausalLM, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), "
            "whose model types every later group leaves to it; put that group first",
        )
    seen: dict[str, str] = {}
    for name, group in groups:
        earlier = seen.setdefault(group["mapping"], name)
        if earlier != name:
            ctx.err(
                ti,
                d,
                ("groups", name, "mapping"),
                "X021",
                name,
                f"group {name} takes the model types of {group['mapping']}, which group "
                f"{earlier} already takes: a model type is in the first group whose mapping "
                f"has it, so {name} would be empty; name another mapping or drop the group",
            )
    _tokenizers(ctx, ti, d, data)
    ctx.reg.tiny = model.tiny(data)


def _tokenizers(ctx: Context, ti: Loaded, d: str, data: dict[str, Any]) -> None:
    """X023: every ``adds`` is one of model.TOKENIZER_KINDS; every chat_template names
    a template of chat_templates. (Whether a template renders is the builder's check:
    parsing Jinja here would import jinja2 on every lint, cached or not.)"""
    import difflib

    kinds = list(model.TOKENIZER_KINDS)

    def kind(path: tuple[Any, ...], row: str, value: str) -> None:
        if value in model.TOKENIZER_KINDS:
            return
        # the same tokens in another order (eos_bos), else the closest spelling
        same = [k for k in kinds if sorted(k.split("_")) == sorted(value.split("_"))]
        close = same or difflib.get_close_matches(value, kinds, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        ctx.err(
            ti,
            d,
            path,
            "X023",
            row,
            f"adds {value!r}, which is not a kind of tiny tokenizer{hint}; write one of "
            "none (adds nothing), bos (a BOS token before the text), eos (an EOS token "
            "after it), bos_eos (both)",
        )

    default = data.get("tokenizer_default")
    if default is not None:
        kind(("tokenizer_default", "adds"), "tokenizer_default", default["adds"])
    templates = data.get("chat_templates", {})
    for model_type, row in data.get("tokenizers", {}).items():
        kind(("tokenizers", model_type, "adds"), model_type, row["adds"])
        name = row.get("chat_template")
        if name is not None and name not in templates:
            known = ", ".join(templates) or "none"
            ctx.err(
                ti,
                d,
                ("tokenizers", model_type, "chat_template"),
                "X023",
                model_type,
                f"chat_template {name!r} is not a template of chat_templates (it holds: "
                f"{known}); add it there or name one of those",
            )
