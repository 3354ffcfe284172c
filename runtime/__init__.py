"""causalab-mini: named places inside transformer language models.

The package root is the runtime. Heavy names (the model class, which needs torch,
nnsight and nnterp) load on first use, so `import causalab_mini.generated` stays
free of torch. No name here is also the name of a submodule: importing a submodule
binds it on the package, and it would shadow the function of the same name.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "Address": "causalab_mini.address",
    "IOType": "causalab_mini.address",
    "FirstIfTuple": "causalab_mini.address",
    "Index": "causalab_mini.address",
    "RenameConfig": "causalab_mini.address",
    "Streams": "causalab_mini.address",
    "StandardizedTransformer": "causalab_mini.model",
    "locate": "causalab_mini.locator",
    "ComponentAddress": "causalab_mini.locator",
    "Plan": "causalab_mini.plan",
    "read": "causalab_mini.plan",
    "write": "causalab_mini.plan",
    "CausalabError": "causalab_mini.errors",
    "ComponentError": "causalab_mini.geometry",
    "HeadSizeUnknown": "causalab_mini.geometry",
    "PlaceUnavailable": "causalab_mini.internals",
    "RenameError": "causalab_mini.internals",
    "WriteRefused": "causalab_mini.internals",
    "EditRefused": "causalab_mini.edits",
    "PlaceOutOfOrder": "causalab_mini.edits",
    "OperationNotFound": "causalab_mini.ops",
    "find_op": "causalab_mini.ops",
    "build_tiny": "causalab_mini.tools.tiny",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'causalab_mini' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
