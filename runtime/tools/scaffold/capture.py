"""One forward pass that captures every module's input and output on every layer."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from causalab_mini.compat import aliases_of
from causalab_mini.tools.scaffold.data import Candidate


@dataclass
class Capture:
    """Every module's input and output on every layer, from one forward pass."""

    num_layers: int
    paths: list[list[str]]  # per layer: standardized module paths ("" is the layer)
    kinds: dict[str, str]  # path -> module class name (layer 0)
    params: dict[str, bool]  # path -> has parameters of its own
    inputs: dict[tuple[str, int], Any]
    outputs: dict[tuple[str, int], Any]
    tuple_out: set[tuple[str, int]]
    inplace: set[tuple[str, int]]
    hidden_states: tuple[Any, ...]
    logits: Any

    def exists(self, path: str) -> bool:
        return all(path in p for p in self.paths)

    def value(self, cand: Candidate, layer: int, scales: dict[str, float]) -> Any | None:
        store = self.inputs if cand.io == "input" else self.outputs
        value = store.get((cand.module, layer))
        if value is None:
            return None
        if cand.scale:
            value = value * scales[cand.scale]
        return value


def walk_layer(envoy: Any) -> Iterator[tuple[str, Any]]:
    """(standardized path, torch module) for the layer and every module below it."""
    yield "", envoy._module

    def walk(env: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        aliases = aliases_of(env)
        for sub in env._children:
            name = sub.path.split(".")[-1]
            # the layer's own children by their standardized names (self_attn, mlp);
            # deeper modules by their own (DBRX's self_attn.attn, not self_attn.self_attn)
            if not prefix and name in aliases:
                name = aliases[name][0]
            path = f"{prefix}{name}"
            yield path, sub._module
            yield from walk(sub, f"{path}.")

    yield from walk(envoy, "")


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
    import torch

    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            return value
    return None


def capture(model: Any, inputs: dict[str, Any]) -> Capture:
    import torch

    n = len(model.layers)
    paths: list[list[str]] = []
    ins: dict[tuple[str, int], Any] = {}
    outs: dict[tuple[str, int], Any] = {}
    refs: dict[tuple[str, int], Any] = {}
    tuples: set[tuple[str, int]] = set()
    kinds: dict[str, str] = {}
    params: dict[str, bool] = {}
    handles = []

    def hook(key: tuple[str, int]) -> Any:
        def fn(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if key in outs or key in ins:
                return  # the first call is the place; a module called twice is noted
            x = _first_tensor(args, kwargs)
            if x is not None:
                ins[key] = x.detach().clone()
            value = out[0] if isinstance(out, tuple) and out else out
            if isinstance(out, tuple):
                tuples.add(key)
            if isinstance(value, torch.Tensor):
                outs[key] = value.detach().clone()
                refs[key] = value

        return fn

    for layer in range(n):
        layer_paths = []
        for path, module in walk_layer(model.layers[layer]):
            layer_paths.append(path)
            if layer == 0:
                kinds[path] = type(module).__name__
                params[path] = any(True for _ in module.parameters(recurse=False))
            handles.append(module.register_forward_hook(hook((path, layer)), with_kwargs=True))
        paths.append(layer_paths)
    try:
        with torch.no_grad():
            out = model._model(**inputs, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    inplace = {
        key
        for key, ref in refs.items()
        if ref.shape != outs[key].shape or not torch.equal(ref.detach(), outs[key])
    }
    return Capture(
        num_layers=n,
        paths=paths,
        kinds=kinds,
        params=params,
        inputs=ins,
        outputs=outs,
        tuple_out=tuples,
        inplace=inplace,
        hidden_states=tuple(out.hidden_states or ()),
        logits=out.logits,
    )
