"""The model: the spec a scaffold builds, the containers nnterp renames, loading
with rows and forcing a structure."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

from causalab_mini.address import Address, Containers, RenameConfig
from causalab_mini.tools.scaffold.data import ScaffoldError


def resolve_spec(arg: str) -> tuple[str, str]:
    """``starcoder2`` -> ``tiny:starcoder2``; ``tiny:...`` as is; a local checkpoint
    directory -> a tiny random instance of its model type, with the boolean and
    string config values that differ from the tiny defaults (they may decide the
    block's structure). Returns (spec, model_type)."""
    from causalab_mini.tools.tiny import TINY_PREFIX, parse_tiny_spec

    if arg.startswith(TINY_PREFIX):
        model_type, _ = parse_tiny_spec(arg)
        return arg, model_type
    path = Path(arg)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ScaffoldError(f"{arg} is a directory without config.json")
        config = json.loads(config_file.read_text())
        model_type = config.get("model_type")
        if not isinstance(model_type, str):
            raise ScaffoldError(f"{config_file} names no model_type")
        overrides = _structural_overrides(model_type, config)
        query = "&".join(f"{k}={_spec_text(v)}" for k, v in sorted(overrides.items()))
        return f"{TINY_PREFIX}{model_type}{'?' + query if query else ''}", model_type
    if "/" in arg or "\\" in arg:
        raise ScaffoldError(
            f"{arg} is not a local directory, and no model hub is reachable: pass a "
            "checkpoint directory, a model type (starcoder2) or tiny:<model_type>"
        )
    return f"{TINY_PREFIX}{arg}", arg


def family_name(model_type: str, family: str | None = None) -> str:
    """The family's name: ``family``, or the model type in lower_snake_case."""
    name = family or re.sub(r"[^a-z0-9_]", "_", model_type.lower())
    if not re.match(r"^[a-z][a-z0-9_]*$", name):
        raise ScaffoldError(f"family name {name!r} is not lower_snake_case; pass --family NAME")
    return name


def _spec_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _structural_overrides(model_type: str, config: dict[str, Any]) -> dict[str, Any]:
    from causalab_mini.tools.tiny import tiny_config

    tiny = tiny_config(model_type).get_text_config()
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, dict)
    out: dict[str, Any] = {}
    for key, value in text.items():
        if not isinstance(value, bool) or not hasattr(tiny, key):
            continue
        if getattr(tiny, key) != value and not key.startswith(("use_cache", "output_", "return_")):
            out[key] = value
    return out


def quiet() -> None:
    import logging
    import warnings

    from causalab_mini import compat

    compat.install()  # nnterp imports under nnsight 0.8 only through its bridges
    import nnterp  # noqa: F401  (it sets its logger's level when first imported)

    warnings.filterwarnings("ignore")
    for noisy in ("nnterp", "transformers", "torch._subclasses.fake_tensor"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # unannotated in transformers
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers


def detect_containers(hf_model: Any) -> tuple[dict[str, str | bool], list[str]]:
    """The containers nnterp renames, found from the module tree of a transformers
    model: (container -> path, notes on what could not be told)."""
    modules = dict(hf_model.named_modules())
    names = {id(m): n for n, m in modules.items()}
    notes: list[str] = []
    decoder = _decoder_path(hf_model, names)
    layers = _layer_list(
        modules, getattr(hf_model.config.get_text_config(), "num_hidden_layers", None), decoder
    )
    out: dict[str, str | bool] = {}
    prefix = getattr(hf_model, "base_model_prefix", "") or ""
    model_name = prefix if prefix and layers.startswith(prefix + ".") else layers.split(".")[0]
    out["model_name"] = model_name
    out["layers_name"] = layers
    embed = hf_model.get_input_embeddings()
    if embed is not None and id(embed) in names:
        out["embed_name"] = names[id(embed)]
    _sublayers(dict(modules[layers][0].named_children()), out, notes)
    # a wrapper's final norm sits beside its text stack's layers, not beside the towers
    parent = layers.rsplit(".", 1)[0] if "." in layers else model_name
    inner = parent if parent.startswith(model_name + ".") else model_name
    if inner != model_name and not _norms(inner, modules[inner]):
        inner = model_name
    base = modules.get(inner)
    if base is not None:
        _final_norm(inner, base, out, notes)
    head = hf_model.get_output_embeddings()
    if head is not None and id(head) in names:
        out["lm_head_name"] = names[id(head)]
    return out, notes


def _decoder_path(hf_model: Any, names: dict[int, str]) -> str | None:
    """The path of the text decoder transformers' get_decoder() names inside a
    wrapper (a vision or audio tower beside it may hold a module list as long as
    the layers), or None where it names none or the model itself."""
    get_decoder = getattr(hf_model, "get_decoder", None)
    try:
        decoder = get_decoder() if callable(get_decoder) else None
    except Exception:  # a model whose get_decoder is not defined for it
        return None
    path = names.get(id(decoder)) if decoder is not None else None
    return path or None


def _layer_list(modules: dict[str, Any], n_layers: int | None, decoder: str | None = None) -> str:
    """The one module list that holds the layers (outermost, ``n_layers`` long, of
    modules with children); of several, the one inside the text decoder
    (``decoder``, a path) where exactly one is."""
    import torch

    lists = [
        name
        for name, module in modules.items()
        if isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and (n_layers is None or len(module) == n_layers)
        and len(list(module[0].children())) >= 2
    ]
    lists = [n for n in lists if not any(n != o and n.startswith(o + ".") for o in lists)]
    inside = [n for n in lists if decoder and n.startswith(decoder + ".")]
    if len(lists) > 1 and len(inside) == 1:
        lists = inside
    if len(lists) != 1:
        raise ScaffoldError(
            f"cannot tell which module list holds the layers: {', '.join(lists) or 'none'} "
            f"(config.num_hidden_layers = {n_layers})"
        )
    return str(lists[0])


def _sublayers(children: dict[str, Any], out: dict[str, str | bool], notes: list[str]) -> None:
    """The attention and the MLP among the layer's children, into ``out``."""
    attn = [n for n, m in children.items() if re.search(r"attn|attention", type(m).__name__, re.I)]
    if len(attn) == 1:
        out["attn_name"] = attn[0]
    else:
        notes.append(
            f"attention: {'several children look like it: ' + ', '.join(attn) if attn else 'no child looks like it'}"
        )
    mlp = [
        n
        for n, m in children.items()
        if n in ("mlp", "ffn", "feed_forward", "block_sparse_moe")
        or re.search(r"mlp|feedforward|ffn|moe|experts", type(m).__name__, re.I)
    ]
    if len(mlp) == 1:
        out["mlp_name"] = mlp[0]
    elif not mlp:
        out["ignore_mlp"] = True  # nnterp refuses to load a model without one otherwise
        notes.append(
            "no child of the layer is an MLP module (its parts sit in the layer itself, "
            f"as on OPT: {', '.join(children)}), so rename says ignore_mlp: true and the "
            "places on the MLP cannot be found; refuse them with a reason (see opt.yaml)"
        )
    else:
        notes.append(f"MLP: several children look like it: {', '.join(mlp)}")


def _norms(model_name: str, base: Any) -> list[str]:
    """The children of ``base`` that look like norms, as paths."""
    return [
        f"{model_name}.{n}"
        for n, m in base.named_children()
        if re.search(r"norm", type(m).__name__, re.I) or re.match(r"ln|norm", n)
    ]


def _final_norm(model_name: str, base: Any, out: dict[str, str | bool], notes: list[str]) -> None:
    """The final norm among the base model's children, into ``out``."""
    norms = _norms(model_name, base)
    if len(norms) == 1:
        out["ln_final_name"] = norms[0]
    else:
        notes.append(
            f"final norm: {'several candidates: ' + ', '.join(norms) if norms else 'none found'}"
        )


def load(
    spec: str,
    containers: dict[str, str | bool],
    rows: dict[str, Address],
    probs: bool,
    **kwargs: Any,
) -> Any:
    from causalab_mini.model import StandardizedTransformer

    # detect_containers's keys are Containers' fields, each with its field's type (str
    # names, bool flags), which one value type for the dict cannot say
    config = RenameConfig(containers=Containers(**cast(dict[str, Any], containers)), addresses=rows)
    model = StandardizedTransformer(
        spec, rename_config=config, enable_attention_probs=probs, **kwargs
    )
    model.dispatch()
    return model


def force_structure(model: Any, structure: str | None) -> None:
    """Resolve the model's places as if its block were ``structure``."""
    from causalab_mini.internals import Internals

    rows = {name: place.row for name, place in model.internals.places.items()}
    model.block_structure = structure
    model.internals = Internals(model, rows)
