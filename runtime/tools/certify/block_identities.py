"""The identities of a block structure (registry/block_structures.yaml), parsed and
evaluated on the values read: each row's value in its streams' canonical layout, the
terms of an identity summed, and every identity of a model checked on every layer
where all its rows are available."""

from __future__ import annotations

from typing import Any, TypeAlias

from causalab_mini.address import IdentityTerm, identity_term_rows, parse_identity_terms
from causalab_mini.generated import BLOCK_STRUCTURES

from .common import CheckResult, compare

Term: TypeAlias = IdentityTerm


def parse_terms(text: str) -> tuple[str, tuple[Term, ...]]:
    """block_structures.yaml's identity grammar (``causalab_mini.address``)."""
    parsed: tuple[str, tuple[Term, ...]] = parse_identity_terms(text)
    return parsed


def parse_identity(text: str) -> tuple[str, tuple[str, ...]]:
    """``"a == b + c"`` -> ``("a", ("b", "c"))``: the left side and every row the right
    side names, in order (a weighted or mixed term names two, a number none)."""
    left, terms = parse_terms(text)
    return left, tuple(name for term in terms for name in identity_term_rows(term))


rows_of = identity_term_rows


def identity_rows(text: str) -> tuple[str, ...]:
    """Every row an identity names, left side first."""
    left, right = parse_identity(text)
    return (left, *right)


def structure_identities(model: Any) -> tuple[str, ...]:
    """The identities of the model's block structure (none if it has no known one)."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    return structure.identities if structure is not None else ()


def mid_write_target(model: Any) -> str | None:
    """The row that must carry a write to layers_mid on: the left side of the
    structure's identity ``X == layers_mid + mlps_output`` (layers_output on a
    pre-norm block, layers_output_prenorm where a norm follows the add), or, where
    the MLP's contribution is added to another stream (a reversible block:
    ``layers_output == layers_input + mlps_output``, ``mlps_input == layers_mid``),
    the left side of that identity."""
    addend = mlp_addend(model)
    return None if addend is None else addend[0]


def mlp_addend(model: Any) -> tuple[str, str] | None:
    """(X, A) of the structure's identity ``X == A + mlps_output``, layers_mid's first."""
    texts = list(structure_identities(model))
    # the MLP reads layers_mid itself where it adds to another stream
    reads_mid = any(parse_identity(t) == ("mlps_input", ("layers_mid",)) for t in texts)
    found = []
    for text in texts:
        left, right = parse_identity(text)
        if len(right) == 2 and "mlps_output" in right:
            other = next(r for r in right if r != "mlps_output")
            if other == "layers_mid" or reads_mid:
                found.append((other != "layers_mid", left, other))
    return (min(found)[1], min(found)[2]) if found else None


def stream_count(model: Any, row: Any) -> int | None:
    """How many streams a row carries (None for one stream)."""
    if row.streams is None:
        return None
    count = getattr(model.text_config, row.streams.count, None)
    if not isinstance(count, int):
        raise ValueError(
            f"the row's streams count names config attribute {row.streams.count!r}, which "
            "this model's config does not give as an int"
        )
    return count


def canonical(model: Any, name: str, value: Any) -> Any:
    """A row's value with its streams as (batch, seq, n, hidden); a value handed on flat
    by a component (batch, seq, n x hidden) is taken the same way. Other rows as given."""
    row = model.internals[name].row
    n = stream_count(model, row)
    if n is None:
        return value
    if value.dim() == 3:  # handed on flat, or held flat (bsf)
        return value.unflatten(-1, (n, value.shape[-1] // n))
    return row.streams.canonical(value, n)


def _term(model: Any, term: Any, values: dict[str, Any], layer: int, left: str) -> Any:
    """The value of one term of an identity at ``layer`` (``values`` by row name)."""
    kind = term[0]
    if kind == "row":
        return canonical(model, term[1], values[term[1]])
    if kind == "k":
        return float(term[1]) * canonical(model, term[2], values[term[2]])
    if kind == "*":
        weights, one = values[term[1]], values[term[2]]
        return weights.to(one.dtype).unsqueeze(-1) * one.unsqueeze(-2)
    if kind == "@":
        streams = canonical(model, term[2], values[term[2]])
        mix = values.get(term[1])
        if mix is None:  # the model has no mixing row: the streams pass unmixed
            return streams
        return torch_einsum("bsjk,bsjh->bskh", mix.to(streams.dtype), streams)
    module = model.internals[left].address_at(layer).module
    from causalab_mini.internals import child

    envoy = child(model.internals.layer_envoy(layer), module)
    import torch

    with torch.no_grad():
        out = envoy._module(values[term[1]])
    return out[0] if isinstance(out, tuple) else out


def torch_einsum(spec: str, *operands: Any) -> Any:
    import torch

    return torch.einsum(spec, *operands)


def evaluate_identity(
    model: Any, text: str, values: dict[tuple[str, int | None], Any], layer: int
) -> tuple[Any, Any] | None:
    """(left, right) of ``text`` at ``layer`` as tensors, the streams as (batch, seq, n,
    hidden); None where a row it names is not in ``values`` (refused on the model or
    not read). A mixing row (``m @ x``) the model refuses means no mixing."""
    left, terms = parse_terms(text)
    needed = [left]
    for term in terms:
        if term[0] == "@":
            needed.append(term[2])
        else:
            needed.extend(rows_of(term))
    if not all((name, layer) in values for name in needed):
        return None
    for term in terms:
        if term[0] == "@" and (term[1], layer) not in values:
            if model.internals[term[1]].unavailable_on(layer) is None:
                return None  # the row exists but was not read: nothing to say
    here = {
        name: values[(name, layer)]
        for name in {*needed, *(n for t in terms for n in rows_of(t))}
        if (name, layer) in values
    }
    parts = [_term(model, term, here, layer, left) for term in terms]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return canonical(model, left, here[left]), total


def output_scale(model: Any, layer: int) -> Any:
    """The weight layer ``layer`` multiplies its whole output by, where its block
    structure has one (``output_scale``: a path relative to the layer, read off the
    module), else 1."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    if structure is None or structure.output_scale is None:
        return 1.0
    value = model.internals.layer_envoy(layer)._module
    for part in structure.output_scale.split("."):
        value = getattr(value, part)
    return value.detach()


def identities(model: Any, values: dict[tuple[str, int | None], Any]) -> list[CheckResult]:
    """Every identity of the model's block structure, on every layer where all its
    places are available (an identity of layers_output times the block's output
    scale, where it has one)."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    if structure is None:
        return []
    out = []
    for text in structure.identities:
        for layer in range(model.internals.num_layers):
            sides = evaluate_identity(model, text, values, layer)
            if sides is None:
                continue
            left, right = sides
            if parse_terms(text)[0] == "layers_output":
                right = right * output_scale(model, layer)
            out.append(compare(text, layer, left, right))
    return out
