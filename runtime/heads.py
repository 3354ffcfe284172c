"""Each query head's term of attention's output projection, computed: a row with
``heads_through`` reads the projection's input (the heads' outputs concatenated, as
the projection reads them) and sends each head's slice through that head's columns
of the projection's weight, bias left out. Summed over the heads, plus the bias once,
the terms give the projection's output.

The weight is read off the module the row resolves to: a ``torch.nn.Linear`` (weight
(out, in)) or a module that states its output width as ``nf`` and holds its weight
(in, out) (transformers' GPT-2-style 1-D convolution). Any other module is refused
with the reason: a weight read in the wrong orientation would give a plausible,
wrong tensor.

Both functions answer (a result, None) or (None, the reason), and the caller raises
its own error with the reason (the internals' refusal, the executor's): this module
imports nothing of the package."""

from __future__ import annotations

from typing import Any


def projection_weight(module: Any, where: str) -> tuple[Any, str | None]:
    """(the weight of ``module`` as (out, in), None), or (None, why not) naming
    ``where``."""
    import torch

    weight = getattr(module, "weight", None)
    if isinstance(module, torch.nn.Linear) and isinstance(weight, torch.Tensor):
        return weight, None
    nf = getattr(module, "nf", None)
    if (
        isinstance(weight, torch.Tensor)
        and isinstance(nf, int)
        and weight.dim() == 2
        and weight.shape[1] == nf
    ):
        return weight.t(), None
    return None, (
        f"{where} sends each head through the output projection's weight, and that "
        f"module is a {type(module).__name__}, neither a torch.nn.Linear nor a module "
        "holding its weight (in, nf): how its weight maps the heads is not stated. Read "
        "attention_z per head instead"
    )


def through_heads(value: Any, weight: Any, heads: int, where: str) -> tuple[Any, str | None]:
    """(``value`` (..., heads x head size) as each head's term, (..., heads x out),
    None): head h's slice times the columns of ``weight`` (out, in) it meets; or
    (None, why not)."""
    width = int(value.shape[-1])
    if heads < 1 or width % heads or int(weight.shape[1]) != width:
        return None, (
            f"{where}: the projection reads {width} features and its weight is "
            f"{tuple(weight.shape)}, which is not {heads} heads of one size"
        )
    per_head = value.unflatten(-1, (heads, width // heads)).unsqueeze(-2)  # (..., h, 1, d)
    columns = weight.to(value.dtype).unflatten(1, (heads, width // heads))  # (out, h, d)
    terms = per_head @ columns.permute(1, 2, 0)  # (..., h, 1, out)
    return terms.squeeze(-2).flatten(-2), None


__all__ = ["projection_weight", "through_heads"]
