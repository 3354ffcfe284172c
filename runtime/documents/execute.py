"""Running an experiment's cells with the library's public verbs: ``interchange`` for a
patch from the source, a ``Plan`` with writes for zero and mean ablation, a ``Plan``
read and ``model.lens`` for the logit lens. Each cell gives its metrics (averaged over
the rows, and per row); a cell the model refuses at run time (a place its engine cannot
serve) is recorded with that reason, never raised halfway through a run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CausalabError
from .experiment import Cell, Experiment, texts_of
from .grids import grid_forwards, grid_logits, gridded
from .metrics import per_row


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def _logits_at(model: Any) -> Any:
    from ..locator import locate

    return locate(model, "logits", position={"index": -1})


def clean_logits(exp: Experiment, role: str, slot: int = 0) -> Any:
    """The unpatched logits at each row's last content token of the ``role`` texts."""
    import torch

    from ..plan import Plan

    at = _logits_at(exp.model)
    texts = texts_of(exp.rows, role, slot)
    parts = []
    for part in _chunks(len(texts), exp.batch_size):
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


def _read(exp: Experiment, addresses: list[Any], texts: list[str]) -> dict[Any, Any]:
    from ..plan import Plan

    out: dict[Any, Any] = Plan.of(reads=addresses).run(
        exp.model, texts, frame=exp.frame, engine=exp.engine
    )
    return out


def _mean(exp: Experiment, address: Any, role: str) -> Any:
    """The mean of ``address``'s clean values over every row of ``role`` and every
    token it names (one value of the place's last axes), computed once."""
    import torch

    key = ("mean", address, role)
    if key not in exp.cache:
        texts = texts_of(exp.rows, role)
        size = _batch(exp, [address], texts)
        parts = []
        for part in _chunks(len(texts), size):
            held = _read(exp, [address], texts[part])[address]
            parts.append(held.reshape(-1, *held.shape[2:]))
        exp.cache[key] = torch.cat(parts).mean(0)
    return exp.cache[key]


def _write_values(exp: Experiment, cell: Cell, part: slice, role: str) -> list[tuple[Any, Any]]:
    """(address, value) of each write made here (zero, mean, and a source write at
    units), made like the place's clean tensor on these rows: zeros, the mean over
    every row and named token, or the source row's value; where the site names units,
    only those units of the last axis, the others as the clean run has them."""
    texts = texts_of(exp.rows, role)[part]
    wanted = [
        (address, w, cell.bindings[w["site"]].units)
        for w in exp.writes_of(cell.intervention)
        for address in cell.addresses[w["site"]]
    ]
    if not wanted:
        return []
    clean = _read(exp, [a for a, _, _ in wanted], texts)
    sources: dict[int, dict[Any, Any]] = {}
    out = []
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
                sources[slot] = _read(exp, [a for a, _, _ in wanted], texts_k)
            value = sources[slot][address]
        if units is None:
            out.append((address, value.clone()))
        else:
            mixed = held.clone()
            mixed[..., list(units)] = value[..., list(units)]
            out.append((address, mixed))
    return out


def _batch(exp: Experiment, addresses: list[Any], texts: list[str]) -> int:
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


def _patching(exp: Experiment, cell: Cell) -> bool:
    """Whether the cell runs as an interchange (source writes of whole places; a source
    write at units runs as a plan: the source read, then the base written)."""
    return any(
        w["value"] == "source" and cell.bindings[w["site"]].units is None
        for w in exp.writes_of(cell.intervention)
    )


def cell_logits(exp: Experiment, cell: Cell) -> Any:
    """The logits the cell's metrics read, (rows, vocab), over every batch of rows."""
    import torch

    if gridded(exp, cell):
        return grid_logits(exp, cell)
    item = exp.doc["interventions"][cell.intervention]
    role = item.get("input", "base")
    texts = texts_of(exp.rows, role)
    patching = _patching(exp, cell)
    size = exp.batch_size
    if not patching:
        size = _batch(exp, [a for v in cell.addresses.values() for a in v], texts)
    parts = []
    for part in _chunks(len(texts), size):
        if patching:
            parts.append(_patch_cell(exp, cell, texts[part], part))
        else:
            parts.append(_plan_cell(exp, cell, part, role))
    return torch.cat(parts)


def _number(value: Any) -> float | None:
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
        means[metric.label] = _number(values.mean())
        rows[metric.label] = [_number(v) for v in values]
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


def _attribute_cell(exp: Experiment, cell: Cell) -> dict[str, Any]:
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
    for part in _chunks(len(bases), exp.batch_size):
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
        "metrics": {label: _number(scores.mean())},
        "per_row": {label: [_number(v) for v in scores]},
    }


def run_cell(exp: Experiment, cell: Cell, references: dict[str, Any]) -> dict[str, Any]:
    """One cell's record: its coordinates, status, metrics (or refusal) and time."""
    import torch

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
        if "attribute" in exp.doc["interventions"][cell.intervention]:
            record.update(_attribute_cell(exp, cell))
            record["status"] = "ok"
            record["seconds"] = round(time.perf_counter() - started, 4)
            return record
        with torch.no_grad():
            logits = cell_logits(exp, cell)
    except CausalabError as exc:  # a place the engine or the model refuses at run time
        return {**record, "status": "refused", "reason": str(exc)}
    record.update(measure(exp, logits, references))
    record["status"] = "ok"
    if "nonfinite" in record:  # the model's own numbers: said, not hidden in a mean
        record["status"] = "nonfinite"
        record["reason"] = (
            f"the logits of rows {record['nonfinite']} are not finite (NaN or inf) in this "
            "cell: their metrics are null"
        )
    record["seconds"] = round(time.perf_counter() - started, 4)
    return record


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


def backwards(exp: Experiment) -> int:
    """The backward passes a run makes: one per batch of an attribution cell (integrated
    gradients: one per step besides)."""
    import math

    total = 0
    for cell in exp.cells:
        attribute = exp.doc["interventions"][cell.intervention].get("attribute")
        if cell.refused is None and attribute is not None:
            per = 1 + (int(attribute.get("steps", 16)) if attribute.get("method") == "ig" else 0)
            total += math.ceil(len(exp.rows.rows) / exp.batch_size) * per
    return total


def forwards(exp: Experiment) -> int:
    """The forwards a run makes: the clean runs (bases, sources); per cell one per
    batch (a patch runs base and source rows in one), one more per batch where a zero
    or mean write reads the place's clean tensor, and once per mean the rows' values.
    No backwards."""
    import math

    n = len(exp.rows.rows)
    total = math.ceil(n / exp.batch_size)
    if all("source" in r for r in exp.rows.rows):
        total *= 2
    means: set[Any] = set()
    total += grid_forwards(exp)
    done = exp.cache.get("done", set())
    for cell in exp.cells:
        if cell.refused is not None or cell.key in done or gridded(exp, cell):
            continue
        writes = exp.writes_of(cell.intervention)
        attribute = exp.doc["interventions"][cell.intervention].get("attribute")
        if attribute is not None:
            per = 1 + (int(attribute.get("steps", 16)) if attribute.get("method") == "ig" else 0)
            total += math.ceil(n / exp.batch_size) * per
            continue
        if _patching(exp, cell):
            total += math.ceil(n / exp.batch_size)
            continue
        role = exp.doc["interventions"][cell.intervention].get("input", "base")
        texts = texts_of(exp.rows, role)
        addresses = [a for v in cell.addresses.values() for a in v]
        batches = math.ceil(n / _batch(exp, addresses, texts))
        slots = {int(w.get("source", 0)) for w in writes if w["value"] == "source"}
        total += batches * ((2 if writes else 1) + len(slots))
        for w in writes:
            if w["value"] == "mean":
                means.update((a, role) for a in cell.addresses[w["site"]])
    for address, role in means:
        total += math.ceil(n / _batch(exp, [address], texts_of(exp.rows, role)))
    return total


__all__ = [
    "attribution_label",
    "backwards",
    "cell_logits",
    "clean_logits",
    "forwards",
    "measure",
    "run_cell",
    "run_cells",
]
