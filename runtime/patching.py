"""Activation-patching grids at the cost of their forwards: ``grid`` (also
``causalab_mini.interchange.grid``).

A (layer x position) grid patches one component, at one layer and one position of the
content frame per cell, from each pair's source into its base, and measures the base
run's last-token logits. Done one ``interchange`` per cell, every cell tokenizes and
runs every source again. Here the texts are tokenized once (one batch, one padding,
each row's frame), the sources run once for the whole grid (one forward that reads the
component at every layer), and the cells of one layer are rows of as few forwards as
``batch_size`` allows: each row a base, patched at its cell's position with the value
its source held there.

    result = grid(model, "block_output", layers=range(3), positions="all",
                  bases=["The Eiffel Tower is in"], sources=["The Colosseum is in"])
    result.logits[layer, position, pair]   # (vocab,) at the base's last content token

Every cell equals the one-cell ``interchange`` of the same pair (its patch and its
logits), and every engine that runs the component gives the same grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .engines import Engine, engine_for
from .errors import CausalabError
from .geometry import ComponentError
from .hooks import dispatched
from .locator import ComponentAddress, locate
from .lower import Target
from .plan import Plan, Step
from .positions import Encoded, PositionError, encode, parse, resolve, text_of, trace_inputs

Metric = Callable[[Any, Any], Any]


@dataclass
class GridResult:
    """A patching grid: ``logits[l, p, i]`` (vocab,) is pair ``i``'s base run with the
    component at ``layers[l]`` patched at ``positions[p]`` from its source, at the
    base's last content token; ``values[l, p, i]`` the metric of those logits (where a
    metric was given). ``base_logits`` and ``source_logits`` (pairs, vocab) are the
    clean runs. A layer the family has no such place at is left out of ``layers``,
    with its reason in ``refused``."""

    component: str
    layers: tuple[int, ...]
    positions: tuple[Any, ...]
    logits: Any
    values: Any
    base_logits: Any
    source_logits: Any
    refused: dict[int, str] = field(default_factory=dict)
    forwards: int = 0


def _positions(model: Any, encoded: Encoded, positions: Any, k: int) -> list[Any]:
    """The position specs of the grid: as given, or every content index that each row
    of the batch has ("all")."""
    if isinstance(positions, str) and positions == "all":
        shortest = min(len(f.content) for f in encoded.frames)
        return [{"index": j} for j in range(shortest)]
    if isinstance(positions, (str, dict)):
        raise PositionError(
            f"positions is a list of position specs (or 'all'), not {positions!r}: write "
            f"[{positions!r}]"
        )
    specs = list(positions)
    if not specs:
        raise PositionError("no positions: give at least one position spec, or 'all'")
    for spec in specs:
        parse(spec)  # refused here, with the spec, before anything runs
    return specs


def _cells(
    model: Any, encoded: Encoded, specs: list[Any], k: int, bases: Sequence[str]
) -> list[tuple[list[int], list[int]]]:
    """Per position spec, the token indices it names in each base row and in the same
    pair's source row (as many in both), or refused."""
    out = []
    for spec in specs:
        indices = resolve(model, encoded, spec)
        base_at: list[int] = []
        source_at: list[int] = []
        for i in range(k):
            here, there = indices[i], indices[k + i]
            if len(here) != 1 or len(there) != 1:
                raise PositionError(
                    f"grid position {text_of(spec)} names {len(here)} token(s) in base "
                    f"{bases[i]!r} and {len(there)} in its source: a grid cell patches one "
                    "token; name one (an index, or a span with an index)"
                )
            base_at.append(here[0])
            source_at.append(there[0])
        out.append((base_at, source_at))
    return out


def _take_last(full: Any, last: Any, width: int | None = None) -> Any:
    """Each row's logits at its column ``last`` of the padded batch (``width`` columns),
    from logits that hold the batch's last ``full.shape[1]`` columns (all of them, or
    fewer where the forward was asked for ``logits_to_keep``)."""
    import torch

    offset = 0 if width is None else width - int(full.shape[1])
    at = last.to(full.device) - offset
    return full[torch.arange(full.shape[0], device=full.device), at]


def logits_kept(model: Any, inputs: Mapping[str, Any], last: Any) -> int | None:
    """How many of the batch's last columns a grid's forwards need logits at (each
    row's ``last`` among them), where the model's forward computes logits only there
    when asked (``logits_to_keep``, transformers' own test); None where it cannot be
    asked (the forward has no such keyword, or its logits are not over the input
    tokens: an encoder-decoder's are over the decoder's). The unembedding of every
    other column is work no cell reads."""
    from .generation import keeps_logits

    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False) or not keeps_logits(model):
        return None
    ids = inputs.get("input_ids")
    if ids is None or getattr(ids, "ndim", 0) != 2:
        return None
    return int(ids.shape[1]) - int(last.min())


def _with_extra(rows: Callable[[Any], Any], extra: Mapping[str, Any]) -> Callable[[Any], Any]:
    """``rows`` (an engine's ``batched``), each subset's forward given ``extra``
    keywords as well."""
    from .hooks import Prepared

    if not extra:
        return rows

    def with_extra(index: Any) -> Any:
        got = rows(index)
        if isinstance(got, Prepared):
            return Prepared(got.call, {**got.kwargs, **extra})
        return {**got, **extra}

    return with_extra


def _located(
    model: Any, component: str, layers: Iterable[int]
) -> tuple[dict[int, ComponentAddress], dict[int, str]]:
    """The component at each layer that has it, and why each other layer has not;
    refused where no position can be patched (no sequence axis, read-only)."""
    addresses: dict[int, ComponentAddress] = {}
    refused: dict[int, str] = {}
    for layer in layers:
        try:
            addresses[layer] = locate(model, component, layer)
        except (ComponentError, LookupError) as exc:
            if not isinstance(exc, CausalabError):
                raise
            refused[layer] = str(exc)
    for address in addresses.values():
        if address.sequence_axis is None:
            raise ComponentError(
                f"{address} has no sequence axis: a grid over positions patches tokens"
            )
        if not address.writable:
            raise ComponentError(f"{address} is read-only: {address.why_read_only}")
    return addresses, refused


@dataclass
class _Layer:
    """One layer's cells, ready to run: the batch, the engine, the cells' rows."""

    model: Any
    runner: Engine
    inputs: dict[str, Any]
    rows: Callable[[Any], Any]  # row indices -> the batch's rows there, as runner.run takes
    logits_at: ComponentAddress
    last: Any
    # the padded length of the columns ``last`` indexes, where the forwards keep the
    # logits of the last columns only (None: they keep every column)
    width: int | None
    pair_of: Any  # cell c -> its pair (cell c = position c // k, pair c % k)
    base_tok: Any  # cell c -> the base token it patches
    batch_size: int

    def run(self, address: ComponentAddress, source_vals: Any) -> Iterator[tuple[Any, Any]]:
        """Per chunk of cells, (the cells, their patched last-token logits)."""
        import torch

        seq = address.sequence_axis
        assert seq is not None
        n_cells = int(self.pair_of.shape[0])
        for start in range(0, n_cells, self.batch_size):
            stop = min(start + self.batch_size, n_cells)
            pairs = self.pair_of[start:stop]
            at, put, n = self.base_tok[start:stop], source_vals[start:stop], stop - start

            def patch(full: Any, at: Any = at, put: Any = put, n: int = n) -> Any:
                patched = full.clone()
                patched.movedim(seq, 1)[torch.arange(n), at.to(full.device)] = put.to(full.dtype)
                return patched

            last_rows = self.last[pairs]
            plan = Plan((Step(address, True, None), Step(self.logits_at)))
            program = self.runner.lower(
                plan,
                self.model,
                edits=[
                    (patch, None),
                    (None, lambda full, lr=last_rows: _take_last(full, lr, self.width)),
                ],
            )
            (logits,) = self.runner.run(self.model, program, self.rows(pairs))
            yield torch.arange(start, stop), logits


# Tokens (rows x padded length) per forward on CPU where the caller gives no budget:
# past about this many a forward's activations leave the caches and each row costs
# more (tiny Llama 4 x 256 at 128 tokens: 8.1 ms a row at 8 rows, 8.7 at 16, 9.2 at
# 32; at 23 tokens 64 rows are cheapest); on an accelerator only ``batch_size``
# bounds a chunk.
CPU_BATCH_TOKENS = 1536


def rows_per_forward(
    model: Any, length: int, batch_size: int, batch_tokens: int | None, cells: int | None = None
) -> int:
    """How many cells a grid's forward takes: ``batch_size`` rows at most, and at most
    ``batch_tokens`` tokens (rows x ``length``, the padded length); ``None``:
    ``CPU_BATCH_TOKENS`` where the model runs on CPU, no token bound elsewhere. Given
    ``cells`` (a layer's), as few forwards as those bounds allow, of equal size (96
    cells at 44 rows: three of 32, not 44, 44 and 8)."""
    if batch_tokens is None:
        device = getattr(model, "device", None)
        on_cpu = device is None or getattr(device, "type", str(device)) == "cpu"
        batch_tokens = CPU_BATCH_TOKENS if on_cpu else None
    most = batch_size
    if batch_tokens is not None:
        most = max(1, min(batch_size, batch_tokens // max(1, length)))
    if cells is None or cells <= most:
        return most if cells is None else max(1, cells)
    forwards = -(-cells // most)
    return -(-cells // forwards)


def _length(inputs: Mapping[str, Any]) -> int:
    """The batch's padded length: its longest (rows, tokens) tensor's."""
    return max((int(v.shape[-1]) for v in inputs.values() if getattr(v, "ndim", 0) == 2), default=1)


def _check(
    bases: Sequence[str], sources: Sequence[str], batch_size: int, batch_tokens: int | None
) -> None:
    if type(batch_size) is not int or batch_size < 1:
        raise CausalabError(f"batch_size is a positive int, not {batch_size!r}")
    if batch_tokens is not None and (type(batch_tokens) is not int or batch_tokens < 1):
        raise CausalabError(f"batch_tokens is a positive int or None, not {batch_tokens!r}")
    if isinstance(bases, str) or isinstance(sources, str) or len(bases) != len(sources):
        raise PositionError("bases and sources are lists of texts, one source per base")
    if not bases:
        raise PositionError("no pairs: give at least one base and its source")


def _sources_once(layer: _Layer, addresses: list[ComponentAddress]) -> dict[Any, Any]:
    """Every source (and base) once: one forward reads the component at every layer
    and the logits; the reads by address."""
    import torch

    plan = Plan.of(reads=[*addresses, layer.logits_at])
    program = layer.runner.lower(plan, layer.model)
    every_row = torch.arange(int(layer.last.shape[0]))  # bases, then sources
    values = layer.runner.run(layer.model, program, layer.rows(every_row))
    return dict(zip(program.reads, values, strict=True))


def _fill(
    layer: _Layer,
    addresses: dict[int, ComponentAddress],
    read: dict[Any, Any],
    cells: list[tuple[list[int], list[int]]],
    shape: tuple[int, int, int],
    full_logits: Any,
    metric: Metric | None,
    keep: bool,
) -> tuple[Any, Any, int]:
    """Run every layer's cells: (logits per cell where kept, the metric per cell where
    given, the forwards run, the sources' one included)."""
    import torch

    k = shape[2]
    logits_out = torch.empty((*shape, int(full_logits.shape[-1]))) if keep else None
    values_out: Any = None
    source_tok = torch.tensor([t for _, source_at in cells for t in source_at])
    forwards = 1
    for li, address in enumerate(addresses.values()):
        assert address.sequence_axis is not None
        # every cell's source value: the source row's token, as the place hands it on
        moved = read[address].movedim(address.sequence_axis, 1)
        source_vals = moved[k + layer.pair_of, source_tok.to(moved.device)]
        for cell, logits in layer.run(address, source_vals):
            forwards += 1
            if logits_out is not None:
                logits_out[li, cell // k, cell % k] = logits.to(logits_out.dtype).detach().cpu()
            if metric is not None:
                measured = torch.as_tensor(metric(logits, layer.pair_of[cell])).detach().cpu()
                if values_out is None:
                    values_out = torch.empty(shape, dtype=measured.dtype)
                values_out[li, cell // k, cell % k] = measured
    return logits_out, values_out, forwards


def grid(
    model: Any,
    component: str,
    layers: Iterable[int],
    positions: Any,
    bases: Sequence[str],
    sources: Sequence[str],
    *,
    metric: Metric | None = None,
    engine: str | Engine = "nnsight",
    frame: str = "plain",
    batch_size: int = 64,
    batch_tokens: int | None = None,
    keep_logits: bool | None = None,
) -> GridResult:
    """Patch ``component`` at each of ``layers`` and ``positions`` (specs naming one
    token per row, or ``"all"``) from each pair's source into its base (the module's
    text). ``metric(logits, pairs)``: (n, vocab) last-token logits and their pairs (n,)
    -> (n,); ``keep_logits`` (default: no metric) keeps each cell's logits. A forward
    takes at most ``batch_size`` cells and ``batch_tokens`` tokens
    (``rows_per_forward``)."""
    import torch

    runner = engine_for(engine)
    _check(bases, sources, batch_size, batch_tokens)
    k = len(bases)
    encoded = encode(model, [*bases, *sources], frame)
    specs = _positions(model, encoded, positions, k)
    cells = _cells(model, encoded, specs, k, bases)
    addresses, refused = _located(model, component, layers)
    logits_at = locate(model, "logits")
    inputs = trace_inputs(model, encoded)
    if runner.target is not Target.REMOTE:
        dispatched(model)  # the weights where they run: the token budget is the device's
    # where each row predicts its next token ({"anchor": "last"})
    last = torch.tensor([f.real[-1] for f in encoded.frames])
    kept = logits_kept(model, inputs, last)
    extra = {} if kept is None else {"logits_to_keep": kept}
    layer = _Layer(
        model,
        runner,
        inputs,
        _with_extra(runner.batched(model, inputs), extra),
        logits_at,
        last,
        None if kept is None else int(inputs["input_ids"].shape[1]),
        torch.arange(k).repeat(len(specs)),
        torch.tensor([t for base_at, _ in cells for t in base_at]),
        rows_per_forward(model, _length(inputs), batch_size, batch_tokens, k * len(specs)),
    )
    read = _sources_once(layer, list(addresses.values()))
    full_logits = _take_last(read[logits_at], layer.last, layer.width)
    keep = metric is None if keep_logits is None else keep_logits
    shape = (len(addresses), len(specs), k)
    out = _fill(layer, addresses, read, cells, shape, full_logits, metric, keep)
    clean = (full_logits[:k], full_logits[k:])
    return GridResult(component, tuple(addresses), tuple(specs), *out[:2], *clean, refused, out[2])


__all__ = ["CPU_BATCH_TOKENS", "GridResult", "Metric", "grid", "logits_kept", "rows_per_forward"]
