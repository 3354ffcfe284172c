"""Which transformers auto class loads a model (and ``tiny:`` builds it): a family's
``auto_class``, else its group's (registry/tiny.yaml ``groups``), else
AutoModelForCausalLM; and whether a family's class holds a given checkpoint. Asked by
the loader (``model``, ``spec``) and the tiny builder alike, so the answer is one."""

from __future__ import annotations

from typing import Any

DEFAULT_AUTO_CLASS = "AutoModelForCausalLM"


def auto_class_for(class_names: tuple[str, ...], model_type: str | None, config: Any) -> str:
    """The transformers auto class that loads (and ``tiny:`` builds) a model: the last
    matching family's ``model_class`` (a concrete class, where no auto class loads the
    config) or ``auto_class`` (registry/families/*.yaml, ``rename``), else its group's,
    else ``AutoModelForCausalLM``."""
    from .family import families_for, merged

    loading = merged(families_for(class_names, model_type, config), None).loading
    found = loading.model_class or loading.auto_class
    if found is None or found == DEFAULT_AUTO_CLASS:
        return group_auto_class(model_type) or DEFAULT_AUTO_CLASS
    return str(found)


def group_auto_class(model_type: str | None, architectures: tuple[str, ...] = ()) -> str | None:
    """The auto class of the group (registry/tiny.yaml ``groups``) ``model_type`` is in,
    the first whose transformers mapping has it, where that is not
    AutoModelForCausalLM: an image-text-to-text wrapper no family file names loads
    (and ``tiny:`` builds) whole, with its image-text-to-text class. A checkpoint whose
    ``architectures`` name the class a group that shares model types maps it to (the
    whole encoder-decoder, BartForConditionalGeneration) loads with that group's
    class. None otherwise."""
    from transformers.models.auto import modeling_auto

    from causalab_mini.generated.tiny import TINY_GROUPS, TINY_SHARED_GROUPS

    for group in TINY_SHARED_GROUPS:
        mapping, auto, _ = TINY_GROUPS[group]
        if set(_mapped(mapping, model_type)) & set(architectures):
            return None if auto == DEFAULT_AUTO_CLASS else auto
    for mapping, auto, _ in TINY_GROUPS.values():
        if model_type in getattr(modeling_auto, mapping, {}):
            return None if auto == DEFAULT_AUTO_CLASS else auto
    return None


def mapped_classes(model_type: str | None) -> tuple[str, ...]:
    """The classes the auto mappings of registry/tiny.yaml's groups map ``model_type``
    to, in the groups' order (what a model of that type is loaded as, named before it
    is loaded: a traced submodule's, from its config)."""
    from causalab_mini.generated.tiny import TINY_GROUPS

    found: list[str] = []
    for mapping, _, _ in TINY_GROUPS.values():
        found.extend(n for n in _mapped(mapping, model_type) if n not in found)
    return tuple(found)


def _mapped(mapping: str, model_type: str | None) -> tuple[str, ...]:
    """The class names transformers' auto mapping ``mapping`` (a ``*_MAPPING_NAMES``
    table) gives ``model_type``: one name or several, as a tuple (none where it has no
    entry)."""
    from transformers.models.auto import modeling_auto

    mapped = getattr(modeling_auto, mapping, {}).get(model_type)
    return (mapped,) if isinstance(mapped, str) else tuple(mapped or ())


def traced_module_for(model_type: str | None) -> str | None:
    """The submodule a model of ``model_type`` is traced as (its families'
    ``traced_module``, registry/families/*.yaml), or None: what ``tiny:`` runs its
    smoke forward on."""
    from .family import families_for, merged

    families = families_for(mapped_classes(model_type), model_type, None)
    path: str | None = merged(families, None).loading.traced_module
    return path


def is_auto_class(cls: Any) -> bool:
    """Whether ``cls`` is a transformers auto class (one that picks the model class
    from the config: it has ``from_config``), not a concrete model class."""
    return hasattr(cls, "from_config") and hasattr(cls, "_model_mapping")


def key_mapping_for(
    class_names: tuple[str, ...], model_type: str | None, config: Any
) -> dict[str, str] | None:
    """The matching families' ``key_mapping`` (registry/families/*.yaml, ``rename``): the
    checkpoint key renamings ``from_pretrained`` is given (pattern -> replacement), or
    None where they give none."""
    from .family import families_for, merged

    found = merged(families_for(class_names, model_type, config), None).loading.key_mapping
    return dict(found) if found else None


def auto_class_maps(auto_class: str, architectures: tuple[str, ...]) -> bool:
    """Whether a family's ``auto_class`` loads a checkpoint whose config names
    ``architectures``: where it maps one of them, or where they name no class
    AutoModelForCausalLM maps either (nothing says otherwise). A checkpoint saved by
    the causal-LM class of a wrapper's model type (``MllamaForCausalLM`` beside
    ``MllamaForConditionalGeneration``) is loaded with AutoModelForCausalLM, whose
    class holds its tensors under its names."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    def classes(mapping: Any) -> set[str]:
        found: set[str] = set()
        for value in mapping.values():
            found.update((value,) if isinstance(value, str) else tuple(value))
        return found

    auto = getattr(transformers, auto_class)
    if not is_auto_class(auto):
        # a family's model_class: it loads what it saved, and what no causal-LM class did
        mapped = {auto_class}
    else:
        mapped = classes(getattr(auto._model_mapping, "_model_mapping", {}))
    if set(architectures) & mapped:
        return True
    return not set(architectures) & classes(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


__all__ = [
    "DEFAULT_AUTO_CLASS",
    "auto_class_for",
    "auto_class_maps",
    "group_auto_class",
    "is_auto_class",
    "key_mapping_for",
    "mapped_classes",
    "traced_module_for",
]
