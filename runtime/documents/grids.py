"""Patching cells run as one grid: where an intervention patches one place from the
first source at one layer and one token per row in each cell, its cells are the cells
of ``causalab_mini.patching.grid`` (the texts tokenized once, the sources run once for
every layer, the cells of a layer packed into as few forwards as the batch size
allows), which equals one interchange per cell. Other patches run cell by cell."""

from __future__ import annotations

import json
import math
from typing import Any

from .experiment import Cell, Experiment, texts_of


def gridded(exp: Experiment, cell: Cell) -> bool:
    """Whether ``cell`` runs in its intervention's grid."""
    if cell.refused is not None:
        return False
    writes = exp.writes_of(cell.intervention)
    if len(writes) != 1 or writes[0].get("value") != "source" or int(writes[0].get("source", 0)):
        return False
    b = cell.bindings[writes[0]["site"]]
    if exp.featurizer_of(cell.intervention, writes[0]["site"]) is not None:
        return False
    one_place = len(b.layers) == 1 and b.layers[0] is not None and b.heads == (None,)
    if not one_place or b.units is not None or not isinstance(b.positions, dict):
        return False
    return _one_token(exp, b.positions)


def _one_token(exp: Experiment, spec: dict[str, Any]) -> bool:
    from ..positions import PositionError, encode, resolve

    key = ("one token", json.dumps(spec, sort_keys=True))
    if key not in exp.cache:
        encoded = encode(exp.model, texts_of(exp.rows, "base"), exp.frame)
        try:
            exp.cache[key] = all(len(i) == 1 for i in resolve(exp.model, encoded, spec))
        except PositionError:
            exp.cache[key] = False
    return bool(exp.cache[key])


def _pending(exp: Experiment, intervention: str) -> tuple[list[int], list[Any]]:
    """The layers and position specs of the intervention's grid cells still to run."""
    done = exp.cache.get("done", set())
    layers: list[int] = []
    specs: list[Any] = []
    for cell in exp.cells:
        if cell.intervention != intervention or cell.key in done or not gridded(exp, cell):
            continue
        (b,) = (cell.bindings[w["site"]] for w in exp.writes_of(intervention))
        layer = b.layers[0]
        assert layer is not None
        if layer not in layers:
            layers.append(layer)
        if b.positions not in specs:
            specs.append(b.positions)
    return layers, specs


def grid_forwards(exp: Experiment) -> int:
    """The forwards the grids of the run make: per intervention with grid cells, one
    for the clean bases and sources, and per layer the batches of its patched rows."""
    total = 0
    for intervention in exp.doc["interventions"]:
        layers, specs = _pending(exp, intervention)
        if layers:
            rows = len(specs) * len(exp.rows.rows)
            total += 1 + len(layers) * math.ceil(rows / exp.batch_size)
    return total


def grid_logits(exp: Experiment, cell: Cell) -> Any:
    """The cell's patched logits (rows, vocab), from its intervention's grid (run once,
    over every grid cell still to run)."""
    from ..patching import grid

    key = ("grid", cell.intervention)
    if key not in exp.cache:
        layers, specs = _pending(exp, cell.intervention)
        (w,) = exp.writes_of(cell.intervention)
        result = grid(
            exp.model,
            cell.bindings[w["site"]].component,
            layers,
            specs,
            texts_of(exp.rows, "base"),
            texts_of(exp.rows, "source", 0),
            engine=exp.engine,
            frame=exp.frame,
            batch_size=exp.batch_size,
            keep_logits=True,
        )
        exp.cache[key] = (result, list(result.layers), specs)
    result, layers, specs = exp.cache[key]
    (w,) = exp.writes_of(cell.intervention)
    b = cell.bindings[w["site"]]
    return result.logits[layers.index(b.layers[0]), specs.index(b.positions)]


__all__ = ["grid_forwards", "grid_logits", "gridded"]
