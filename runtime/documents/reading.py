"""Reading a place's clean values over a document's rows: the batches a plan runs the
texts in (one row at a time where a position names different numbers of tokens in
different rows), and the values of several places at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .experiment import Experiment, texts_of


def chunks(n: int, size: int) -> Iterator[slice]:
    """The slices of ``n`` rows taken ``size`` at a time."""
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def read(exp: Experiment, addresses: list[Any], texts: list[str]) -> dict[Any, Any]:
    """One plan's reads of ``addresses`` on ``texts`` (one forward)."""
    from ..plan import Plan

    out: dict[Any, Any] = Plan.of(reads=addresses).run(
        exp.model, texts, frame=exp.frame, engine=exp.engine
    )
    return out


def batch_for(exp: Experiment, addresses: list[Any], texts: list[str]) -> int:
    """The batch size a plan at ``addresses`` runs these texts in: one row at a time
    where a position names a different number of tokens in different rows (they do not
    stack into one tensor), else the document's."""
    from ..positions import encode, resolve

    key = ("encoded", tuple(texts))
    if key not in exp.cache:
        exp.cache[key] = encode(exp.model, texts, exp.frame)
    for address in addresses:
        if address.position:
            spec = [p.spec() for p in address.position]
            counts = {len(i) for i in resolve(exp.model, exp.cache[key], spec)}
            if len(counts) > 1:
                return 1
    return exp.batch_size


def values(exp: Experiment, addresses: list[Any], texts: list[str]) -> dict[Any, Any]:
    """Each address's clean values over every row of ``texts`` and every token it
    names, as (samples, ...) (one sample a token of a row), in as few forwards as
    ``batch_for`` allows."""
    import torch

    parts: dict[Any, list[Any]] = {a: [] for a in addresses}
    for part in chunks(len(texts), batch_for(exp, addresses, texts)):
        held = read(exp, addresses, texts[part])
        for a in addresses:
            parts[a].append(held[a].reshape(-1, *held[a].shape[2:]))
    return {a: torch.cat(v) for a, v in parts.items()}


def forwards_of(exp: Experiment, addresses: list[Any], texts: list[str]) -> int:
    """The forwards ``values`` makes."""
    import math

    return math.ceil(len(texts) / batch_for(exp, addresses, texts))


def role_texts(
    exp: Experiment, rows: Any, roles: tuple[str, ...] = ("base", "source")
) -> list[str]:
    """The texts of ``rows`` (a ``Rows``) in ``roles`` (a role the rows lack is left out;
    a row's first source)."""
    out: list[str] = []
    for role in roles:
        if all(role in r for r in rows.rows):
            out += texts_of(rows, role)
    return out


__all__ = ["batch_for", "chunks", "forwards_of", "read", "role_texts", "values"]
