"""What a tiny model type is: the sizes and tables of registry/tiny.yaml, the groups and
classes a model type is built in, its recipe (the registry's overrides and the
family files' facts), and the shrunk config (``tiny_config``) with a ``tiny:`` spec's
own settings (``parse_tiny_spec``)."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from causalab_mini.errors import CausalabError
from causalab_mini.generated.tiny import (
    TINY_BUILD_FROM,
    TINY_BUILDS_WITH,
    TINY_CHAT_TEMPLATES,
    TINY_CHECKPOINT_FILES,
    TINY_GENERIC,
    TINY_GROUPS,
    TINY_KEEP_OFF,
    TINY_NOT_BUILDABLE,
    TINY_OVERRIDES,
    TINY_SAVED_BY,
    TINY_SHARED_GROUPS,
    TINY_SIDE_INPUTS,
    TINY_SIZES,
    TINY_TOKENIZER_DEFAULT,
    TINY_TOKENIZERS,
    TINY_VISION_EXTRA,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig


TINY_PREFIX = "tiny:"
"""Model specs starting with this prefix name a tiny checkpoint: ``tiny:llama``."""


BUILD_KEY = "build"
"""The query key of a ``tiny:`` spec that names the build (not a config attribute)."""


# The tables of registry/tiny.yaml (generated/tiny.py): the sizes, the generic shrink
# table, its keys kept off, the overrides per model type, the model types that cannot
# be built, and the extra keys of non-language sub-configs.
_SIZES = TINY_SIZES


HEADS = _SIZES["heads"]


LAYERS = _SIZES["layers"]


VOCAB = _SIZES["vocab"]


RESERVED_IDS = _SIZES["reserved_ids"]
"""The top ids of the vocabulary, never produced by the tokenizer: model-specific
special ids (image, audio, ... placeholders) that would fall outside go there."""


MAX_POSITIONS = _SIZES["max_positions"]


# Special tokens of the tiny tokenizer, in id order (the ids are the registry's; the
# tokenizer is checked to give them).
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


PAD_ID, BOS_ID, EOS_ID, UNK_ID = _SIZES["pad_id"], _SIZES["bos_id"], _SIZES["eos_id"], 3


def thaw(value: Any) -> Any:
    """A generated (read-only) value as the plain data a config constructor takes: a
    mapping becomes a new dict, a tuple a new list."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


# Generic config keys, set only where the config class knows them (as a field or
# through its ``attribute_map``). A key reached only through an alias is skipped
# when its target field is itself a key of this table.
_GENERIC: dict[str, Any] = thaw(TINY_GENERIC)


# Keys of ``_GENERIC`` whose ``None`` (or 0) default means "feature off": left alone.
_KEEP_OFF = frozenset(TINY_KEEP_OFF)


# Causal-LM model types no tiny text checkpoint can stand for, and why.
_NOT_BUILDABLE: Mapping[str, str] = TINY_NOT_BUILDABLE


# Model types whose causal-LM class is built from a sub-config of the composite
# config (MusicgenForCausalLM from the decoder's): model type -> the sub-config's name.
BUILD_FROM: Mapping[str, str] = TINY_BUILD_FROM


# Model types whose forward needs keyword inputs beside the token ids (a drafter's
# target states): input name -> how to make it from the loaded config.
SIDE_INPUTS: Mapping[str, Mapping[str, Any]] = TINY_SIDE_INPUTS


# Sub-configs that are not the language model: shrunk with the same generic table
# plus these keys.
_VISION_EXTRA: dict[str, Any] = thaw(TINY_VISION_EXTRA)


def _overrides(model_type: str) -> dict[str, Any]:
    """The registry's overrides of ``model_type`` (applied after the generic table;
    names may be aliases), as a fresh dict each time: a config constructor may keep
    or change what it is given."""
    found = TINY_OVERRIDES.get(model_type)
    return thaw(found) if found is not None else {}


class TinyBuildError(CausalabError):  # type: ignore[misc]  # Any to mypy
    """A family cannot be built tiny here; the message says why."""


def split_member(member: str) -> tuple[str | None, str]:
    """``seq2seq/bart`` -> (``seq2seq``, ``bart``): a group member named with its group
    (a model type an earlier group takes with another class, registry/tiny.yaml
    ``shares_model_types``); a bare model type -> (None, it)."""
    group, slash, model_type = member.partition("/")
    return (group, model_type) if slash else (None, member)


def build_class(model_type: str) -> str:
    """The transformers auto class a tiny ``model_type`` is built (and loaded back) with:
    its family's ``auto_class`` (a multimodal wrapper's image-text-to-text class, vision
    tower included), else its group's (registry/tiny.yaml ``groups``); a member named
    with its group (``seq2seq/bart``) is built with that group's class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from causalab_mini.classes import auto_class_for

    group, model_type = split_member(model_type)
    if group is not None:
        return str(TINY_GROUPS[group][1])
    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    auto_class: str = auto_class_for((mapped,) if isinstance(mapped, str) else (), model_type, None)
    return auto_class


def _config_types(model_type: str) -> list[str]:
    """``model_type`` and the model types of its config's sub-configs (a multimodal
    wrapper's text and vision configs), whose override rows shrink them too."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    found = [model_type]
    try:
        config_cls = CONFIG_MAPPING[model_type]
    except (KeyError, ImportError):
        return found
    for name in getattr(config_cls, "sub_configs", None) or {}:
        sub_cls, _ = _sub_config_class(config_cls, name)
        sub_type = str(getattr(sub_cls, "model_type", "") or "")
        if sub_type and sub_type not in found:
            found.append(sub_type)
    return found


def recipe_of(model_type: str) -> dict[str, Any]:
    """What registry/tiny.yaml and the family files say of ``model_type`` alone (the
    override rows of its config and sub-configs, a build class other than
    AutoModelForCausalLM, its row of tokenizers, the side inputs its forward is fed
    when the build is verified): part of the cache key, so that changing a type's own
    rows rebuilds that type and no other."""
    from causalab_mini.classes import DEFAULT_AUTO_CLASS

    recipe: dict[str, Any] = {}
    auto = build_class(model_type)
    model_type = split_member(model_type)[1]
    rows = {t: _overrides(t) for t in _config_types(model_type) if t in TINY_OVERRIDES}
    if rows:
        recipe["overrides"] = rows
    if auto != DEFAULT_AUTO_CLASS:
        recipe["build_class"] = auto
    if model_type in TINY_TOKENIZERS:
        kind, template = tokenizer_row(model_type)
        recipe["tokenizer"] = {"adds": kind, "chat_template": template}
    if model_type in SIDE_INPUTS:
        recipe["side_inputs"] = thaw(SIDE_INPUTS[model_type])
    if model_type in TINY_CHECKPOINT_FILES:
        recipe["checkpoint_files"] = thaw(TINY_CHECKPOINT_FILES[model_type])
    if model_type in TINY_SAVED_BY:
        recipe["saved_by"] = list(TINY_SAVED_BY[model_type][:2])
    return recipe


def causal_lm_model_types() -> list[str]:
    """Sorted model types in transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def group_model_types() -> dict[str, list[str]]:
    """Group (registry/tiny.yaml ``groups``, in order) -> its sorted members: the model
    types of the group's transformers auto mapping that no earlier group takes (a
    mapping the installed transformers lacks gives none), and, in a group that
    ``shares_model_types``, ``<group>/<model_type>`` for each type an earlier group
    takes with another class than this mapping's (the whole encoder-decoder beside its
    decoder alone)."""
    from transformers.models.auto import modeling_auto

    out: dict[str, list[str]] = {}
    taken: dict[str, set[str]] = {}  # model type -> the classes earlier groups load
    for name, (mapping, _, _) in TINY_GROUPS.items():
        table = getattr(modeling_auto, mapping, {})
        types = sorted(set(table) - set(taken))
        shared = []
        if name in TINY_SHARED_GROUPS:
            shared = [
                f"{name}/{t}"
                for t in sorted(set(table) & set(taken))
                if not set(_classes(table[t])) & taken[t]
            ]
        out[name] = types + shared
        for t in table:
            taken.setdefault(t, set()).update(_classes(table[t]))
    return out


def _classes(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def group_of(model_type: str) -> str | None:
    """The group ``model_type`` (or a member ``<group>/<model_type>``) is in (the first
    whose mapping has it), or None."""
    return next((g for g, types in group_model_types().items() if model_type in types), None)


def builds_outside(model_type: str) -> str | None:
    """Why ``model_type`` is not built tiny with the installed transformers, where
    registry/tiny.yaml's builds_with gives the releases its build is verified with and
    the installed one is not among them (None where it is, or no range is given)."""
    if model_type not in TINY_BUILDS_WITH:
        return None
    import transformers
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    spec, why = TINY_BUILDS_WITH[model_type]
    installed = transformers.__version__
    if Version(installed) in SpecifierSet(spec):
        return None
    return (
        f"{model_type!r} cannot be built tiny with transformers {installed}: its build is "
        f"verified with transformers {spec} (registry/tiny.yaml builds_with): {why}"
    )


def check_model_type(model_type: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    group, bare = split_member(model_type)
    if model_type in _NOT_BUILDABLE:  # a member named with its group, alone
        raise TinyBuildError(f"{model_type!r} cannot be built tiny: {_NOT_BUILDABLE[model_type]}")
    if group is not None:
        if group_of(model_type) == group:
            return check_model_type(bare)
        members = [m for m in group_model_types().get(group, []) if "/" in m]
        raise TinyBuildError(
            f"{model_type!r} is not a member of a registry/tiny.yaml group: "
            + (
                f"{group!r} is no group of it (its groups: {', '.join(TINY_GROUPS)})"
                if group not in TINY_GROUPS
                else f"group {group!r} names so only the model types an earlier group "
                f"takes with another class ({', '.join(members) or 'none here'}); "
                f"write tiny:{bare}"
            )
        )
    causal = causal_lm_model_types()
    if model_type in _NOT_BUILDABLE:
        raise TinyBuildError(f"{model_type!r} cannot be built tiny: {_NOT_BUILDABLE[model_type]}")
    outside = builds_outside(model_type)
    if outside is not None:
        raise TinyBuildError(outside)
    if model_type in causal or group_of(model_type) is not None:
        return
    close = difflib.get_close_matches(model_type, causal, n=5, cutoff=0.6)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    if model_type in CONFIG_MAPPING:
        mappings = ", ".join(f"{g} ({m})" for g, (m, _, _) in TINY_GROUPS.items())
        raise TinyBuildError(
            f"model type {model_type!r} is not a causal LM in transformers, nor in another "
            f"group tiny builds (registry/tiny.yaml groups: {mappings}){hint}"
        )
    raise TinyBuildError(f"unknown model type {model_type!r}{hint}")


def _field_defaults(config_cls: type[Any]) -> dict[str, Any]:
    """Field name -> default value of a (dataclass) config class."""
    out: dict[str, Any] = {}
    if dataclasses.is_dataclass(config_cls):
        for f in dataclasses.fields(config_cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
            else:
                out[f.name] = None
        return out
    # Older, non-dataclass configs: read a default instance.
    return dict(vars(config_cls()))


def _shrink_kwargs(
    config_cls: type[Any],
    table: Mapping[str, Any],
    overrides: Mapping[str, Any],
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Constructor kwargs for ``config_cls``: ``base``, then ``table`` limited to keys
    the class knows, then ``overrides``; aliases resolved through ``attribute_map``."""
    defaults = _field_defaults(config_cls)
    aliases: dict[str, str] = dict(getattr(config_cls, "attribute_map", {}) or {})
    kwargs: dict[str, Any] = dict(base or {})
    for key, value in table.items():
        if key in defaults:
            target = key
        elif key in aliases and aliases[key] not in table:
            target = aliases[key]
        else:
            continue
        if target not in defaults:
            continue
        if key in _KEEP_OFF and defaults[target] in (None, 0):
            continue
        kwargs[target] = value
    for key, value in overrides.items():
        kwargs[aliases.get(key, key) if key not in defaults else key] = value
    return kwargs


def _sub_config_class(config_cls: type[Any], name: str) -> tuple[type[Any] | None, dict[str, Any]]:
    """The concrete class of sub-config ``name`` and the kwargs its parent passes it
    (``AutoConfig`` resolved through the declared default model type, else through
    the parent's default instance)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    spec = (getattr(config_cls, "sub_configs_defaults", None) or {}).get(name)
    declared = (getattr(config_cls, "sub_configs", None) or {}).get(name)
    init_kwargs: dict[str, Any] = {}
    if spec is not None:
        declared = spec.config_class
        init_kwargs = dict(getattr(spec, "init_kwargs", None) or {})
        spec_type = getattr(spec, "model_type", None)
        if declared is AutoConfig and spec_type:
            return CONFIG_MAPPING[spec_type], init_kwargs
    if declared is not None and declared is not AutoConfig:
        return declared, init_kwargs
    try:
        default = getattr(config_cls(), name, None)
    except Exception:
        return None, init_kwargs
    return (type(default) if default is not None else None), init_kwargs


def _is_language_sub_config(name: str) -> bool:
    return name in {"text_config", "decoder", "decoder_config", "global_config"} or (
        "text" in name and "encoder" not in name
    )


def _tiny_config_for_class(
    config_cls: type[Any],
    vocab_size: int,
    extra: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
) -> Any:
    """A small instance of ``config_cls``: ``base`` (the kwargs a parent passes), the
    generic table, the overrides of its model type, then ``extra``; sub-configs are
    shrunk too (a dict under a sub-config's name in the overrides adds to that
    sub-config's own overrides)."""
    model_type = str(getattr(config_cls, "model_type", ""))
    table = dict(_GENERIC)
    table["vocab_size"] = vocab_size
    overrides = {**_overrides(model_type), **(extra or {})}
    sub_configs: Mapping[str, type[Any]] = getattr(config_cls, "sub_configs", {}) or {}
    sub_extra = {k: overrides.pop(k) for k in list(overrides) if k in sub_configs}
    if "kv_lora_rank" in _field_defaults(config_cls):
        # Multi-head latent attention expands keys and values to every head and
        # rotates only the rope part of each head.
        table["num_key_value_heads"] = HEADS
        table["head_dim"] = table["qk_rope_head_dim"]
    kwargs = _shrink_kwargs(config_cls, table, overrides, base)
    for name in sub_configs:
        sub_cls, init_kwargs = _sub_config_class(config_cls, name)
        if sub_cls is None:
            continue
        nested = getattr(sub_cls, "sub_configs", None) or {}
        if _is_language_sub_config(name) or any(map(_is_language_sub_config, nested)):
            # a language model's config, or a composite one that holds one (T5Gemma2's
            # encoder: its own text and vision configs), shrunk as a whole config
            kwargs[name] = _tiny_config_for_class(
                sub_cls, vocab_size, sub_extra.get(name), init_kwargs
            )
        else:
            sub_table = {**_GENERIC, **_VISION_EXTRA, "vocab_size": vocab_size}
            sub_type = str(getattr(sub_cls, "model_type", ""))
            sub_overrides = {**_overrides(sub_type), **sub_extra.get(name, {})}
            kwargs[name] = sub_cls(**_shrink_kwargs(sub_cls, sub_table, sub_overrides, init_kwargs))
    config = config_cls(**kwargs)
    patterns = _missing_layer_kinds(config_cls, config, kwargs, base)
    if patterns:
        config = config_cls(**{**kwargs, **patterns})
    _fix_token_ids(config, vocab_size)
    return config


# Per-layer pattern fields: a tiny model must show every kind the full-size one has.
_PATTERN_FIELDS = ("layer_types", "mlp_layer_types", "layers_block_type", "block_types")


def _missing_layer_kinds(
    config_cls: type[Any], config: Any, kwargs: Mapping[str, Any], base: Mapping[str, Any] | None
) -> dict[str, list[Any]]:
    """Pattern fields (``layer_types`` ...) of ``config`` that lost a kind of layer the
    default full-size config has, each mapped to a fixed pattern of the same length:
    the tiny pattern with its tail replaced by the first layer of each missing kind.
    Fields set explicitly (by an override) are left alone."""
    defaults = _field_defaults(config_cls)
    fixed: dict[str, list[Any]] = {}
    reference: Any = None
    for name in _PATTERN_FIELDS:
        if name not in defaults or name in kwargs:
            continue
        tiny = getattr(config, name, None)
        if not isinstance(tiny, (list, tuple)) or not tiny:
            continue
        if reference is None:
            try:
                reference = config_cls(**dict(base or {}))
            except Exception:
                return fixed
        full = getattr(reference, name, None)
        if not isinstance(full, (list, tuple)):
            continue
        missing = [kind for kind in dict.fromkeys(full) if kind not in tiny]
        if not missing or len(missing) >= len(tiny):
            continue
        fixed[name] = [*list(tiny)[: len(tiny) - len(missing)], *missing]
    return fixed


def _fix_token_ids(config: Any, vocab_size: int) -> None:
    """Point every special-token id outside the vocabulary at a valid id: the named
    specials at the tokenizer's ids, other ids (image, audio, ...) at the reserved top
    of the vocabulary, one each."""
    spare = vocab_size - 1
    for key in sorted(vars(config)):
        if not (key.endswith("_token_id") or key.endswith("_token_index")):
            continue
        value = getattr(config, key)
        if isinstance(value, list):
            if any(isinstance(v, int) and v >= vocab_size for v in value):
                setattr(config, key, EOS_ID if "eos" in key else value[0] % vocab_size)
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= vocab_size:
            named = {"bos": BOS_ID, "eos": EOS_ID, "pad": PAD_ID, "unk": UNK_ID}
            for prefix, token_id in named.items():
                if key.startswith(prefix):
                    setattr(config, key, token_id)
                    break
            else:
                setattr(config, key, spare)
                spare -= 1


def tiny_config(model_type: str) -> PretrainedConfig:
    """A small config of ``model_type`` (a causal-LM family of transformers)."""
    check_model_type(model_type)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_cls = CONFIG_MAPPING[model_type]
    except ImportError as exc:
        raise TinyBuildError(
            f"config class of {model_type!r} needs an extra package: {first_line(exc)}"
        ) from exc
    try:
        config: PretrainedConfig = _tiny_config_for_class(config_cls, VOCAB)
    except ImportError as exc:
        raise TinyBuildError(
            f"config of {model_type!r} needs an extra package: {first_line(exc)}"
        ) from exc
    except Exception as exc:
        raise TinyBuildError(
            f"cannot make a small {config_cls.__name__} for {model_type!r}: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return config


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.split())[:300]


def tokenizer_row(model_type: str | None = None) -> tuple[str, str | None]:
    """What the tiny tokenizer of ``model_type`` is (registry/tiny.yaml tokenizers): the
    kind of special tokens it adds (none, bos, eos, bos_eos) and its chat template's
    text (None where it has none). A model type the table does not list, and None, get
    tokenizer_default, without a template."""
    row = TINY_TOKENIZERS.get(model_type) if model_type is not None else None
    if row is None:
        return TINY_TOKENIZER_DEFAULT, None
    name = row.get("chat_template")
    return str(row["adds"]), (TINY_CHAT_TEMPLATES[name] if name is not None else None)


def apply_overrides(model_type: str, text: Any, overrides: dict[str, Any]) -> None:
    """Set each override on the text config (which must have the attribute)."""
    for key, value in overrides.items():
        if not hasattr(text, key):
            raise TinyBuildError(
                f"tiny {model_type!r} has no config attribute {key!r} to set; its config "
                f"is {type(text).__name__}"
            )
        _set_override(model_type, text, key, value)


def _annotation_admits(config: Any, key: str, value: Any) -> bool:
    """Whether the config class's own annotation for ``key`` names the type of
    ``value`` (a field typed ``bool | str`` takes a string whatever its default)."""
    for cls in type(config).__mro__:
        annotation = getattr(cls, "__annotations__", {}).get(key)
        if annotation is not None:
            text = annotation if isinstance(annotation, str) else repr(annotation)
            return type(value).__name__ in re.findall(r"[A-Za-z_]+", text)
    return False


def _set_override(model_type: str, config: Any, key: str, value: Any) -> None:
    """Set ``config.key = value`` from a ``tiny:`` spec, refusing a value whose type the
    attribute does not take (named with the key, the value and the type expected)."""
    current = getattr(config, key)
    spec_value = (
        "none" if value is None else str(value).lower() if isinstance(value, bool) else value
    )
    expected: str | None = None
    if _annotation_admits(config, key, value):
        pass  # the config declares the value's type for the key (gating: bool | str)
    elif isinstance(current, bool):
        expected = None if isinstance(value, bool) else "a boolean (true or false)"
    elif isinstance(current, int):
        expected = None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    elif isinstance(current, float):
        expected = (
            None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
        )
    if expected is None:
        try:
            setattr(config, key, value)
            return
        except Exception as exc:  # the config's own validation (strict dataclasses)
            expected = f"what {type(config).__name__} accepts ({first_line(exc).strip()})"
    raise TinyBuildError(
        f"config override {key}={spec_value} for tiny {model_type!r}: {key} takes "
        f"{expected}, and {value!r} is not one (it is {current!r} by default); write e.g. "
        f"tiny:{model_type}?{key}={str(current).lower() if isinstance(current, bool) else current}"
    )


def _spec_value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_tiny_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``tiny:gpt_neox?use_parallel_residual=false&rotary_pct=0.5`` -> the model type
    and the config overrides (true/false/none, numbers, else strings)."""
    body = spec[len(TINY_PREFIX) :].strip()
    model_type, _, query = body.partition("?")
    if not model_type:
        raise TinyBuildError(f"empty model type in spec {spec!r}")
    overrides: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, eq, value = part.partition("=")
        if not eq or not key.isidentifier():
            raise TinyBuildError(
                f"config override {part!r} in {spec!r} is not key=value (e.g. "
                "tiny:gpt_neox?use_parallel_residual=false)"
            )
        overrides[key] = _spec_value(value)
    return model_type, overrides
