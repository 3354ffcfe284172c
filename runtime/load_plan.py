"""What ``StandardizedTransformer`` decides at load, as one pure function.

``plan_load(spec, kwargs, family, seen)`` takes the model as given (a spec already
prepared, or a loaded module), the caller's keyword arguments, the registry's answer
for the model before it is loaded (``family``: a ``Resolution``) and what was read
of it before the load (``seen``: its class names, model type, text config and the
config's architectures), and returns a ``LoadPlan``: the keyword arguments nnterp and
nnsight are given (auto class, dispatch, mixed layers, eager attention, skipped
checks, the device), nnterp's container names and rename table, which probability
row nnterp's own check reads, which load-time checks a remote model defers, and the
facts the model keeps of its family. Nothing here loads, reads a file or imports
nnterp; the kwargs given are not changed. The model class applies the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from causalab_mini.address import Address, Containers, IOType, Loading
from causalab_mini.address import names as container_paths

from . import compat
from .classes import DEFAULT_AUTO_CLASS, auto_class_maps, group_auto_class
from .family import Resolution

# the Containers fields nnterp's own RenameConfig takes
NNTERP_CONTAINERS = (
    "model_name",
    "layers_name",
    "attn_name",
    "mlp_name",
    "ln_final_name",
    "lm_head_name",
    "attn_head_config_key",
    "hidden_size_config_key",
    "ignore_mlp",
    "ignore_attn",
)


@dataclass(frozen=True)
class Seen:
    """What is about to be loaded, read before the load: the class names (the model
    class and its bases, or the config's architectures and the class the causal-LM
    table maps its model type to), the model type, the text config and the config's
    ``architectures``."""

    class_names: tuple[str, ...]
    model_type: str | None
    config: Any
    architectures: tuple[str, ...]


@dataclass(frozen=True)
class LoadPlan:
    """Every decision of one load (see the module's text).

    ``kwargs``: what nnterp's constructor is given besides the model, the rename
    config, the probabilities flag and ``rename``; ``containers``: nnterp's
    RenameConfig fields, as the installed nnsight mounts them; ``rename``: nnterp's
    rename table; ``probabilities``: the row nnterp's attention-probability hook
    answers by (None: nnterp's default); ``nnterp_probs``: whether nnterp checks the
    probabilities at load; ``model_class``: the name the hook's messages give;
    ``deferred``: the load-time checks a remote model leaves to the server, and why;
    ``no_dispatch``: why nothing during construction may load the weights (remote);
    ``install_sources``: whether the rows' sources are installed after the load;
    the rest are the family's facts the model keeps."""

    kwargs: Mapping[str, Any]
    containers: Mapping[str, Any]
    rename: Mapping[str, str]
    probabilities: Address | None
    nnterp_probs: bool
    model_class: str
    deferred: Mapping[str, str]
    no_dispatch: str | None
    install_sources: bool
    text_config_name: str | None
    traced_module: str | None
    hidden_states_are_block_outputs: bool
    oracles_from_last_calls: bool
    oracle_module: str | None


def check_arguments(kwargs: Mapping[str, Any], enable_attention_probs: bool) -> None:
    """The refusals of the caller's arguments alone, before anything is read: eager
    attention asked away from the probabilities, the weights asked here (dispatch)
    for a remote model."""
    implementation = kwargs.get("attn_implementation")
    if enable_attention_probs and "attn_implementation" in kwargs and implementation != "eager":
        # nnterp 1.3.0 checks this value and then passes it to nnsight a second time
        # beside its own "eager" (a TypeError); the probabilities imply eager
        raise ValueError(
            f"enable_attention_probs=True needs eager attention, and "
            f"attn_implementation={implementation!r} was given: drop "
            "attn_implementation (the probabilities imply 'eager') or pass "
            "enable_attention_probs=False"
        )
    if kwargs.get("remote") and kwargs.get("dispatch"):
        raise ValueError(
            "remote=True keeps the weights off this machine and dispatch=True loads them "
            "here: drop one (a remote model runs on the server; load without remote=True to "
            "run locally)"
        )


def plan_load(
    spec: Any,
    kwargs: Mapping[str, Any],
    family: Resolution,
    seen: Seen,
    *,
    enable_attention_probs: bool = False,
) -> LoadPlan:
    """The load plan of ``spec`` (a prepared spec string or a loaded module) with the
    caller's ``kwargs`` (the prepared spec's own included), for the registry's answer
    ``family`` before the load and what ``seen`` read of the model."""
    check_arguments(kwargs, enable_attention_probs)
    containers, loading, checks = family.containers, family.loading, family.checks
    out = dict(kwargs)
    remote = bool(out.get("remote"))
    if enable_attention_probs:
        out.pop("attn_implementation", None)  # the probabilities imply eager (checked)
    out.setdefault("device_map", "cpu")
    deferred = _deferred(out, enable_attention_probs)
    mounted = {k: _mounted(getattr(containers, k)) for k in NNTERP_CONTAINERS}
    probs = vouched_probabilities(family.rows.get("attention_probabilities"), seen.config)
    if containers.mixed_layers:
        out.setdefault("allow_multimodal", True)
    out.update(_auto_class_arguments(spec, loading, seen, out))
    out.update(_dispatch_arguments(loading, seen.class_names, out))
    nnterp_probs = _nnterp_checks(out, family, probs, enable_attention_probs)
    rename = _renames(containers, out.pop("rename", None))
    no_dispatch = None
    if remote:
        from .remote import NO_DISPATCH

        no_dispatch = NO_DISPATCH
    return LoadPlan(
        kwargs=MappingProxyType(out),
        containers=MappingProxyType(mounted),
        rename=MappingProxyType(rename),
        probabilities=probs if probs is not None and probs.source else None,
        nnterp_probs=bool(nnterp_probs),
        model_class=seen.class_names[0] if seen.class_names else "model",
        deferred=MappingProxyType(deferred),
        no_dispatch=no_dispatch,
        install_sources=not remote,
        text_config_name=loading.text_config_name,
        traced_module=loading.traced_module,
        hidden_states_are_block_outputs=bool(checks.hidden_states_are_block_outputs),
        oracles_from_last_calls=bool(checks.oracles_from_last_calls),
        oracle_module=checks.oracle_module,
    )


def _deferred(out: dict[str, Any], enable_attention_probs: bool) -> dict[str, str]:
    """remote=True keeps the checkpoint off this machine: a load-time check that needs a
    forward is deferred to the server, with why (turned into a scan in ``out``, the
    plan's own copy of the kwargs)."""
    if not (out.get("remote") and enable_attention_probs):
        return {}
    from .remote import PROBS_DEFERRED

    out["check_attn_probs_with_trace"] = False
    return {"attention_probabilities": PROBS_DEFERRED}


def _nnterp_checks(
    out: dict[str, Any], family: Resolution, probs: Address | None, enable_attention_probs: bool
) -> bool:
    """Whether nnterp checks the attention probabilities at load (on layer 0, through
    our vouched row ``probs``), with what goes into ``out`` (the plan's own copy of the
    kwargs): its load-time checks skipped where the family says they cannot run, and
    eager attention wherever the probabilities are asked and nnterp does not check
    them."""
    # where attention is not on every layer (ignore_attn) our own row serves them
    nnterp_probs = (
        enable_attention_probs and probs is not None and not family.containers.ignore_attn
    )
    if family.containers.ignore_ln_final or family.loading.skip_nnterp_checks:
        # nnterp 1.3.0's load-time checks require a final norm and cannot be told a
        # model has none, and read .output where nnsight mounts it elsewhere; the family
        # says so, and they are skipped (with its probability check). Every place is
        # still certified by our identities and transformers' oracles.
        out["check_renaming"] = False
        nnterp_probs = False
    if enable_attention_probs and not nnterp_probs:
        out["attn_implementation"] = "eager"
    return nnterp_probs


def vouched_probabilities(probs: Address | None, config: Any) -> Address | None:
    """Our attention-probabilities row where nnterp's load-time check may read it: it
    holds for the installed versions, is not refused on this model, and holds the
    probabilities as an operation's output of (batch, heads, queries, keys), which is
    what nnterp's check reads. None otherwise: nnterp is not asked to check a path we
    do not vouch for."""
    from .versions import outside_versions

    if probs is None or (
        outside_versions(probs.versions) is not None
        or _refused_by_config(probs, config)
        or probs.io is not IOType.OUTPUT
        or probs.merged_heads
        or probs.flat_tokens
    ):
        return None
    return probs


def _refused_by_config(row: Address, config: Any) -> bool:
    """Whether the row is refused on every layer of a model with this config before it
    is loaded: an ``always`` reason, or a config reason that holds."""
    for item in row.unavailable:
        kind = item.when.kind
        if kind == "always" or (kind == "config" and item.when.holds_for_config(config)):
            return True
    return False


def _auto_class_arguments(
    spec: Any, loading: Loading, seen: Seen, kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The family's transformers class (its model_class, else its auto_class: a
    language model inside a multimodal wrapper), else its group's auto class, said the
    way the installed nnsight takes it; not for a checkpoint its config says the
    causal-LM class saved, nor where the caller chose. The family's key_mapping goes to
    from_pretrained with any class. Where the family traces a submodule
    (traced_module), the class loads the whole model and returns the submodule. Only
    the keys ``kwargs`` does not hold yet."""
    out: dict[str, Any] = {}
    if loading.key_mapping and isinstance(spec, str) and "key_mapping" not in kwargs:
        out["key_mapping"] = dict(loading.key_mapping)
    auto_class = (
        loading.model_class
        or loading.auto_class
        or group_auto_class(seen.model_type, seen.architectures)
    )
    traced = loading.traced_module
    if traced and not auto_class:  # a submodule of a causal LM's checkpoint
        auto_class = DEFAULT_AUTO_CLASS
    if not isinstance(spec, str) or "automodel" in kwargs:
        return out
    if not auto_class or not auto_class_maps(auto_class, seen.architectures):
        # the causal-LM class: past nnsight 0.6/0.7's refusal of an image-text model
        # type where the checkpoint is a causal LM saved under such a config
        return {**compat.causal_lm_kwargs(seen.model_type), **out}
    for key, value in compat.auto_class_kwargs(auto_class, traced).items():
        if key not in kwargs:
            out[key] = value
    return out


def _dispatch_arguments(
    loading: Loading, class_names: tuple[str, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Where the family says its class cannot be built on the meta device (its
    construction reads a tensor's value), the weights are loaded at construction
    (nnsight's ``dispatch=True``) instead of at the first trace; ``remote=True``, which
    builds on meta and never loads them here, is refused with the family's reason."""
    why = loading.meta_build_unavailable
    if not why:
        return {}
    model_class = class_names[0] if class_names else "this model"
    if kwargs.get("remote"):
        raise ValueError(
            f"{model_class} cannot be built on the meta device, which remote=True needs "
            f"(the weights stay on the server): {why}"
        )
    return {} if "dispatch" in kwargs else {"dispatch": True}


def _renames(containers: Containers, given: Mapping[str, str] | None) -> dict[str, str]:
    """nnterp's ``rename`` table: the caller's, the family's embedding path bound to
    ``embed_tokens``, and the keys of nnterp's own table the family leaves unbound (each
    bound to its own name: no alias, nnterp's table updated with this one)."""
    rename = dict(given or {})
    for embed in container_paths(containers.embed_name):
        rename.setdefault(compat.container_path(embed), "embed_tokens")
    for key in containers.unbound_defaults or ():
        rename.setdefault(key, key)
    return rename


def _mounted(value: Any) -> Any:
    """Container names as the installed nnsight mounts their modules (a module named
    after an nnsight attribute, such as a root child ``output``, differs on 0.8)."""
    if isinstance(value, str):
        return compat.container_path(value)
    if isinstance(value, (tuple, list)):
        return [compat.container_path(v) if isinstance(v, str) else v for v in value]
    return value


__all__ = ["NNTERP_CONTAINERS", "LoadPlan", "Seen", "check_arguments", "plan_load"]
