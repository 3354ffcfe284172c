"""The side inputs of a tiny model: the keyword inputs registry/tiny.yaml
``side_inputs`` gives a model type's forward beside the token ids (a drafter's
target states, audio codes), made from the loaded config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import SIDE_INPUTS, TinyBuildError


def _config_path(config: Any, path: str, layer: int | None) -> Any:
    value = config
    for part in path.split("."):
        if part == "@layer":
            if layer is None:
                raise TinyBuildError(f"side input path {path!r} has @layer outside per_layer_type")
            value = value[layer]
        else:
            value = getattr(value, part)
    return value


def side_inputs(
    config: Any, batch: int, seq: int, seed: int = 0, tokens: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The keyword inputs registry/tiny.yaml ``side_inputs`` gives ``config``'s model
    type beside the token ids (empty for most): seeded random normal tensors of the
    shapes the row reads from ``config``, for a token batch of ``batch`` x ``seq`` (a
    constant integer fill, a mask, or values uniform in a range, where the row says
    so), or (``from``) a tensor of the token batch ``tokens`` itself (the encoder's ids
    as an encoder-decoder's decoder_input_ids; with ``channels``, seeded codes after it
    on a new last axis: a text token and its audio codes per position), or
    (``absent``) None, for a token-batch input the forward must not be given."""
    import torch

    rows = SIDE_INPUTS.get(getattr(config, "model_type", ""), {})
    generator = torch.Generator().manual_seed(seed)

    def size(dim: Any, layer: int | None) -> int:
        if dim == "batch":
            return int(batch)
        if dim == "seq":
            return int(seq)
        if isinstance(dim, int):
            return dim
        # a product: the config value, the token batch's seq, an integer (each where given)
        value = int(dim.get("times", 1)) * (int(seq) if dim.get("seq") else 1)
        if "config" in dim:
            value *= int(_config_path(config, dim["config"], layer))
        return value + int(dim.get("plus", 0))

    def tensor(row: Any, layer: int | None) -> Any:
        dims = [size(dim, layer) for dim in row["shape"]]
        if "fill" in row:  # a mask: every entry the row's integer
            return torch.full(dims, row["fill"], dtype=torch.long)
        if "uniform" in row:  # coordinates, positions: values in [low, high)
            low, high = row["uniform"]
            return low + (high - low) * torch.rand(*dims, generator=generator)
        return torch.randn(*dims, generator=generator)

    def made(row: Any, layer: int | None) -> Any:
        count = row.get("tuple")
        if count is None:
            return tensor(row, layer)
        return tuple(tensor(row, layer) for _ in range(count))

    out: dict[str, Any] = {}
    missing = object()
    for name, row in rows.items():
        if any(getattr(config, k, missing) != v for k, v in (row.get("config") or {}).items()):
            continue  # fed only where the loaded config has these values
        if row.get("absent"):  # a token-batch input the forward must not be given
            out[name] = None
        elif "from" in row:
            if tokens is None or row["from"] not in tokens:
                raise TinyBuildError(
                    f"side input {name!r} of {config.model_type!r} is the token batch's "
                    f"{row['from']!r}, and no token batch holding it was given"
                )
            out[name] = tokens[row["from"]].clone()
            if "channels" in row:  # the tensor, then codes, on a new last axis
                out[name] = _with_codes(out[name], row["channels"], size, generator)
        elif "per_layer_type" in row:
            types = list(_config_path(config, row["per_layer_type"], None))
            out[name] = {kind: made(row, types.index(kind)) for kind in dict.fromkeys(types)}
        else:
            out[name] = made(row, None)
    return out


def _with_codes(tensor: Any, channels: Mapping[str, Any], size: Any, generator: Any) -> Any:
    """``tensor`` as channel 0 of a new last axis, then the row's ``count`` channels of
    seeded random codes in [0, ``below``) (a text token's audio codes, one per
    codebook); ``size`` reads a dimension of the row."""
    import torch

    count, below = size(channels["count"], None), size(channels["below"], None)
    shape = (*tensor.shape, count)
    codes = torch.randint(0, below, shape, generator=generator, dtype=tensor.dtype)
    return torch.cat([tensor.unsqueeze(-1), codes], dim=-1)
