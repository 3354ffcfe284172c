"""Running an experiment's cells with the library's public verbs: ``interchange`` for a
patch from the source, a ``Plan`` with writes for zero and mean ablation, a ``Plan``
read and ``model.lens`` for the logit lens. Each cell gives its metrics (averaged over
the rows, and per row); a cell the model refuses at run time (a place its engine cannot
serve) is recorded with that reason, never raised halfway through a run."""

from __future__ import annotations

from typing import Any

from .experiment import Binding, Cell, Experiment, texts_of
from .grids import grid_logits, gridded
from .metrics import per_row
from .reading import batch_for, chunks, read


def _logits_at(model: Any) -> Any:
    from ..locator import locate

    return locate(model, "logits", position={"index": -1})


def clean_logits(exp: Experiment, role: str, slot: int = 0, size: int | None = None) -> Any:
    """The unpatched logits at each row's last content token of the ``role`` texts, in
    batches of ``size`` rows (the document's batch size where not given)."""
    import torch

    from ..plan import Plan

    at = _logits_at(exp.model)
    texts = texts_of(exp.rows, role, slot)
    parts = []
    for part in chunks(len(texts), size or exp.batch_size):
        out = Plan.of(reads=[at]).run(exp.model, texts[part], frame=exp.frame, engine=exp.engine)
        parts.append(out[at][:, 0])
    return torch.cat(parts)


def _patch_cell(exp: Experiment, cell: Cell, texts: list[str], part: slice) -> Any:
    from ..interchange import Patch, interchange

    patches = [
        Patch(address, int(w.get("source", 0)))
        for w in exp.writes_of(cell.intervention)
        for address in cell.addresses[w["site"]]
    ]
    slots = 1 + max(p.source for p in patches)
    sources = [
        tuple(r["source"][:slots]) if isinstance(r["source"], list) else r["source"]
        for r in exp.rows.rows[part]
    ]
    result = interchange(
        exp.model,
        patches,
        bases=texts,
        sources=sources,
        batch_size=exp.batch_size,
        frame=exp.frame,
        engine=exp.engine,
    )
    return result.logits


def _mean(exp: Experiment, address: Any, role: str) -> Any:
    """The mean of ``address``'s clean values over every row of ``role`` and every
    token it names (one value of the place's last axes), computed once."""
    import dataclasses

    import torch

    # a featurized place's mean is of its features: the same for every selection
    f = address.featurizer
    kind = None if f is None else type(f).__name__
    key = ("mean", dataclasses.replace(address, featurizer=None), kind, role)
    if key not in exp.cache:
        texts = texts_of(exp.rows, role)
        size = batch_for(exp, [address], texts)
        parts = []
        for part in chunks(len(texts), size):
            held = read(exp, [address], texts[part])[address]
            parts.append(held.reshape(-1, *held.shape[2:]))
        exp.cache[key] = torch.cat(parts).mean(0)
    return exp.cache[key]


def selected(b: Binding) -> tuple[int, ...] | None:
    """The coordinates a write at binding ``b`` sets: its units of the place's last axis,
    or its features of the site's featurizer (None: all)."""
    return b.units if b.units is not None else b.features


def _write_values(exp: Experiment, cell: Cell, part: slice, role: str) -> list[tuple[Any, Any]]:
    """(address, value) of each write made here (zero, mean, and a source write at
    units), made like the place's clean tensor on these rows: zeros, the mean over
    every row and named token, or the source row's value; where the site names units,
    only those units of the last axis, the others as the clean run has them."""
    from .vectors import mechanism

    texts = texts_of(exp.rows, role)[part]
    wanted = [
        (address, w, selected(cell.bindings[w["site"]]))
        for w in exp.writes_of(cell.intervention)
        for address in cell.addresses[w["site"]]
    ]
    out = [(a, mechanism(exp, w["mechanism"], a)) for a, w, _ in wanted if "mechanism" in w]
    wanted = [x for x in wanted if "mechanism" not in x[1]]
    if not wanted:
        return out
    clean = read(exp, [a for a, _, _ in wanted], texts)
    sources: dict[int, dict[Any, Any]] = {}
    for address, w, units in wanted:
        held = clean[address]
        if w["value"] == "zero":
            value = held.new_zeros(held.shape)
        elif w["value"] == "mean":
            value = _mean(exp, address, role).to(held.dtype).expand_as(held)
        else:
            slot = int(w.get("source", 0))
            if slot not in sources:
                texts_k = texts_of(exp.rows, "source", slot)[part]
                sources[slot] = read(exp, [a for a, _, _ in wanted], texts_k)
            value = sources[slot][address]
        if units is None:
            out.append((address, value.clone()))
        else:
            mixed = held.clone()
            mixed[..., list(units)] = value[..., list(units)]
            out.append((address, mixed))
    return out


def _plan_cell(exp: Experiment, cell: Cell, part: slice, role: str) -> Any:
    """The logits of one batch with the cell's zero/mean writes, read at the last token
    (or through the lens at the readout site)."""
    from ..plan import Plan

    item = exp.doc["interventions"][cell.intervention]
    readout = item.get("readout", "logits")
    if readout == "logits":
        at = _logits_at(exp.model)
    else:
        site = exp.doc["reads"][readout]["site"]
        (at,) = cell.addresses[site][:1]
    writes = _write_values(exp, cell, part, role)
    texts = texts_of(exp.rows, role)[part]
    out = Plan.of(reads=[at], writes=writes).run(
        exp.model, texts, frame=exp.frame, engine=exp.engine
    )
    value = out[at][:, -1]
    if readout == "logits":
        return value
    import torch

    with torch.no_grad():
        return exp.model.lens(value)


def patching(exp: Experiment, cell: Cell) -> bool:
    """Whether the cell runs as an interchange (source writes of whole places; a source
    write at units runs as a plan: the source read, then the base written)."""
    return any(
        w.get("value") == "source" and cell.bindings[w["site"]].units is None
        for w in exp.writes_of(cell.intervention)
    )


def batched_in(exp: Experiment, cell: Cell) -> int:
    """The batch size a cell's logits are made in: a plan cell's ``batch_for`` its
    addresses (one row at a time where a position names different numbers of tokens
    in different rows), every other cell's the document's."""
    item = exp.doc["interventions"][cell.intervention]
    if "attribute" in item or "generate" in item or gridded(exp, cell) or patching(exp, cell):
        return exp.batch_size
    texts = texts_of(exp.rows, item.get("input", "base"))
    return batch_for(exp, [a for v in cell.addresses.values() for a in v], texts)


def cell_logits(exp: Experiment, cell: Cell, bound: bool = False) -> Any:
    """The logits the cell's metrics read, (rows, vocab), over every batch of rows
    (``bound``: the cell's addresses already carry their featurizers)."""
    import torch

    from .fitting import featurize

    if not bound:
        cell = featurize(exp, cell)
    if gridded(exp, cell):
        return grid_logits(exp, cell)
    item = exp.doc["interventions"][cell.intervention]
    role = item.get("input", "base")
    texts = texts_of(exp.rows, role)
    patched = patching(exp, cell)
    size = batched_in(exp, cell)
    parts = []
    for part in chunks(len(texts), size):
        if patched:
            parts.append(_patch_cell(exp, cell, texts[part], part))
        else:
            parts.append(_plan_cell(exp, cell, part, role))
    return torch.cat(parts)


def number(value: Any) -> float | None:
    """A float for JSON: None where it is not finite (JSON has no NaN)."""
    import math

    number = float(value)
    return number if math.isfinite(number) else None


def measure(exp: Experiment, logits: Any, references: dict[str, Any]) -> dict[str, Any]:
    """Each metric of ``logits``: its mean over the rows, and per row (None where the
    logits are not finite, with those rows under ``nonfinite``)."""
    import torch

    tokens = {k: torch.tensor(v) for k, v in exp.tokens.items()}
    means: dict[str, float | None] = {}
    rows: dict[str, list[float | None]] = {}
    for metric in exp.metrics:
        values = per_row(metric, logits, tokens, references.get(metric.against))
        means[metric.label] = number(values.mean())
        rows[metric.label] = [number(v) for v in values]
    out: dict[str, Any] = {"metrics": means, "per_row": rows}
    bad = [int(i) for i in (~torch.isfinite(logits.float()).all(-1)).nonzero().flatten()]
    if bad:
        out["nonfinite"] = bad
    return out


def attribution_label(item: dict[str, Any], exp: Experiment) -> str:
    """The column an attribution's scores go under: method[metric label]."""
    attribute = item["attribute"]
    metric = next(m for m in exp.metrics if m.name == attribute["metric"])
    return f"{attribute.get('method', 'atp')}[{metric.label}]"


def attribute_cell(exp: Experiment, cell: Cell) -> dict[str, Any]:
    """An attribution cell's scores: per row, the summed attribution of every address
    (and position) of the cell (the first-order estimate of patching them all), and
    its mean over the rows."""
    import torch

    from ..attribution import attribute

    item = exp.doc["interventions"][cell.intervention]
    spec = item["attribute"]
    metric = next(m for m in exp.metrics if m.name == spec["metric"])
    addresses = cell.addresses[spec["site"]]
    bases, sources = texts_of(exp.rows, "base"), texts_of(exp.rows, "source")
    rows = []
    for part in chunks(len(bases), exp.batch_size):
        tokens = {k: torch.tensor(v[part]) for k, v in exp.tokens.items()}

        def measure_rows(logits: Any, tokens: Any = tokens) -> Any:
            # the attribution's forward holds the bases, then their sources: each pair's
            # tokens serve both of its rows
            times = logits.shape[0] // max(len(next(iter(tokens.values()))), 1)
            return per_row(metric, logits, {k: v.repeat(times) for k, v in tokens.items()}, None)

        result = attribute(
            exp.model,
            addresses,
            bases[part],
            sources[part],
            measure_rows,
            method=spec.get("method", "atp"),
            steps=int(spec.get("steps", 16)),
            engine=exp.engine,
            frame=exp.frame,
        )
        rows.append(sum(result.scores[a].sum(1) for a in addresses))
    scores = torch.cat(rows)
    label = attribution_label(item, exp)
    return {
        "metrics": {label: number(scores.mean())},
        "per_row": {label: [number(v) for v in scores]},
    }


__all__ = [
    "attribute_cell",
    "attribution_label",
    "batched_in",
    "cell_logits",
    "clean_logits",
    "measure",
    "number",
    "patching",
    "selected",
]
