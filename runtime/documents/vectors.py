"""A document's mechanisms made at a place (``causalab_mini.mechanisms``): ``add`` and
``renormalize`` take a steering vector, ``scale`` times the mean difference of the
place's clean values over two row fields' texts (at the site's positions of those
texts), computed once per place; ``scale`` multiplies the place by a factor."""

from __future__ import annotations

import dataclasses
from typing import Any

from .experiment import Experiment, texts_of
from .reading import forwards_of, values


def _texts(exp: Experiment, field: str) -> list[str]:
    return texts_of(exp.rows, field)


def vector(exp: Experiment, name: str, address: Any) -> Any:
    """Mechanism ``name``'s vector at ``address``: its scale times the mean of the
    place's values over the ``mean_of`` texts minus their mean over the ``minus``
    texts."""
    key = ("vector", name, dataclasses.replace(address, featurizer=None))
    if key not in exp.cache:
        item = exp.doc["mechanisms"][name]
        means = []
        for role in (item["vector"]["mean_of"], item["vector"]["minus"]):
            held = values(exp, [address], _texts(exp, role))[address]
            means.append(held.reshape(-1, held.shape[-1]).mean(0))
        exp.cache[key] = (means[0] - means[1]) * float(item.get("scale", 1.0))
    return exp.cache[key]


def mechanism(exp: Experiment, name: str, address: Any) -> Any:
    """Mechanism ``name`` of the document, made at ``address``."""
    from ..mechanisms import Add, Renormalize, Scale

    item = exp.doc["mechanisms"][name]
    if item["kind"] == "scale":
        return Scale(float(item["factor"]))
    made = Add if item["kind"] == "add" else Renormalize
    return made(vector(exp, name, address))


def vector_forwards(exp: Experiment, name: str, address: Any) -> int:
    """The forwards ``vector`` makes at ``address`` (none for a scale)."""
    item = exp.doc["mechanisms"][name]
    if "vector" not in item:
        return 0
    fields = (item["vector"]["mean_of"], item["vector"]["minus"])
    return sum(forwards_of(exp, [address], _texts(exp, f)) for f in fields)


__all__ = ["mechanism", "vector", "vector_forwards"]
