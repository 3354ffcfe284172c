"""``run``: a document checked, bound to its model, and run into ``--out``, cell by
cell; nothing is written before every check has passed."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .cells import backwards, forwards, run_cells
from .execute import attribution_label
from .experiment import Experiment, build
from .fitting import fits
from .generating import UNCHANGED
from .output import append_cell, check_out, finish, receipt, start
from .source import Source


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def labels(exp: Experiment) -> list[str]:
    """The columns of the results: each metric's, then each attribution's."""
    found = [m.label for m in exp.metrics]
    for item in exp.doc["interventions"].values():
        if "attribute" in item and attribution_label(item, exp) not in found:
            found.append(attribution_label(item, exp))
        if "generate" in item and UNCHANGED not in found:
            found.append(UNCHANGED)
    return found


def save_featurizers(exp: Experiment, target: Path) -> list[Path]:
    """Each trained cell's featurizers, and each fitted one, as safetensors under
    ``featurizers/`` (with the place they were fitted at)."""
    written = []
    folder = target / "featurizers"
    for key, value in list(exp.cache.items()):
        if isinstance(key, tuple) and key[0] == "trained":
            for i, address in enumerate(value):
                written.append(folder / f"{_safe(key[1])}_{i}.safetensors")
                folder.mkdir(parents=True, exist_ok=True)
                address.featurizer.save(str(written[-1]), address, exp.model)
    for (name, component, layer, head), (f, _) in exp.cache.get("fitted", {}).items():
        where = f"{name}_{component}_{layer}" + ("" if head is None else f"_{head}")
        written.append(folder / f"{where}.safetensors")
        folder.mkdir(parents=True, exist_ok=True)
        f.save(str(written[-1]))
    return written


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "_-=" else "_" for c in text).strip("_")


def prepare(
    source: Source,
    out: Path,
    *,
    resume: bool = False,
    model: Any = None,
    spec: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[Experiment, Path, dict[str, Any], float]:
    """Every check, before anything is written: the document, the output folder, the
    model's layers, heads, positions and tokens. Returns the experiment, the folder,
    the cells an earlier run finished (with ``resume``) and the load time."""
    from .output import target_folder
    from .source import DocumentError
    from .validate import static_issues

    issues, _ = static_issues(source)
    if issues:
        raise DocumentError(issues)
    target_folder(source, out)  # a save path leaving --out (a link): before the load
    started = time.perf_counter()
    exp = build(source, model=model, spec=spec, trust_remote_code=trust_remote_code)
    loaded = time.perf_counter() - started
    target, done = check_out(source, out, resume)
    keys = {c.key for c in exp.cells}
    return exp, target, {k: v for k, v in done.items() if k in keys}, loaded


def run(
    source: Source,
    out: Path,
    *,
    resume: bool = False,
    model: Any = None,
    spec: str | None = None,
    trust_remote_code: bool = False,
    on_start: Callable[[int, int], None] = lambda total, done: None,
    on_cell: Callable[[dict[str, Any]], None] = lambda record: None,
) -> dict[str, Any]:
    """Run the document into ``out``; returns the results (as ``results.json`` holds
    them). ``on_start(cells, already done)`` and ``on_cell(record)`` report progress."""
    import torch

    began = _now()
    exp, target, done, loaded = prepare(
        source, out, resume=resume, model=model, spec=spec, trust_remote_code=trust_remote_code
    )
    start(source, target, done)
    on_start(len(exp.cells), len(done))
    torch.manual_seed(int(exp.doc.get("seed", 0)))
    started = time.perf_counter()

    def record(cell: dict[str, Any]) -> None:
        append_cell(target, cell)
        on_cell(cell)

    clean, records = run_cells(exp, done, record)
    timings = {
        "started": began,
        "finished": _now(),
        "load_seconds": round(loaded, 3),
        "run_seconds": round(time.perf_counter() - started, 3),
        "cells_resumed": len(done),
    }
    results = {
        "document": 1,
        "name": exp.doc["name"],
        "digest": source.digest,
        "checkpoint": exp.checkpoint,
        "metrics": labels(exp),
        "clean": clean,
        "cells": records,
        "forwards": forwards(exp),
        "backwards": backwards(exp),
    }
    if exp.cache.get("fitted"):
        results["fits"] = fits(exp)
    save = exp.doc.get("save") or {}
    flags = {
        "resume": resume,
        "trust_remote_code": trust_remote_code,
        "model_override": spec is not None,
    }
    written = finish(
        target,
        results,
        receipt(exp, timings, flags),
        results["metrics"],
        bool(save.get("plots", True)),
        bool(save.get("per_row", False)),
    )
    if save.get("featurizers"):
        written += save_featurizers(exp, target)
    results["written"] = [str(p) for p in written]
    return results


__all__ = ["prepare", "run"]
