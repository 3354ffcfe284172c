"""One error root: every exception class the package defines (the library, its tools,
codegen) derives from ``causalab_mini.errors.CausalabError``, and keeps a builtin base
so an ``except ValueError`` written before still catches it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import causalab_mini
from causalab_mini.errors import CausalabError

# modules that need what a plain install lacks are skipped by name, never silently
_OPTIONAL = {"causalab_mini.tools.bench"}


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(causalab_mini.__path__, "causalab_mini."):
        if info.name.startswith(("causalab_mini.generated.", "causalab_mini.registry")):
            continue
        names.append(info.name)
    return sorted(names)


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:
            if name in _OPTIONAL:
                continue
            raise
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__.startswith("causalab_mini"):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def test_every_exception_derives_from_the_root() -> None:
    classes = _exception_classes()
    assert len(classes) >= 20, [c.__name__ for c in classes]
    strays = [
        f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, CausalabError)
    ]
    assert not strays, f"exception classes outside causalab_mini.errors.CausalabError: {strays}"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("PlaceUnavailable", LookupError),
        ("WriteRefused", ValueError),
        ("ComponentError", LookupError),
        ("OperationNotFound", LookupError),
        ("EditRefused", RuntimeError),
    ],
)
def test_builtin_bases_kept(name: str, builtin: type[BaseException]) -> None:
    cls = getattr(causalab_mini, name)
    assert issubclass(cls, CausalabError) and issubclass(cls, builtin)


def test_a_refusal_is_caught_by_the_root() -> None:
    from causalab_mini.spec import prepare_model_spec

    with pytest.raises(CausalabError):
        prepare_model_spec("./no/such/checkpoint/dir")
