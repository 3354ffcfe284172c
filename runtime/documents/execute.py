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
from .experiment import Cell, Experiment, _texts
from .metrics import per_row


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def _logits_at(model: Any) -> Any:
    from causalab_mini.locator import locate

    return locate(model, "logits", position={"index": -1})


def clean_logits(exp: Experiment, role: str, slot: int = 0) -> Any:
    """The unpatched logits at each row's last content token of the ``role`` texts."""
    import torch

    from causalab_mini.plan import Plan

    at = _logits_at(exp.model)
    texts = _texts(exp.rows, role, slot)
    parts = []
    for part in _chunks(len(texts), exp.batch_size):
        out = Plan.of(reads=[at]).run(exp.model, texts[part], frame=exp.frame, engine=exp.engine)
        parts.append(out[at][:, 0])
    return torch.cat(parts)


def _patch_cell(exp: Experiment, cell: Cell, texts: list[str], part: slice) -> Any:
    from causalab_mini.interchange import Patch, interchange

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
    from causalab_mini.plan import Plan

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
        texts = _texts(exp.rows, role)
        size = _batch(exp, [address], texts)
        parts = []
        for part in _chunks(len(texts), size):
            held = _read(exp, [address], texts[part])[address]
            parts.append(held.reshape(-1, *held.shape[2:]))
        exp.cache[key] = torch.cat(parts).mean(0)
    return exp.cache[key]


def _write_values(
    exp: Experiment, cell: Cell, texts: list[str], role: str
) -> list[tuple[Any, Any]]:
    """(address, value) of each zero or mean write, made like the place's clean tensor
    on these rows (the mean: over every row and named token, the same at each)."""
    wanted = [
        (address, w["value"])
        for w in exp.writes_of(cell.intervention)
        for address in cell.addresses[w["site"]]
    ]
    if not wanted:
        return []
    clean = _read(exp, [a for a, _ in wanted], texts)
    out = []
    for address, value in wanted:
        held = clean[address]
        if value == "zero":
            out.append((address, held.new_zeros(held.shape)))
        else:
            mean = _mean(exp, address, role).to(held.dtype)
            out.append((address, mean.expand_as(held).clone()))
    return out


def _batch(exp: Experiment, addresses: list[Any], texts: list[str]) -> int:
    """The batch size a plan at ``addresses`` runs these texts in: one row at a time
    where a position names a different number of tokens in different rows (they do not
    stack into one tensor), else the document's."""
    from causalab_mini.positions import encode, resolve

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


def _plan_cell(exp: Experiment, cell: Cell, texts: list[str], role: str) -> Any:
    """The logits of one batch with the cell's zero/mean writes, read at the last token
    (or through the lens at the readout site)."""
    from causalab_mini.plan import Plan

    item = exp.doc["interventions"][cell.intervention]
    readout = item.get("readout", "logits")
    if readout == "logits":
        at = _logits_at(exp.model)
    else:
        site = exp.doc["reads"][readout]["site"]
        (at,) = cell.addresses[site][:1]
    writes = _write_values(exp, cell, texts, role)
    out = Plan.of(reads=[at], writes=writes).run(
        exp.model, texts, frame=exp.frame, engine=exp.engine
    )
    value = out[at][:, -1]
    if readout == "logits":
        return value
    import torch

    with torch.no_grad():
        return exp.model.lens(value)


def cell_logits(exp: Experiment, cell: Cell) -> Any:
    """The logits the cell's metrics read, (rows, vocab), over every batch of rows."""
    import torch

    item = exp.doc["interventions"][cell.intervention]
    role = item.get("input", "base")
    texts = _texts(exp.rows, role)
    patching = any(w["value"] == "source" for w in exp.writes_of(cell.intervention))
    size = exp.batch_size
    if not patching:
        size = _batch(exp, [a for v in cell.addresses.values() for a in v], texts)
    parts = []
    for part in _chunks(len(texts), size):
        if patching:
            parts.append(_patch_cell(exp, cell, texts[part], part))
        else:
            parts.append(_plan_cell(exp, cell, texts[part], role))
    return torch.cat(parts)


def measure(exp: Experiment, logits: Any, references: dict[str, Any]) -> dict[str, Any]:
    """Each metric of ``logits``: its mean over the rows, and per row."""
    import torch

    tokens = {k: torch.tensor(v) for k, v in exp.tokens.items()}
    means: dict[str, float] = {}
    rows: dict[str, list[float]] = {}
    for metric in exp.metrics:
        values = per_row(metric, logits, tokens, references.get(metric.against))
        means[metric.label] = float(values.mean())
        rows[metric.label] = [float(v) for v in values]
    return {"metrics": means, "per_row": rows}


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
        with torch.no_grad():
            logits = cell_logits(exp, cell)
    except CausalabError as exc:  # a place the engine or the model refuses at run time
        return {**record, "status": "refused", "reason": str(exc)}
    record.update(measure(exp, logits, references))
    record["status"] = "ok"
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
    records = []
    for cell in exp.cells:
        if cell.key in done:
            records.append(done[cell.key])
            continue
        record = run_cell(exp, cell, references)
        on_cell(record)
        records.append(record)
    return clean, records


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
    for cell in exp.cells:
        if cell.refused is not None:
            continue
        writes = exp.writes_of(cell.intervention)
        if any(w["value"] == "source" for w in writes):
            total += math.ceil(n / exp.batch_size)
            continue
        role = exp.doc["interventions"][cell.intervention].get("input", "base")
        texts = _texts(exp.rows, role)
        addresses = [a for v in cell.addresses.values() for a in v]
        batches = math.ceil(n / _batch(exp, addresses, texts))
        total += batches * (2 if writes else 1)
        for w in writes:
            if w["value"] == "mean":
                means.update((a, role) for a in cell.addresses[w["site"]])
    for address, role in means:
        total += math.ceil(n / _batch(exp, [address], _texts(exp.rows, role)))
    return total


__all__ = ["cell_logits", "clean_logits", "forwards", "measure", "run_cell", "run_cells"]
