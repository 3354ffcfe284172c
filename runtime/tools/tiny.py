"""Tiny random checkpoints of transformers causal-LM families, built locally.

No machine here reaches a model hub. A model spec ``tiny:<model_type>`` names a tiny
random checkpoint of any transformers causal-LM family: its config class is shrunk
(few layers, small widths, head counts that divide, a small vocabulary with valid
special ids, few experts, enough layers that families whose layers differ show every
kind), a small byte-level BPE tokenizer is trained in-process on a fixed corpus (it
adds the special tokens the model type's real tokenizer adds, registry/tiny.yaml
tokenizers, and carries its chat template where it has one), and the result is
written with ``save_pretrained`` to a cache directory keyed by model type and
transformers version. Callers then load it through the real
``from_pretrained`` path, like any local directory.

Builds are offline, deterministic (seeded) and take a few seconds. Hub ids and local
directories pass through :func:`resolve_model_spec` unchanged.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
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
    TINY_MOVED,
    TINY_NOT_BUILDABLE,
    TINY_OVERRIDES,
    TINY_SAVED_BY,
    TINY_SHARED_GROUPS,
    TINY_SIDE_INPUTS,
    TINY_SIZES,
    TINY_TOKENIZER_DEFAULT,
    TINY_TOKENIZER_KINDS,
    TINY_TOKENIZERS,
    TINY_VISION_EXTRA,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerFast

__all__ = [
    "BUILDER_VERSION",
    "BUILDS",
    "TINY_PREFIX",
    "TinyBuildError",
    "build_class",
    "build_tiny",
    "cache_root",
    "causal_lm_model_types",
    "draw_norms",
    "group_model_types",
    "group_of",
    "moved_fields",
    "resolve_model_spec",
    "scale_weights",
    "split_member",
    "tiny_config",
    "tiny_tokenizer",
    "tokenizer_row",
]

TINY_PREFIX = "tiny:"
"""Model specs starting with this prefix name a tiny checkpoint: ``tiny:llama``."""

BUILDER_VERSION = 3
"""Bumped whenever a change here changes what gets built; part of the cache key."""

BUILDS = ("default", "moved")
"""The tiny builds of a model type: ``default`` (the shrunk config as it comes) and
``moved`` (registry/tiny.yaml moved: every field that scales, caps, clips, sizes a
head or an expert, or sets an epsilon moved away from its value, every norm drawn
away from identity), spelled ``tiny:<model_type>?build=moved``."""

BUILD_KEY = "build"
"""The query key of a ``tiny:`` spec that names the build (not a config attribute)."""

CACHE_ENV = "CAUSALAB_MINI_CACHE"
MANIFEST = "tiny_build.json"

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


def _thaw(value: Any) -> Any:
    """A generated (read-only) value as the plain data a config constructor takes: a
    mapping becomes a new dict, a tuple a new list."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


# Generic config keys, set only where the config class knows them (as a field or
# through its ``attribute_map``). A key reached only through an alias is skipped
# when its target field is itself a key of this table.
_GENERIC: dict[str, Any] = _thaw(TINY_GENERIC)

# Keys of ``_GENERIC`` whose ``None`` (or 0) default means "feature off": left alone.
_KEEP_OFF = frozenset(TINY_KEEP_OFF)

# Causal-LM model types no tiny text checkpoint can stand for, and why.
_NOT_BUILDABLE: Mapping[str, str] = TINY_NOT_BUILDABLE

# Model types whose causal-LM class is built from a sub-config of the composite
# config (MusicgenForCausalLM from the decoder's): model type -> the sub-config's name.
_BUILD_FROM: Mapping[str, str] = TINY_BUILD_FROM

# Model types whose forward needs keyword inputs beside the token ids (a drafter's
# target states): input name -> how to make it from the loaded config.
_SIDE_INPUTS: Mapping[str, Mapping[str, Any]] = TINY_SIDE_INPUTS

# Sub-configs that are not the language model: shrunk with the same generic table
# plus these keys.
_VISION_EXTRA: dict[str, Any] = _thaw(TINY_VISION_EXTRA)


def _overrides(model_type: str) -> dict[str, Any]:
    """The registry's overrides of ``model_type`` (applied after the generic table;
    names may be aliases), as a fresh dict each time: a config constructor may keep
    or change what it is given."""
    found = TINY_OVERRIDES.get(model_type)
    return _thaw(found) if found is not None else {}


class TinyBuildError(CausalabError):  # type: ignore[misc]  # Any to mypy
    """A family cannot be built tiny here; the message says why."""


# --------------------------------------------------------------------------- paths


def cache_root() -> Path:
    """``$CAUSALAB_MINI_CACHE`` if set, else ``~/.cache/causalab_mini``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "causalab_mini"


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


def _recipe(model_type: str) -> dict[str, Any]:
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
    if model_type in _SIDE_INPUTS:
        recipe["side_inputs"] = _thaw(_SIDE_INPUTS[model_type])
    if model_type in TINY_CHECKPOINT_FILES:
        recipe["checkpoint_files"] = _thaw(TINY_CHECKPOINT_FILES[model_type])
    if model_type in TINY_SAVED_BY:
        recipe["saved_by"] = list(TINY_SAVED_BY[model_type][:2])
    return recipe


def _checkpoint_name(
    model_type: str, seed: int, overrides: dict[str, Any] | None = None, build: str = "default"
) -> str:
    import hashlib

    import transformers

    name = (
        f"{model_type.replace('/', '+')}-transformers{transformers.__version__}-v{BUILDER_VERSION}"
    )
    recipe = _recipe(model_type)
    if build != "default":  # the build's own table is part of what is built
        recipe["build"] = {"name": build, "moved": _thaw(TINY_MOVED)}
    if recipe:
        key = json.dumps(recipe, sort_keys=True, default=str).encode()
        name += f"-r{hashlib.sha256(key).hexdigest()[:8]}"
    if overrides:
        key = json.dumps(overrides, sort_keys=True).encode()
        name += f"-cfg{hashlib.sha256(key).hexdigest()[:10]}"
    return name if seed == 0 else f"{name}-seed{seed}"


# -------------------------------------------------------------------- model types


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


def _check_model_type(model_type: str) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    group, bare = split_member(model_type)
    if model_type in _NOT_BUILDABLE:  # a member named with its group, alone
        raise TinyBuildError(f"{model_type!r} cannot be built tiny: {_NOT_BUILDABLE[model_type]}")
    if group is not None:
        if group_of(model_type) == group:
            return _check_model_type(bare)
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


# ------------------------------------------------------------------------- config


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
    _check_model_type(model_type)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config_cls = CONFIG_MAPPING[model_type]
    except ImportError as exc:
        raise TinyBuildError(
            f"config class of {model_type!r} needs an extra package: {_first_line(exc)}"
        ) from exc
    try:
        config: PretrainedConfig = _tiny_config_for_class(config_cls, VOCAB)
    except ImportError as exc:
        raise TinyBuildError(
            f"config of {model_type!r} needs an extra package: {_first_line(exc)}"
        ) from exc
    except Exception as exc:
        raise TinyBuildError(
            f"cannot make a small {config_cls.__name__} for {model_type!r}: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    return config


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.split())[:300]


# ---------------------------------------------------------------------- tokenizer

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A tiny model reads a short sentence and
predicts the next word. Language models learn patterns from text: words, numbers,
punctuation and spaces. When Mary and John went to the store, John gave a drink to Mary.
The Eiffel Tower is in Paris, the capital of France. Rome is the capital of Italy and
Berlin is the capital of Germany. One, two, three, four, five, six, seven, eight, nine,
ten. 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024. Hello, world! How are you today? I am fine,
thank you. The cat sat on the mat; the dog slept by the door. Attention heads move
information between positions, and the residual stream carries it from layer to layer.
Every layer adds an update. The weather is nice, so we walk in the park and talk about
science, history, music, art and mathematics. She said that he would come back later
this evening, after the meeting with the team. They were happy because the results
looked good. Good morning! Good night. Please open the window and close the door.
def add(a, b):
    return a + b
for i in range(10):
    print(i)
"""


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


def tiny_tokenizer(model_type: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a fixed in-code corpus (deterministic,
    at most ``VOCAB - RESERVED_IDS`` entries) with left padding, adding around a text
    what ``model_type``'s real tokenizer adds (registry/tiny.yaml tokenizers: nothing
    like GPT-2's, ``<s>`` before it like Llama's, ``</s>`` after it like Pegasus's, or
    both like BART's) and carrying its chat template where the table gives one. No
    ``model_type`` (or one the table does not list): the default kind, ``<s>``
    before the text. The tokenizer says what it adds through its own API:
    ``add_bos_token`` / ``add_eos_token``, and a special-tokens mask that marks
    exactly the added tokens (checked here on a probe text). transformers 5.24 does
    not save the two attributes: loaded back from the checkpoint, the tokenizer adds
    the same tokens (its post-processor is saved) and reports both False, so its
    special-tokens mask, not the attributes, is what to read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    kind, template = tokenizer_row(model_type)
    adds = TINY_TOKENIZER_KINDS[kind]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - RESERVED_IDS,
        min_frequency=1,
        special_tokens=[PAD, BOS, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer)
    before = [BOS] if adds["bos"] else []
    after = [EOS] if adds["eos"] else []
    single = [*before, "$A", *after]
    tok.post_processor = processors.TemplateProcessing(
        single=single,
        pair=[*single, *before, "$B:1", *after],
        special_tokens=[(t, i) for t, i in ((BOS, BOS_ID), (EOS, EOS_ID)) if t in single],
    )
    assert tok.token_to_id(PAD) == PAD_ID and tok.token_to_id(EOS) == EOS_ID
    wrapper: Any = PreTrainedTokenizerFast  # untyped constructor
    fast: PreTrainedTokenizerFast = wrapper(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        padding_side="left",
        model_max_length=MAX_POSITIONS,
        add_bos_token=adds["bos"],
        add_eos_token=adds["eos"],
        chat_template=template,
    )
    _check_tokenizer(fast, model_type, kind, len(before), len(after))
    return fast


def _check_tokenizer(
    tokenizer: Any, model_type: str | None, kind: str, before: int, after: int
) -> None:
    """The built tokenizer adds exactly the kind's tokens, and its special-tokens mask
    marks exactly those (a transformers that rebuilt the post-processor otherwise
    would give a tokenizer of another kind)."""
    probe = "Hello, world!"
    plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
    got = tokenizer(probe, return_special_tokens_mask=True)
    expected = [BOS_ID] * before + plain + [EOS_ID] * after
    mask = [1] * before + [0] * len(plain) + [1] * after
    if got["input_ids"] != expected or got["special_tokens_mask"] != mask:
        raise TinyBuildError(
            f"the tiny tokenizer of {model_type or 'the default kind'!r} should add {kind} "
            f"(registry/tiny.yaml tokenizers) and encodes {probe!r} as {got['input_ids']} "
            f"(special-tokens mask {got['special_tokens_mask']}), not {expected} ({mask})"
        )
    if tokenizer.chat_template is None:
        return
    # the template renders a conversation: each message's text, then the generation
    # prompt after what it renders without one
    chat = [
        {"role": "user", "content": "Hello, world!"},
        {"role": "assistant", "content": "Good morning."},
        {"role": "user", "content": "How are you today?"},
    ]
    try:
        bare = tokenizer.apply_chat_template(chat, tokenize=False)
        prompted = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise TinyBuildError(
            f"the chat template of tiny {model_type!r} (registry/tiny.yaml tokenizers, "
            f"chat_templates) does not render a conversation: {type(exc).__name__}: "
            f"{_first_line(exc)}; fix the template"
        ) from exc
    missing = [m["content"] for m in chat if m["content"] not in bare]
    if missing or not prompted.startswith(bare) or prompted == bare:
        raise TinyBuildError(
            f"the chat template of tiny {model_type!r} (registry/tiny.yaml chat_templates) "
            f"renders {prompted!r}: it must hold every message's text ({missing} are "
            "missing) and add a generation prompt after the conversation"
        )


# -------------------------------------------------------------------------- build


def build_tiny(
    model_type: str,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    build: str = "default",
) -> Path:
    """Build (once) and return the directory of a tiny ``model_type`` checkpoint.

    The checkpoint lives at ``<root>/tiny/<model_type>-transformers<version>-v<N>``
    where ``<root>`` is ``cache_dir`` or :func:`cache_root`; a non-zero ``seed`` adds
    ``-seed<seed>``. It holds the model (float32 safetensors), its config and the
    tokenizer, all written by ``save_pretrained``. Concurrent builders serialise on a
    file lock; the directory appears atomically (built next to it, then renamed).
    ``overrides`` sets config attributes of the text config (``use_parallel_residual``,
    ``residual_multiplier``) and is part of the cache key. ``build`` is one of
    ``BUILDS``: ``moved`` moves the config's scales, caps, head and expert sizes and
    epsilons and draws the norms away from identity (``moved_fields``, ``draw_norms``);
    its manifest records what moved, what was skipped and why, and what had no effect.
    """
    from filelock import FileLock

    if build not in BUILDS:
        raise TinyBuildError(
            f"tiny {model_type!r}: no build {build!r}; the builds are {', '.join(BUILDS)} "
            f"(write tiny:{model_type} or tiny:{model_type}?build=moved)"
        )
    _check_model_type(model_type)
    base = (Path(cache_dir) if cache_dir is not None else cache_root()) / "tiny"
    final = base / _checkpoint_name(model_type, seed, overrides, build)
    if (final / MANIFEST).is_file():
        return final
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / MANIFEST).is_file():
            return final
        if final.exists():  # left by a crash between rename and manifest: rebuild
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=base))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        try:
            from causalab_mini.quiet import quiet

            with quiet():  # no "Writing model shards" / "Loading weights" bars
                _materialize(model_type, tmp, seed, overrides or {}, build)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _materialize(
    model_type: str, out: Path, seed: int, overrides: dict[str, Any], build: str = "default"
) -> None:
    """Write a tiny checkpoint of ``model_type`` into the (empty) directory ``out``."""
    import torch
    import transformers

    started = time.perf_counter()
    member, model_type = model_type, split_member(model_type)[1]
    config = tiny_config(model_type)
    # the config the causal-LM class is built from: the composite config, or the
    # sub-config registry/tiny.yaml names (build_from)
    built = getattr(config, _BUILD_FROM[model_type]) if model_type in _BUILD_FROM else config
    text = built.get_text_config()
    _apply_overrides(model_type, text, overrides)
    tokenizer = tiny_tokenizer(model_type)
    vocab_size = getattr(text, "vocab_size", None)
    if isinstance(vocab_size, int) and len(tokenizer) > vocab_size:
        raise TinyBuildError(
            f"tokenizer of {len(tokenizer)} entries exceeds the vocab of {vocab_size}"
        )
    auto = _causal_lm_class(model_type, member)
    saver = _saving_class(model_type)
    built = built if model_type in _BUILD_FROM else config
    moves: dict[str, Any] = {}
    if build == "moved":
        model, built, moves = _moved_model(model_type, saver or auto, built, tokenizer, seed)
        config = built if model_type not in _BUILD_FROM else config
    else:
        model = _instantiate(model_type, saver or auto, built, seed)
    _save_and_reload(model_type, auto, model, tokenizer, config, out)
    manifest = {
        "model_type": model_type,
        "model_class": type(model).__name__,
        "build_class": build_class(member),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "overrides": overrides,
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.perf_counter() - started, 3),
        "build": build,
        **moves,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------ moved build


@dataclasses.dataclass(frozen=True)
class Move:
    """One config field of the moved build: its path in the text config (dotted
    through nested configs), the value the tiny config gives it, the moved value, and
    the rule's reason."""

    path: str
    old: Any
    new: Any
    why: str


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _moved_value(rule: Mapping[str, Any], value: Any, turn: int) -> Any:
    """The value ``rule`` moves ``value`` to on its ``turn``-th field (None: the rule
    does not apply to a value of this type): a number from the rule's values that is
    not the value; a list of numbers element by element; a boolean negated."""
    if rule["kind"] == "flip":
        return (not value) if isinstance(value, bool) else None
    values = list(rule.get("values") or ())
    if not values:
        return None

    def pick(current: Any, at: int) -> Any:
        for step in range(len(values)):
            candidate = values[(at + step) % len(values)]
            if candidate != current:
                if isinstance(current, int) and float(candidate).is_integer():
                    return int(candidate)
                return candidate
        return None

    if value is None:
        return pick(None, turn) if rule.get("from_none") else None
    if _number(value):
        return pick(value, turn)
    if isinstance(value, (list, tuple)) and value and all(map(_number, value)):
        moved = [pick(v, turn + i) for i, v in enumerate(value)]
        return None if any(m is None for m in moved) else type(value)(moved)
    return None


def moved_fields(config: Any, table: Mapping[str, Any] | None = None) -> list[Move]:
    """The fields of ``config`` (a text config, and the configs it nests as attributes)
    the moved build moves (registry/tiny.yaml moved), in the order of their names: each
    found by the first rule whose pattern its name matches (and exclude does not), with
    the value that rule gives it."""
    from transformers import PretrainedConfig

    table = TINY_MOVED if table is None else table
    rules = list(table.get("rules") or ())
    exclude = re.compile(str(table.get("exclude") or "(?!)"))
    turns: dict[int, int] = {}
    found: list[Move] = []

    def walk(cfg: Any, prefix: str, seen: set[int]) -> None:
        if id(cfg) in seen:
            return
        seen.add(id(cfg))
        held = vars(cfg)
        for key in sorted(held):
            value = held[key]  # as stored: a per-layer attribute's getter may refuse
            if key.startswith("_"):
                continue
            if isinstance(value, PretrainedConfig):
                walk(value, f"{prefix}{key}.", seen)
                continue
            if exclude.search(key):
                continue
            for index, rule in enumerate(rules):
                if not re.search(str(rule["pattern"]), key):
                    continue
                new = _moved_value(rule, value, turns.get(index, 0))
                if new is not None:
                    turns[index] = turns.get(index, 0) + 1
                    found.append(Move(f"{prefix}{key}", value, new, str(rule["why"])))
                break  # the first matching rule decides, even where it moves nothing

    walk(config, "", set())
    return found


def _set_path(config: Any, path: str, value: Any) -> None:
    *parents, key = path.split(".")
    for part in parents:
        config = getattr(config, part)
    setattr(config, key, value)


def draw_norms(model: Any, table: Mapping[str, Any] | None = None) -> int:
    """Every norm of ``model`` (a module whose class name matches registry/tiny.yaml
    moved.norms.pattern) given weights and biases drawn around their init: each of its
    own floating parameters plus seeded normal noise (bias_std for a parameter named
    bias, weight_std otherwise). The same model (same shapes) always gets the same
    draw. Returns how many parameters were drawn."""
    import torch

    norms = (TINY_MOVED if table is None else table)["norms"]
    pattern = re.compile(str(norms["pattern"]), re.IGNORECASE)
    generator = torch.Generator().manual_seed(int(norms["seed"]))
    drawn = 0
    with torch.no_grad():
        for _, module in model.named_modules():
            if not pattern.search(type(module).__name__):
                continue
            for name, param in module.named_parameters(recurse=False):
                if not param.is_floating_point():
                    continue
                std = float(norms["bias_std"] if "bias" in name else norms["weight_std"])
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.add_((noise * std).to(param.dtype))
                drawn += 1
    return drawn


def scale_weights(model: Any, table: Mapping[str, Any] | None = None) -> int:
    """Every floating parameter of ``model`` with two or more axes (projections,
    embeddings, convolutions) multiplied by registry/tiny.yaml moved.weights.scale, so
    that a tiny model's activations are of order one rather than init-sized. Returns
    how many parameters were scaled (a tied weight once)."""
    import torch

    factor = float((TINY_MOVED if table is None else table)["weights"]["scale"])
    scaled = 0
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.dim() >= 2:
                param.mul_(factor)
                scaled += 1
    return scaled


def _moved_model(
    model_type: str, cls: Any, built: Any, tokenizer: Any, seed: int
) -> tuple[Any, Any, dict[str, Any]]:
    """The moved build of ``built`` (the config the class is built from): the model,
    its config, and what the manifest records (moved: path -> [tiny value, moved
    value]; skipped: path -> why; no_effect: the moved fields whose value changes none
    of the smoke batch's logits; norms_drawn)."""
    import copy

    import torch

    candidates = moved_fields(built.get_text_config())
    scaled: list[str | None] = [None]  # why the weights are not scaled (None: they are)

    def attempt(moves: list[Move]) -> tuple[Any, Any, Any, int]:
        config = copy.deepcopy(built)
        text = config.get_text_config()
        for move in moves:
            try:
                _set_path(text, move.path, move.new)
            except Exception as exc:
                raise TinyBuildError(
                    f"the config refuses {move.path}={move.new!r}: {_first_line(exc)}"
                ) from exc
        if moves:
            try:  # what the checkpoint's config.json will be read back as (validated)
                type(config).from_dict(config.to_dict())
            except Exception as exc:
                raise TinyBuildError(
                    f"the config, read back, refuses it: {type(exc).__name__}: {_first_line(exc)}"
                ) from exc
        model = _instantiate(model_type, cls, config, seed)
        if scaled[0] is None:
            scale_weights(model)
        drawn = draw_norms(model)
        part = _traced(model_type, _loaded_part(model_type, model))
        return model, config, _smoke_logits(model_type, part, tokenizer), drawn

    skipped: dict[str, str] = {}
    kept = list(candidates)
    try:
        model, config, logits, drawn = attempt(kept)
    except TinyBuildError:
        try:
            attempt([])
        except TinyBuildError as exc:  # the forward cannot run at scaled weights
            scaled[0] = f"the forward fails with the weights scaled: {_first_line(exc)}"
        kept = []
        for move in candidates:  # alone, each field the config and forward take
            try:
                attempt([move])
            except TinyBuildError as exc:
                skipped[move.path] = f"{move.path}={move.new!r}: {_first_line(exc)}"
                continue
            kept.append(move)
        while True:  # together: drop the last field until they run
            try:
                model, config, logits, drawn = attempt(kept)
                break
            except TinyBuildError as exc:
                if not kept:
                    raise
                last = kept.pop()
                skipped[last.path] = (
                    f"{last.path}={last.new!r}: runs alone but not with the other moved "
                    f"fields: {_first_line(exc)}"
                )
    no_effect = []
    for move in kept:  # a field whose value changes nothing of the forward's logits
        try:
            _, _, without, _ = attempt([m for m in kept if m is not move])
        except TinyBuildError:
            continue
        if without.shape == logits.shape and torch.equal(without, logits):
            no_effect.append(move.path)
    return (
        model,
        config,
        {
            "moved": {m.path: [m.old, m.new] for m in kept},
            "skipped": skipped,
            "no_effect": no_effect,
            "norms_drawn": drawn,
            "weights_scaled": scaled[0] or True,
        },
    )


def _apply_overrides(model_type: str, text: Any, overrides: dict[str, Any]) -> None:
    """Set each override on the text config (which must have the attribute)."""
    for key, value in overrides.items():
        if not hasattr(text, key):
            raise TinyBuildError(
                f"tiny {model_type!r} has no config attribute {key!r} to set; its config "
                f"is {type(text).__name__}"
            )
        _set_override(model_type, text, key, value)


def _causal_lm_class(model_type: str, member: str) -> Any:
    """The transformers class a tiny ``model_type`` (group member ``member``) is built
    with (untyped classmethods)."""
    import transformers

    if model_type in _BUILD_FROM:
        # the causal-LM class of the model type, which AutoModelForCausalLM maps only
        # from the composite config
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    from causalab_mini.compat import loading_class

    return loading_class(build_class(member))


def _saving_class(model_type: str) -> Any:
    """The class registry/tiny.yaml ``saved_by`` says real ``model_type`` checkpoints
    are written by (the tiny one is built and saved with it), as it is built; None where
    the class that loads the checkpoint writes it."""
    from causalab_mini.compat import loading_class

    row = TINY_SAVED_BY.get(model_type)
    return loading_class(row[0]) if row is not None else None


def _loaded_part(model_type: str, model: Any) -> Any:
    """The part of a freshly built ``model`` that its checkpoint loads back as: the
    submodule registry/tiny.yaml ``saved_by`` names, else the model."""
    row = TINY_SAVED_BY.get(model_type)
    if row is None:
        return model
    return model.get_submodule(row[1])


def _instantiate(model_type: str, auto: Any, config: Any, seed: int) -> Any:
    """The model of ``config`` with seeded random weights, in float32, in eval mode
    (built from the sub-config registry/tiny.yaml names where it names one)."""
    import torch
    import transformers

    transformers.set_seed(seed)
    torch.manual_seed(seed)
    try:
        if model_type in _BUILD_FROM:
            model = auto._from_config(config, dtype=torch.float32)
        else:
            model = auto.from_config(config, dtype=torch.float32)
    except ImportError as exc:
        raise TinyBuildError(
            f"model of {model_type!r} needs an extra package: {_first_line(exc)}"
        ) from exc
    except Exception as exc:
        raise TinyBuildError(
            f"cannot instantiate tiny {model_type!r}: {type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    return model.to(torch.float32).eval()


def _save_and_reload(
    model_type: str, auto: Any, model: Any, tokenizer: Any, config: Any, out: Path
) -> None:
    """Save the model and tokenizer into ``out`` and load them back: the same logits,
    or the build fails."""
    import torch

    before = _smoke_logits(
        model_type, _traced(model_type, _loaded_part(model_type, model)), tokenizer
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name, content in TINY_CHECKPOINT_FILES.get(model_type, {}).items():
        torch.save(_thaw(content), out / name)  # a file from_pretrained reads (a table)
    if model.config.model_type not in causal_lm_model_types() and model_type not in _BUILD_FROM:
        # Built from a composite config (emu3, mllama): the model's own config is a
        # text config AutoModelForCausalLM cannot map back; keep the composite one.
        config.save_pretrained(out)
    try:
        reloaded = auto.from_pretrained(out, dtype=torch.float32, **_load_kwargs(model_type))
        reloaded = reloaded.eval()
    except Exception as exc:
        raise TinyBuildError(
            f"tiny {model_type!r} saves but does not load back: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    after = _smoke_logits(model_type, _traced(model_type, reloaded), tokenizer)
    if before.shape != after.shape or not torch.allclose(before, after, atol=1e-4, rtol=1e-4):
        raise TinyBuildError(f"tiny {model_type!r} gives other logits after a save/load round trip")


def _traced(model_type: str, model: Any) -> Any:
    """What a forward of the tiny ``model_type`` runs: the model, or the submodule its
    family traces as the model (``traced_module``: a class with no forward of its own
    that runs the text decoder)."""
    from causalab_mini.classes import traced_module_for
    from causalab_mini.traced import submodule

    path = traced_module_for(model_type)
    return submodule(model, path) if path else model


def _load_kwargs(model_type: str) -> dict[str, Any]:
    """What ``from_pretrained`` is given beside the checkpoint, as the loader gives it:
    the family's ``key_mapping`` (registry/families/*.yaml), where it has one."""
    from causalab_mini.classes import key_mapping_for

    found = key_mapping_for((), model_type, None)
    return {"key_mapping": found} if found else {}


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
            expected = f"what {type(config).__name__} accepts ({_first_line(exc).strip()})"
    raise TinyBuildError(
        f"config override {key}={spec_value} for tiny {model_type!r}: {key} takes "
        f"{expected}, and {value!r} is not one (it is {current!r} by default); write e.g. "
        f"tiny:{model_type}?{key}={str(current).lower() if isinstance(current, bool) else current}"
    )


def _config_path(config: Any, path: str, layer: int | None) -> Any:
    value = config
    for part in path.split("."):
        if part == "@layer":
            if layer is None:
                raise TinyBuildError(f"side input path {path!r} has @layer outside per_layer_type")
            value = value[layer]
        else:
            value = getattr(value, part)
    return value


def side_inputs(
    config: Any, batch: int, seq: int, seed: int = 0, tokens: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The keyword inputs registry/tiny.yaml ``side_inputs`` gives ``config``'s model
    type beside the token ids (empty for most): seeded random normal tensors of the
    shapes the row reads from ``config``, for a token batch of ``batch`` x ``seq`` (a
    constant integer fill, a mask, or values uniform in a range, where the row says
    so), or (``from``) a tensor of the token batch ``tokens`` itself (the encoder's ids
    as an encoder-decoder's decoder_input_ids; with ``channels``, seeded codes after it
    on a new last axis: a text token and its audio codes per position), or
    (``absent``) None, for a token-batch input the forward must not be given."""
    import torch

    rows = _SIDE_INPUTS.get(getattr(config, "model_type", ""), {})
    generator = torch.Generator().manual_seed(seed)

    def size(dim: Any, layer: int | None) -> int:
        if dim == "batch":
            return int(batch)
        if dim == "seq":
            return int(seq)
        if isinstance(dim, int):
            return dim
        # a product: the config value, the token batch's seq, an integer (each where given)
        value = int(dim.get("times", 1)) * (int(seq) if dim.get("seq") else 1)
        if "config" in dim:
            value *= int(_config_path(config, dim["config"], layer))
        return value + int(dim.get("plus", 0))

    def tensor(row: Any, layer: int | None) -> Any:
        dims = [size(dim, layer) for dim in row["shape"]]
        if "fill" in row:  # a mask: every entry the row's integer
            return torch.full(dims, row["fill"], dtype=torch.long)
        if "uniform" in row:  # coordinates, positions: values in [low, high)
            low, high = row["uniform"]
            return low + (high - low) * torch.rand(*dims, generator=generator)
        return torch.randn(*dims, generator=generator)

    def made(row: Any, layer: int | None) -> Any:
        count = row.get("tuple")
        if count is None:
            return tensor(row, layer)
        return tuple(tensor(row, layer) for _ in range(count))

    out: dict[str, Any] = {}
    missing = object()
    for name, row in rows.items():
        if any(getattr(config, k, missing) != v for k, v in (row.get("config") or {}).items()):
            continue  # fed only where the loaded config has these values
        if row.get("absent"):  # a token-batch input the forward must not be given
            out[name] = None
        elif "from" in row:
            if tokens is None or row["from"] not in tokens:
                raise TinyBuildError(
                    f"side input {name!r} of {config.model_type!r} is the token batch's "
                    f"{row['from']!r}, and no token batch holding it was given"
                )
            out[name] = tokens[row["from"]].clone()
            if "channels" in row:  # the tensor, then codes, on a new last axis
                out[name] = _with_codes(out[name], row["channels"], size, generator)
        elif "per_layer_type" in row:
            types = list(_config_path(config, row["per_layer_type"], None))
            out[name] = {kind: made(row, types.index(kind)) for kind in dict.fromkeys(types)}
        else:
            out[name] = made(row, None)
    return out


def _with_codes(tensor: Any, channels: Mapping[str, Any], size: Any, generator: Any) -> Any:
    """``tensor`` as channel 0 of a new last axis, then the row's ``count`` channels of
    seeded random codes in [0, ``below``) (a text token's audio codes, one per
    codebook); ``size`` reads a dimension of the row."""
    import torch

    count, below = size(channels["count"], None), size(channels["below"], None)
    shape = (*tensor.shape, count)
    codes = torch.randint(0, below, shape, generator=generator, dtype=tensor.dtype)
    return torch.cat([tensor.unsqueeze(-1), codes], dim=-1)


_SMOKE_TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world!"]


def _smoke_logits(model_type: str, model: Any, tokenizer: Any) -> Any:
    """Logits of a left-padded batch of two sentences; a family whose forward fails
    or gives non-finite logits never reaches the cache."""
    import torch

    batch = dict(tokenizer(_SMOKE_TEXTS, return_tensors="pt", padding=True))
    rows, seq = batch["input_ids"].shape
    batch.update(side_inputs(model.config, rows, seq, tokens=batch))
    try:
        with torch.no_grad():
            logits = model(**batch).logits
    except Exception as exc:
        raise TinyBuildError(
            f"tiny {model_type!r} builds but its forward fails: "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc
    if not torch.isfinite(logits).all():
        raise TinyBuildError(f"tiny {model_type!r} gives non-finite logits")
    return logits


# ----------------------------------------------------------------------- specs


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


def resolve_model_spec(spec: str) -> str:
    """``tiny:<model_type>[?key=value&...]`` -> the built checkpoint directory;
    anything else (a hub id, a local directory) unchanged."""
    if spec.startswith(TINY_PREFIX):
        model_type, overrides = parse_tiny_spec(spec)
        build = overrides.pop(BUILD_KEY, "default")
        return str(build_tiny(model_type, overrides=overrides or None, build=str(build)))
    return spec
