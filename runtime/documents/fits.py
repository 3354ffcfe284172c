"""The cells ``train`` fits (``causalab_mini.training.train``): in each cell of an
intervention whose source patch is at a site in the trained featurizer, a fresh
featurizer per address (its own seed's start) is fitted on the train split's pairs to
the labels (the clean source run, a row field, or another intervention's logits), the
eval split picking the epoch kept and stopping early; then the cell is measured on the
document's rows with what was fitted. The model's weights are never changed."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .data import Rows, split_rows
from .execute import cell_logits, clean_logits
from .experiment import Cell, Experiment, texts_of
from .fitting import featurize
from .sections import trained_interventions
from .source import DocumentError

INTERCHANGE_BATCH = 32  # the pairs one interchange forward takes (its default)


def rows_of_split(exp: Experiment, key: str) -> Rows | None:
    """The rows of train's ``split`` (default train) or ``eval_split`` (None: none),
    or the document's rows (``rows``)."""
    if key == "rows":
        return exp.rows
    train = exp.doc["train"]
    name = train.get(key, "train" if key == "split" else None)
    if name is None:
        return None
    rows, issues = split_rows(exp.source, name, ("train", key))
    if rows is None:
        raise DocumentError(issues)
    return rows


def _on(exp: Experiment, rows: Rows) -> Experiment:
    """``exp`` over other rows (its fitted featurizers shared)."""
    return dataclasses.replace(exp, rows=rows, cache={"fitted": exp.cache.setdefault("fitted", {})})


def labels(exp: Experiment, key: str) -> Any:
    """The labels of split ``key``'s rows: logits (objective kl) or token ids."""
    import torch

    cached = ("labels", key)
    if cached in exp.cache:
        return exp.cache[cached]
    train = exp.doc["train"]
    rows = rows_of_split(exp, key)
    assert rows is not None
    spec = train["labels"]
    with torch.no_grad():
        if spec == "source":
            logits = clean_logits(_on(exp, rows), "source")
        elif "intervention" in spec:
            (cell,) = (c for c in exp.cells if c.intervention == spec["intervention"])
            logits = cell_logits(_on(exp, rows), cell)
        else:
            logits = None
    if logits is None:
        value: Any = texts_of(rows, spec["field"])
    elif train["objective"] == "kl" or key == "rows":  # a reference: the logits
        value = logits.detach().float()
    else:
        value = logits.detach().argmax(-1)
    exp.cache[cached] = value
    return value


def _summary(f: Any) -> dict[str, Any]:
    """What a fitted featurizer holds, short: a gate's mask (and how many of its
    weights are open, above 0.5)."""
    import torch

    from ..featurizers import Gate

    if not isinstance(f, Gate):
        return {}
    with torch.no_grad():
        mask = f.mask().detach().float()
    return {"mask": [round(float(v), 4) for v in mask], "open": int((mask > 0.5).sum())}


def train_cell(exp: Experiment, cell: Cell) -> tuple[Cell, dict[str, Any]]:
    """The cell with its trained featurizers bound, and what training gave (history,
    the epoch kept, the eval split's IIA)."""
    from ..training import train

    spec = exp.doc["train"]
    bound = featurize(exp, cell)  # fresh featurizers: a subspace or gate from its seed
    trained = [
        a
        for w in exp.writes_of(cell.intervention)
        for a in bound.addresses[w["site"]]
        if exp.featurizer_of(cell.intervention, w["site"]) == spec["featurizer"]
    ]
    rows = rows_of_split(exp, "split")
    held = rows_of_split(exp, "eval_split")
    assert rows is not None
    result = train(
        exp.model,
        trained,
        texts_of(rows, "base"),
        texts_of(rows, "source"),
        labels(exp, "split"),
        objective=spec["objective"],
        epochs=int(spec.get("epochs", 10)),
        batch_size=int(spec.get("batch_size", 16)),
        lr=float(spec.get("learning_rate", 1e-2)),
        seed=int(spec.get("seed", 0)),
        eval=None
        if held is None
        else (texts_of(held, "base"), texts_of(held, "source"), labels(exp, "eval_split")),
        patience=spec.get("early_stop"),
        engine=exp.engine,
        frame=exp.frame,
    )
    for address in trained:  # measured as fitted: a hard-concrete gate at its mean
        address.featurizer.eval()
    exp.cache[("epochs run", cell.key)] = len(result.history)
    exp.cache[("trained", cell.key)] = trained
    record = {
        "history": [{k: round(float(v), 6) for k, v in e.items()} for e in result.history],
        "best_epoch": result.best_epoch,
        "eval_iia": result.iia,
        "rows": len(rows.rows),
        **_summary(trained[0].featurizer),
    }
    return bound, record


def train_counts(exp: Experiment, cell: Cell) -> tuple[int, int]:
    """The forwards and backwards fitting ``cell`` makes (its labels aside): per epoch
    run, an interchange and a backward per batch of the train split, and the eval
    split's interchange; then the eval split once more."""
    spec = exp.doc["train"]
    rows = rows_of_split(exp, "split")
    held = rows_of_split(exp, "eval_split")
    assert rows is not None
    n, size = len(rows.rows), int(spec.get("batch_size", 16))
    epochs = int(exp.cache.get(("epochs run", cell.key), spec.get("epochs", 10)))
    batches = [min(size, n - start) for start in range(0, n, size)]
    per_epoch = sum(math.ceil(b / INTERCHANGE_BATCH) for b in batches)
    evaluation = 0 if held is None else math.ceil(len(held.rows) / INTERCHANGE_BATCH)
    return epochs * (per_epoch + evaluation) + evaluation, epochs * len(batches)


def label_splits(exp: Experiment) -> list[tuple[str, Rows]]:
    """The splits whose labels a run computes: train and eval (where given) for a fit,
    the document's rows for a metric against the labels."""
    out = []
    keys = ["split", "eval_split"] if trained_interventions(exp.doc) else []
    if any(m.against == "labels" for m in exp.metrics):
        keys.append("rows")
    for key in keys:
        rows = rows_of_split(exp, key)
        if rows is not None:
            out.append((key, rows))
    return out


__all__ = ["label_splits", "labels", "rows_of_split", "train_cell", "train_counts"]
