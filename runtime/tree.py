"""Walking a model's Envoy tree without running it: a child by its standardized path,
the attribute of a module boundary, a layer's children, a module reached by two paths,
and the config a layer was built from. Asked by the rows' resolution (internals), the
head geometry and the lowering alike."""

from __future__ import annotations

from typing import Any

from .compat import alias_target, aliases_of, child_attribute, shared_path


def has_attr(envoy: Any, name: str) -> bool:
    """Whether ``getattr(envoy, name)`` can find ``name``, decided without calling
    nnsight's ``Envoy.__getattr__`` on a miss: its AttributeError formats the whole
    subtree into the message, which on an 80-layer model costs a quarter second."""
    if name in envoy.__dict__ or any(name in vars(k) for k in type(envoy).__mro__):
        return True
    if alias_target(envoy, name) is not None:
        return True
    module = envoy.__dict__.get("_module")
    return module is None or hasattr(module, name)


def boundary(attr: str, envoy: Any) -> str:
    """The attribute that reads a module's ``input``/``output`` boundary: nnsight 0.6/0.7
    mount it at ``nns_input``/``nns_output`` on a module that has a child of that name
    (a BERT layer's ``output`` submodule); 0.8 keeps it and mounts the child at
    ``E_output`` instead (see ``child``)."""
    return f"nns_{attr}" if attr in envoy.__dict__ else attr


def _unset_module(envoy: Any, name: str) -> bool:
    """Whether ``name`` (through the Envoy's alias) is an attribute of the module that
    holds no module: a layer that sets ``self.self_attn = None`` where it has no
    attention (GraniteMoeHybrid's Mamba layers). nnsight's alias of such a name
    points back at itself, and getattr would recurse without end."""
    module = envoy.__dict__.get("_module")
    if module is None:
        return False
    target = alias_target(envoy, name) or name
    value: Any = module
    for atom in target.split("."):
        if atom not in getattr(value, "__dict__", {}) and atom not in getattr(
            value, "_modules", {}
        ):
            return False  # not a plain attribute: has_attr and getattr decide
        value = getattr(value, atom)
    return value is None


def child(envoy: Any, path: str) -> Any | None:
    """The Envoy at dotted ``path`` below ``envoy`` (standardized names), or None."""
    from nnsight.intervention.envoy import Envoy

    current = envoy
    for name in path.split(".") if path else ():
        part = child_attribute(current, name)  # a child named `output`: E_output on 0.8
        try:
            if part not in current.__dict__ and hasattr(Envoy, part):
                return None  # nnsight's own attribute (output, input, source ...), no module
            if not has_attr(current, part) or _unset_module(current, part):
                return None
            current = getattr(current, part)
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
        if not isinstance(current, Envoy):
            return None
    return current


def shared_on(base: Any, path: str) -> str | None:
    """The first path of a module that ``path`` below ``base`` reaches through a second
    path (``compat.shared_path``), or None."""
    current = base
    for name in path.split("."):
        first = shared_path(current, name)
        if first is not None:
            return first
        current = getattr(current, child_attribute(current, name), None)
        if current is None:
            return None
    return None


def shared_reason(name: str, module: str, first: str) -> str:
    return (
        f"{name} reads {module!r}, which here is the module object at {first} (one module "
        "called by several layers, as a shared activation): nnsight 0.8 gives it one envoy "
        "and serves its calls in order, so a read here would see that first call. A family "
        f"row (or RenameConfig(addresses={{{name!r}: Address(...)}})) can read the layer's "
        "own use of it instead, such as the input of the module that consumes it"
    )


def child_names(envoy: Any, depth: int = 2) -> list[str]:
    """The layer's module paths ``depth`` levels deep, in standardized names."""
    out: list[str] = []

    def walk(env: Any, prefix: str, level: int) -> None:
        aliases = aliases_of(env)
        for sub in env._children:
            name = sub.path.split(".")[-1]
            if name in aliases:
                name = aliases[name][0]
            path = f"{prefix}{name}"
            out.append(path)
            if level < depth:
                walk(sub, f"{path}.", level + 1)

    walk(envoy, "", 1)
    return out


def layer_config(config: Any, layer: int | None) -> Any:
    """The config layer ``layer`` was built from. A heterogeneous config (transformers'
    ``per_layer_config``) refuses to answer a per-layer attribute (head_dim, say) for
    the whole model; layer i's own config answers it. Elsewhere, the config itself."""
    if layer is not None and getattr(config, "is_heterogeneous", False):
        return config.per_layer_config[layer]
    return config


__all__ = ["boundary", "child", "child_names", "has_attr", "layer_config"]
