"""A run's cells one by one: each cell's record (its coordinates, status, metrics or
the reason it was refused, its time), made by the path the cell takes (a patch, a
plan with writes, a lens read, an attribution, a fit, a generation); and the forwards
and backwards a run makes, said before it runs (``explain``) and counted after."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ..errors import CausalabError
from .execute import (
    attribute_cell,
    batched_in,
    cell_logits,
    clean_logits,
    measure,
    patching,
)
from .experiment import Cell, Experiment, texts_of
from .fits import label_splits, labels, train_cell, train_counts
from .fitting import featurize
from .generating import generate_cell, generation_forwards, steps_of
from .grids import grid_forwards, gridded
from .reading import batch_for, forwards_of, role_texts
from .sections import trained_interventions
from .vectors import vector_forwards


def _path(exp: Experiment, cell: Cell) -> tuple[Any, dict[str, Any]]:
    """The cell's logits (None for an attribution) and what else its record holds."""
    import torch

    item = exp.doc["interventions"][cell.intervention]
    if "attribute" in item:
        return None, attribute_cell(exp, cell)
    if cell.intervention in trained_interventions(exp.doc):
        bound, fitted = train_cell(exp, cell)
        with torch.no_grad():
            return cell_logits(exp, bound, bound=True), {"train": fitted}
    with torch.no_grad():
        if "generate" in item:
            return generate_cell(exp, featurize(exp, cell))
        return cell_logits(exp, cell), {}


def run_cell(exp: Experiment, cell: Cell, references: dict[str, Any]) -> dict[str, Any]:
    """One cell's record: its coordinates, status, metrics (or refusal) and time."""
    record: dict[str, Any] = {
        "key": cell.key,
        "intervention": cell.intervention,
        **cell.coords,
        "addresses": {s: [str(a) for a in v] for s, v in cell.addresses.items()},
    }
    if cell.refused is not None:
        return {**record, "status": "refused", "reason": cell.refused}
    started = time.perf_counter()
    try:
        logits, extra = _path(exp, cell)
    except CausalabError as exc:  # a place the engine or the model refuses at run time
        return {**record, "status": "refused", "reason": str(exc)}
    if logits is not None:
        record.update(measure(exp, logits, _references(exp, cell, references)))
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(record.get(key), dict):
            record[key].update(value)
        else:
            record[key] = value
    record["status"] = "ok"
    if "nonfinite" in record:  # the model's own numbers: said, not hidden in a mean
        record["status"] = "nonfinite"
        record["reason"] = (
            f"the logits of rows {record['nonfinite']} are not finite (NaN or inf) in this "
            "cell: their metrics are null"
        )
    record["seconds"] = round(time.perf_counter() - started, 4)
    return record


def _references(exp: Experiment, cell: Cell, references: dict[str, Any]) -> dict[str, Any]:
    """The clean references a cell's logits are measured against, made in the batches
    the cell made its rows in (``batched_in``): a row's logits can round apart in
    batches of other sizes (the CPU's matrix kernels block by size), so a write that
    changes nothing measures exactly the clean run's values."""
    import torch

    size = batched_in(exp, cell)
    if size == exp.batch_size:
        return references
    key = ("references", size)
    if key not in exp.cache:
        with torch.no_grad():
            again = {
                k: clean_logits(exp, k, size=size) for k in ("base", "source") if k in references
            }
        exp.cache[key] = {**references, **again}
    kept: dict[str, Any] = exp.cache[key]
    return kept


def run_cells(
    exp: Experiment,
    done: dict[str, dict[str, Any]],
    on_cell: Callable[[dict[str, Any]], None],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The clean references and every cell's record (the ``done`` ones kept as they
    were); ``on_cell`` is told each new record as it is made."""
    import torch

    with torch.no_grad():
        references = {"base": clean_logits(exp, "base")}
        if all("source" in r for r in exp.rows.rows):
            references["source"] = clean_logits(exp, "source")
    if any(m.against == "labels" for m in exp.metrics):
        references["labels"] = labels(exp, "rows")
    clean = {k: measure(exp, v, references) for k, v in references.items()}
    exp.cache["done"] = set(done)  # the grids run only the cells still to run
    records = []
    for cell in exp.cells:
        if cell.key in done:
            records.append(done[cell.key])
            continue
        record = run_cell(exp, cell, references)
        on_cell(record)
        records.append(record)
    return clean, records


def _attribution_steps(exp: Experiment, cell: Cell) -> int:
    """The backwards of an attribution cell (integrated gradients: one per step more)."""
    attribute = exp.doc["interventions"][cell.intervention]["attribute"]
    per = 1 + (int(attribute.get("steps", 16)) if attribute.get("method") == "ig" else 0)
    return math.ceil(len(exp.rows.rows) / exp.batch_size) * per


def _pending(exp: Experiment) -> list[Cell]:
    done = exp.cache.get("done", set())
    return [c for c in exp.cells if c.refused is None and c.key not in done]


def backwards(exp: Experiment) -> int:
    """The backward passes a run makes: one per batch of an attribution cell (integrated
    gradients: one per step besides), one per training step of a fitted cell."""
    total = 0
    trained = trained_interventions(exp.doc)
    for cell in _pending(exp):
        if "attribute" in exp.doc["interventions"][cell.intervention]:
            total += _attribution_steps(exp, cell)
        elif cell.intervention in trained:
            total += train_counts(exp, cell)[1]
    return total


def _plan_forwards(exp: Experiment, cell: Cell, means: set[Any], vectors: set[Any]) -> int:
    """A plan cell's forwards: one per batch, one more where a value write reads the
    place's clean tensor, one per source it reads; the means and vectors it needs
    gathered in ``means`` and ``vectors`` (each computed once per run)."""
    n = len(exp.rows.rows)
    writes = exp.writes_of(cell.intervention)
    role = exp.doc["interventions"][cell.intervention].get("input", "base")
    addresses = [a for v in cell.addresses.values() for a in v]
    batches = math.ceil(n / batch_for(exp, addresses, texts_of(exp.rows, role)))
    valued = [w for w in writes if "value" in w]
    slots = {int(w.get("source", 0)) for w in valued if w["value"] == "source"}
    for w in writes:
        for a in cell.addresses[w["site"]]:
            if w.get("value") == "mean":
                means.add((a, role, exp.featurizer_of(cell.intervention, w["site"])))
            if "mechanism" in w:
                vectors.add((w["mechanism"], a))
    if "generate" in exp.doc["interventions"][cell.intervention]:
        return generation_forwards(exp, cell.intervention)
    return batches * ((2 if valued else 1) + len(slots))


def _cell_forwards(exp: Experiment, cell: Cell, means: set[Any], vectors: set[Any]) -> int:
    n = len(exp.rows.rows)
    if "attribute" in exp.doc["interventions"][cell.intervention]:
        return _attribution_steps(exp, cell)
    if cell.intervention in trained_interventions(exp.doc):
        return train_counts(exp, cell)[0] + math.ceil(n / exp.batch_size)
    if patching(exp, cell):
        return math.ceil(n / exp.batch_size)
    return _plan_forwards(exp, cell, means, vectors)


def _once(exp: Experiment, pending: list[Cell]) -> int:
    """The forwards made once per run for the pending cells: the clean generation,
    the labels a fit learns, the fitted featurizers' samples."""
    total = 0
    interventions = {c.intervention for c in pending}
    steps = {steps_of(exp, i) for i in interventions if "generate" in exp.doc["interventions"][i]}
    total += sum(math.ceil(len(exp.rows.rows) / exp.batch_size) * k for k in steps)
    if isinstance(exp.doc.get("train"), dict):
        total += _label_forwards(exp)
    # the clean references again in each other batch size a cell makes its rows in
    sizes = {batched_in(exp, c) for c in pending} - {exp.batch_size}
    roles = 2 if all("source" in r for r in exp.rows.rows) else 1
    total += sum(math.ceil(len(exp.rows.rows) / size) * roles for size in sizes)
    return total + _fit_forwards(exp, pending)


def _label_forwards(exp: Experiment) -> int:
    from dataclasses import replace

    spec = exp.doc["train"]["labels"]
    total = 0
    for _, rows in label_splits(exp):
        on = replace(exp, rows=rows, cache={"fitted": exp.cache.get("fitted", {})})
        if spec == "source":
            total += math.ceil(len(rows.rows) / exp.batch_size)
        elif "intervention" in spec:
            (cell,) = (c for c in exp.cells if c.intervention == spec["intervention"])
            total += _cells_forwards(on, [cell])
    return total


def _fit_forwards(exp: Experiment, pending: list[Cell]) -> int:
    """One harvest per fitted featurizer and place (PCA, an SAE trained here)."""
    from dataclasses import replace

    from .fitting import fit_rows

    places: set[Any] = set()
    for cell in pending:
        for site in cell.bindings:
            name = exp.featurizer_of(cell.intervention, site)
            item = (exp.doc.get("featurizers") or {}).get(name or "", {})
            if item.get("kind") == "pca" or (item.get("kind") == "sae" and "file" not in item):
                places.update((name, a) for a in cell.addresses[site])
    total = 0
    for name, a in places:
        place = replace(a, featurizer=None)
        total += forwards_of(exp, [place], role_texts(exp, fit_rows(exp, name)))
    return total


def forwards(exp: Experiment) -> int:
    """The forwards a run makes: the clean runs (bases, sources); each cell's (see
    ``_cell_forwards``); once per run each mean, vector, label and fit. Training cells
    count the epochs they ran once run (before: every epoch)."""
    n = len(exp.rows.rows)
    total = math.ceil(n / exp.batch_size)
    if all("source" in r for r in exp.rows.rows):
        total *= 2
    total += grid_forwards(exp)
    pending = [c for c in _pending(exp) if not gridded(exp, c)]
    return total + _cells_forwards(exp, pending) + _once(exp, pending)


def _cells_forwards(exp: Experiment, cells: list[Cell]) -> int:
    """The forwards of ``cells`` (none gridded), with the means and vectors they need."""
    n = len(exp.rows.rows)
    means: set[Any] = set()
    vectors: set[Any] = set()
    total = 0
    for cell in cells:
        if gridded(exp, cell):  # a grid of one cell: the sources, then the patched rows
            total += 1 + math.ceil(n / exp.batch_size)
            continue
        total += _cell_forwards(exp, cell, means, vectors)
    for address, role, _ in means:
        total += math.ceil(n / batch_for(exp, [address], texts_of(exp.rows, role)))
    return total + sum(vector_forwards(exp, name, a) for name, a in vectors)


__all__ = ["backwards", "forwards", "run_cell", "run_cells"]
