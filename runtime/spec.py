"""What a model spec names, checked before anything is loaded.

A spec is ``tiny:<model_type>[?key=value&...]`` (a tiny random checkpoint built
locally), a local checkpoint directory, or a hub id. A mistake in one should cost a
second and say what to write, not end in a hub error about repo-id syntax or half a
minute of retries on a machine with no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .classes import DEFAULT_AUTO_CLASS, auto_class_for, auto_class_maps, group_auto_class
from .errors import CausalabError

TINY_PREFIX = "tiny:"


class ModelSpecError(CausalabError, ValueError):
    """A spec that names nothing loadable here, with what to write instead."""


def _path_like(spec: str) -> bool:
    """Whether ``spec`` is written as a path (a hub id is ``name`` or ``owner/name``)."""
    return (
        spec.startswith(("/", "./", "../", "~", "\\"))
        or spec in (".", "..")
        or spec.count("/") > 1
        or "\\" in spec
    )


def _model_type_hint(spec: str) -> str:
    """A sentence suggesting ``tiny:<spec>`` where ``spec`` is a transformers model type."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:  # pragma: no cover - transformers is a dependency
        return ""
    name = spec.strip().lower().replace("-", "_")
    if name in CONFIG_MAPPING:
        return (
            f" {spec!r} is a transformers model type: write tiny:{name} for a tiny random "
            "checkpoint built locally (no download)."
        )
    return ""


def _local(spec: str) -> str:
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelSpecError(
            f"cannot load {spec}: the directory {str(path)!r} does not exist. Give a "
            "checkpoint directory (one holding config.json), a hub id, or tiny:<model_type>"
        )
    if not path.is_dir():
        raise ModelSpecError(
            f"cannot load {spec}: {str(path)!r} is a file; give the checkpoint's directory "
            "(the one holding config.json)"
        )
    if not (path / "config.json").is_file():
        raise ModelSpecError(
            f"cannot load {spec}: the directory {str(path)!r} holds no config.json, so it "
            "is not a checkpoint (save one with save_pretrained, or give its directory)"
        )
    return str(path)


def _hub(spec: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Check a hub id before transformers retries it: with the hub unreachable (its
    own offline mode, HF_HUB_OFFLINE, or one failed request) a cached copy loads with
    ``local_files_only``, and no cached copy is refused at once."""
    if kwargs.get("local_files_only"):
        return {}
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    revision = kwargs.get("revision")
    cached = isinstance(try_to_load_from_cache(spec, "config.json", revision=revision), str)
    if constants.is_offline_mode():
        why = "the hub's offline mode is on (HF_HUB_OFFLINE)"
    else:
        from huggingface_hub import model_info

        try:
            model_info(spec, revision=revision, timeout=10)
            return {}
        except RepositoryNotFoundError:
            raise ModelSpecError(
                f"cannot load {spec}: the hub has no model {spec!r} (or it is private: log "
                f"in with `hf auth login`).{_model_type_hint(spec)}"
            ) from None
        except Exception as exc:  # no network, DNS, timeout, proxy: unreachable
            if _reached(exc):
                return {}  # the hub answered (gated, rate-limited): transformers decides
            why = f"the hub is not reachable ({type(exc).__name__}: {str(exc).strip()[:120]})"
    if cached:
        return {"local_files_only": True}
    raise ModelSpecError(
        f"cannot load {spec}: {why}, and it is not in the local cache.{_model_type_hint(spec)}"
    )


def _reached(exc: Exception) -> bool:
    """Whether ``exc`` is an HTTP answer from the hub (as opposed to no connection)."""
    response = getattr(exc, "response", None)
    return response is not None and getattr(response, "status_code", None) is not None


def prepare_model_spec(
    spec: str, kwargs: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """``spec`` -> (what ``from_pretrained`` is given, keyword arguments to add), or a
    ModelSpecError saying what is wrong and what to write. A ``tiny:`` spec is built
    (``TinyBuildError`` on a bad one); a local directory must hold a checkpoint; a hub
    id is checked against the hub (or its cache, where the hub is unreachable)."""
    kwargs = kwargs or {}
    if spec.startswith(TINY_PREFIX):
        from causalab_mini.tools.tiny import resolve_model_spec

        path = resolve_model_spec(spec)
        return path, _load_class(path, kwargs)
    if _path_like(spec) or Path(spec).expanduser().exists():
        path = _local(spec)
        return path, _load_class(path, kwargs)
    return spec, _hub(spec, kwargs)


def _load_class(path: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Make AutoModelForCausalLM load a checkpoint whose config class it does not map
    (a decoder saved from its own sub-config, as MusicGen's: transformers maps
    MusicgenForCausalLM only from the composite MusicgenConfig, not from the
    MusicgenDecoderConfig the decoder is built from and saves), where its config.json
    names a transformers class that is a causal LM: that class is registered for the
    config's class (a mapping transformers lacks; nnsight loads through
    AutoModelForCausalLM's from_config and from_pretrained). Never where the caller
    chose the class (``automodel``), nor where a group's auto class maps the model
    type (it loads it). Returns keyword arguments to add (none)."""
    import json

    if "automodel" in kwargs:
        return {}
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return {}
    if group_auto_class(model_type) is not None:
        # another group's auto class maps the model type and loads it (a config class
        # that borrows another model type's class: PP-Chart2Table's config with
        # GOT-OCR2's class, whose config_class register() would refuse)
        return {}
    names = config.get("architectures") or []
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    chosen = next((n for n in names if isinstance(n, str) and n in causal), None)
    if chosen is None:
        return {}
    import transformers

    config_class = type(AutoConfig.for_model(model_type))
    # exist_ok: transformers skips a mapping for its own config classes without it
    # (the config's model type maps to no causal LM here, checked above)
    AutoModelForCausalLM.register(config_class, getattr(transformers, chosen), exist_ok=True)
    return {}


__all__ = [
    "DEFAULT_AUTO_CLASS",
    "TINY_PREFIX",
    "ModelSpecError",
    "auto_class_for",
    "auto_class_maps",
    "group_auto_class",
    "prepare_model_spec",
]
